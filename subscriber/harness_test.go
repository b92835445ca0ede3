package subscriber

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mooncake-conductor-go/conductor/events"
	"github.com/mooncake-conductor-go/conductor/hashcheck"
	"github.com/mooncake-conductor-go/conductor/hashing"
	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/source"
	zmq "github.com/pebbe/zmq4"
	"github.com/rs/zerolog"
	"github.com/vmihailenco/msgpack/v5"
)

const fixtureDir = "../testdata/events"

// ---- fixtures -------------------------------------------------------------

type fxRegistration struct {
	Endpoint       string `json:"endpoint"`
	ReplayEndpoint string `json:"replay_endpoint"`
	Type           string `json:"type"`
	Modelname      string `json:"modelname"`
	LoraName       string `json:"lora_name"`
	InstanceID     string `json:"instance_id"`
	BlockSize      int    `json:"block_size"`
	DPRank         int    `json:"dp_rank"`
	HashProfile    struct {
		Strategy        string  `json:"strategy"`
		Algorithm       string  `json:"algorithm"`
		PythonHashSeed  *string `json:"python_hash_seed"`
		IndexProjection string  `json:"index_projection"`
	} `json:"hash_profile"`
}

type fxEffect struct {
	Op        string   `json:"op"`
	Tier      string   `json:"tier"`
	Tiers     []string `json:"tiers"`
	Owner     string   `json:"owner"`
	Prefixes  []string `json:"prefixes"`
	BackendID string   `json:"backend_id"`
	TenantID  string   `json:"tenant_id"`
}

type fxExpect struct {
	Envelope    string     `json:"envelope"`
	Batch       string     `json:"batch"`
	SourceState string     `json:"source_state"`
	SeqAdvances *bool      `json:"seq_advances"`
	Effects     []fxEffect `json:"effects"`
	Events      []string   `json:"events"`
	Message     string     `json:"message"`
	Role        string     `json:"role"`
}

type fxFixture struct {
	ID             string   `json:"id"`
	SourceType     string   `json:"source_type"`
	Registration   string   `json:"registration"`
	AlsoRegistered []string `json:"also_registered"`
	Requires       []string `json:"requires"`
	TopicHex       string   `json:"topic_hex"`
	PayloadFile    string   `json:"payload_file"`
	FramesFile     string   `json:"frames_file"`
	Expect         fxExpect `json:"expect"`
}

type fxManifest struct {
	Registrations map[string]fxRegistration `json:"registrations"`
	Fixtures      []fxFixture               `json:"fixtures"`
	byID          map[string]*fxFixture
}

var (
	manifestOnce sync.Once
	manifestVal  *fxManifest
	manifestErr  error
)

func loadManifest(t testing.TB) *fxManifest {
	t.Helper()
	manifestOnce.Do(func() {
		b, err := os.ReadFile(filepath.Join(fixtureDir, "manifest.json"))
		if err != nil {
			manifestErr = err
			return
		}
		m := &fxManifest{}
		if err := json.Unmarshal(b, m); err != nil {
			manifestErr = err
			return
		}
		m.byID = map[string]*fxFixture{}
		for i := range m.Fixtures {
			m.byID[m.Fixtures[i].ID] = &m.Fixtures[i]
		}
		manifestVal = m
	})
	if manifestErr != nil {
		t.Fatalf("load manifest: %v", manifestErr)
	}
	return manifestVal
}

func (m *fxManifest) fixture(t testing.TB, id string) *fxFixture {
	t.Helper()
	f, ok := m.byID[id]
	if !ok {
		t.Fatalf("no fixture %q", id)
	}
	return f
}

func payloadOf(t testing.TB, f *fxFixture) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(fixtureDir, f.PayloadFile))
	if err != nil {
		t.Fatalf("read payload of %s: %v", f.ID, err)
	}
	return b
}

func framesOf(t testing.TB, f *fxFixture) [][]byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(fixtureDir, f.FramesFile))
	if err != nil {
		t.Fatalf("read frames of %s: %v", f.ID, err)
	}
	var frames [][]byte
	if err := msgpack.Unmarshal(b, &frames); err != nil {
		t.Fatalf("decode frames of %s: %v", f.ID, err)
	}
	return frames
}

func parseU64(t testing.TB, s string) uint64 {
	t.Helper()
	v, ok := new(big.Int).SetString(s, 10)
	if !ok || !v.IsUint64() {
		t.Fatalf("bad uint64 %q", s)
	}
	return v.Uint64()
}

func resolveProfile(t testing.TB, r fxRegistration) hashing.Profile {
	t.Helper()
	p, err := hashing.Resolve(hashing.Spec{
		Strategy:        r.HashProfile.Strategy,
		Algorithm:       r.HashProfile.Algorithm,
		IndexProjection: r.HashProfile.IndexProjection,
		PythonHashSeed:  r.HashProfile.PythonHashSeed,
	})
	if err != nil {
		t.Fatalf("resolve profile: %v", err)
	}
	return p
}

func contextOf(r fxRegistration) index.ContextKey {
	return index.ContextKey{Tenant: "default", Model: r.Modelname, Lora: r.LoraName, BlockSize: r.BlockSize}
}

var tierNames = map[string]index.Tier{"device": index.Device, "cpu_local": index.CPULocal, "cpu_share": index.CPUShare, "disk": index.Disk}

// ---- recording sinks ------------------------------------------------------

type op struct {
	Kind  string // store, remove, clear, acquire, release
	Owner index.OwnerID
	Tier  index.Tier
	Key   uint64
	Mask  index.TierMask
}

func (o op) String() string {
	if o.Kind == "clear" {
		return fmt.Sprintf("clear(owner %d, mask %03b)", o.Owner, o.Mask)
	}
	return fmt.Sprintf("%s(owner %d, tier %d, %d)", o.Kind, o.Owner, o.Tier, o.Key)
}

// recorder is an EngineSink and SharedSink that logs every call.
type recorder struct {
	mu  sync.Mutex
	ops []op
}

func (r *recorder) add(o op) {
	r.mu.Lock()
	r.ops = append(r.ops, o)
	r.mu.Unlock()
}
func (r *recorder) Store(id index.OwnerID, t index.Tier, k uint64) {
	r.add(op{Kind: "store", Owner: id, Tier: t, Key: k})
}
func (r *recorder) Remove(id index.OwnerID, t index.Tier, k uint64) {
	r.add(op{Kind: "remove", Owner: id, Tier: t, Key: k})
}
func (r *recorder) ClearOwner(id index.OwnerID, m index.TierMask) {
	r.add(op{Kind: "clear", Owner: id, Mask: m})
}
func (r *recorder) AcquireShared(t index.Tier, k uint64) { r.add(op{Kind: "acquire", Tier: t, Key: k}) }
func (r *recorder) ReleaseShared(t index.Tier, k uint64) { r.add(op{Kind: "release", Tier: t, Key: k}) }

func (r *recorder) take() []op {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.ops
	r.ops = nil
	return out
}

func (r *recorder) snapshot() []op {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ops)
}

// sharedBalance returns acquires minus releases per (tier, key).
func sharedBalance(ops []op) map[[2]uint64]int {
	m := map[[2]uint64]int{}
	for _, o := range ops {
		k := [2]uint64{uint64(o.Tier), o.Key}
		switch o.Kind {
		case "acquire":
			m[k]++
		case "release":
			m[k]--
		}
		if m[k] == 0 {
			delete(m, k)
		}
	}
	return m
}

// ---- configs --------------------------------------------------------------

const testOwner index.OwnerID = 7

// env is one subscription under test: its config and recording sinks.
type env struct {
	cfg      Config
	engine   *recorder
	shared   *recorder // the table bound by also_registered engines
	mu       sync.Mutex
	outcomes map[uint64][]events.Outcome
	applied  []uint64
	counters *Counters
	check    *hashcheck.Checker // engine registrations: the service's hash checker
}

func (e *env) outcomesOf(seq uint64) []events.Outcome {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.outcomes[seq])
}

func (e *env) appliedOrder() []uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.applied)
}

func testLogger(t testing.TB) zerolog.Logger {
	if testing.Verbose() {
		return zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.DebugLevel)
	}
	return zerolog.Nop()
}

// newEnv builds the Config of a manifest registration with recording sinks.
// Mooncake registrations get a lookup that knows the contexts of also.
func newEnv(t testing.TB, m *fxManifest, regName string, also []string, endpoint, replayEndpoint string) *env {
	t.Helper()
	reg, ok := m.Registrations[regName]
	if !ok {
		t.Fatalf("no registration %q", regName)
	}
	e := &env{engine: &recorder{}, shared: &recorder{}, outcomes: map[uint64][]events.Outcome{}, counters: NewCounters()}
	prof := resolveProfile(t, reg)
	tables := map[index.ContextKey]*hashing.Profile{}
	for _, a := range also {
		ar := m.Registrations[a]
		p := resolveProfile(t, ar)
		tables[contextOf(ar)] = &p
	}
	typ, ok := source.Parse(reg.Type)
	if !ok {
		t.Fatalf("registration type %q", reg.Type)
	}
	e.cfg = Config{
		Key:            reg.InstanceID + "|default|" + fmt.Sprint(reg.DPRank),
		Type:           typ,
		Endpoint:       endpoint,
		ReplayEndpoint: replayEndpoint,
		DPRank:         reg.DPRank,
		Context:        contextOf(reg),
		Profile:        prof,
		Owner:          testOwner,
		Logger:         testLogger(t),
		Counters:       e.counters,
		onEvent: func(seq uint64, o events.Outcome) {
			e.mu.Lock()
			e.outcomes[seq] = append(e.outcomes[seq], o)
			e.mu.Unlock()
		},
		onApply: func(seq uint64) {
			e.mu.Lock()
			e.applied = append(e.applied, seq)
			e.mu.Unlock()
		},
	}
	if reg.Type == "Mooncake" {
		e.cfg.Lookup = func(ctx index.ContextKey) (events.SharedSink, *hashing.Profile, bool) {
			p, ok := tables[ctx]
			if !ok {
				return nil, nil, false
			}
			return e.shared, p, true
		}
	} else {
		e.cfg.Engine = e.engine
		e.check = hashcheck.NewSet(hashcheck.Options{Logger: testLogger(t)}).Add(e.cfg.Key, &prof, reg.BlockSize, reg.LoraName)
		e.cfg.HashCheck = e.check
	}
	return e
}

// expectedOps translates fixture effects into the sink calls they imply.
// prior are the ops recorded before the fixture (for clear_shared, which
// releases every binding the requires created).
func expectedOps(t testing.TB, f *fxFixture, prior []op) []op {
	t.Helper()
	var out []op
	for _, ef := range f.Expect.Effects {
		switch ef.Op {
		case "store", "remove":
			tier, ok := tierNames[ef.Tier]
			if !ok {
				t.Fatalf("%s: unknown tier %q", f.ID, ef.Tier)
			}
			kind := ef.Op
			owner := testOwner
			if strings.HasPrefix(ef.Owner, "shared ") {
				kind = map[string]string{"store": "acquire", "remove": "release"}[ef.Op]
				owner = 0
			}
			for _, p := range ef.Prefixes {
				out = append(out, op{Kind: kind, Owner: owner, Tier: tier, Key: parseU64(t, p)})
			}
		case "clear":
			var m index.TierMask
			for _, tn := range ef.Tiers {
				m |= 1 << tierNames[tn]
			}
			out = append(out, op{Kind: "clear", Owner: testOwner, Mask: m})
		case "clear_shared":
			bal := sharedBalance(prior)
			for k, n := range bal {
				for range n {
					out = append(out, op{Kind: "release", Tier: index.Tier(k[0]), Key: k[1]})
				}
			}
		default:
			t.Fatalf("%s: unknown effect %q", f.ID, ef.Op)
		}
	}
	return out
}

func sortOps(ops []op) []op {
	ops = slices.Clone(ops)
	slices.SortFunc(ops, func(a, b op) int {
		return strings.Compare(a.String(), b.String())
	})
	return ops
}

func resultOf(s string) events.Result {
	switch {
	case strings.HasPrefix(s, "applied"):
		return events.Applied
	case strings.HasPrefix(s, "ignored"):
		return events.Ignored
	case strings.HasPrefix(s, "rejected"):
		return events.Rejected
	case strings.HasPrefix(s, "no-op"):
		return events.NoOp
	}
	panic("unknown event expectation " + s)
}

// ---- ZMQ publisher side -----------------------------------------------------

// publisher is an in-process XPUB standing in for an engine or master. XPUB
// reports subscriptions, which lets tests wait for the subscriber instead of
// sleeping through ZMQ's slow-joiner window.
type publisher struct {
	t          testing.TB
	sock       *zmq.Socket
	endpoint   string
	subscribed bool
}

func newPublisher(t testing.TB, endpoint string) *publisher {
	t.Helper()
	s, err := zmq.NewSocket(zmq.XPUB)
	if err != nil {
		t.Fatalf("create XPUB: %v", err)
	}
	_ = s.SetLinger(0)
	_ = s.SetSndhwm(0)
	if err := s.Bind(endpoint); err != nil {
		t.Fatalf("bind XPUB %s: %v", endpoint, err)
	}
	ep, _ := s.GetLastEndpoint()
	p := &publisher{t: t, sock: s, endpoint: ep}
	t.Cleanup(func() {
		p.waitUnsubscribed()
		_ = s.Close()
	})
	return p
}

// waitUnsubscribed waits (bounded) until the subscriber's disconnect has been
// processed before the XPUB is closed. Closing a socket while its session is
// still handling the peer's disconnect in the middle of a multipart message
// trips a libzmq 4.3 assertion (zeromq/libzmq#3442, session_base.cpp
// clean_pipes) and aborts the test binary; only test publishers, which
// stream large backlogs and close right after the subscriber, can hit it.
func (p *publisher) waitUnsubscribed() {
	if !p.subscribed {
		return
	}
	poller := zmq.NewPoller()
	poller.Add(p.sock, zmq.POLLIN)
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		polled, err := poller.Poll(time.Until(deadline))
		if err != nil || len(polled) == 0 {
			return
		}
		b, err := p.sock.RecvBytes(0)
		if err != nil {
			return
		}
		if len(b) > 0 && b[0] == 0 {
			return
		}
	}
}

// waitSubscribed blocks until a subscriber's subscription arrives.
func (p *publisher) waitSubscribed() {
	p.t.Helper()
	poller := zmq.NewPoller()
	poller.Add(p.sock, zmq.POLLIN)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		polled, err := poller.Poll(time.Until(deadline))
		if err != nil {
			if zmq.AsErrno(err) == zmq.Errno(syscall.EINTR) {
				continue
			}
			p.t.Fatalf("poll XPUB: %v", err)
		}
		if len(polled) == 0 {
			break
		}
		b, err := p.sock.RecvBytes(0)
		if err != nil {
			p.t.Fatalf("recv subscription: %v", err)
		}
		if len(b) > 0 && b[0] == 1 {
			p.subscribed = true
			return
		}
	}
	p.t.Fatalf("no subscriber on %s", p.endpoint)
}

func seqFrame(seq uint64) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, seq)
	return b
}

func (p *publisher) sendFrames(frames ...[]byte) {
	p.t.Helper()
	for i, f := range frames {
		flag := zmq.SNDMORE
		if i == len(frames)-1 {
			flag = 0
		}
		if _, err := p.sock.SendBytes(f, flag); err != nil {
			p.t.Fatalf("send frame %d: %v", i, err)
		}
	}
}

func (p *publisher) send(seq uint64, payload []byte) {
	p.t.Helper()
	p.sendFrames([]byte("kv-events"), seqFrame(seq), payload)
}

// replayServer is an in-process ROUTER standing in for a replay endpoint.
type replayServer struct {
	t        testing.TB
	sock     *zmq.Socket
	endpoint string
}

func newReplayServer(t testing.TB, endpoint string) *replayServer {
	t.Helper()
	s, err := zmq.NewSocket(zmq.ROUTER)
	if err != nil {
		t.Fatalf("create ROUTER: %v", err)
	}
	_ = s.SetLinger(0)
	if err := s.Bind(endpoint); err != nil {
		t.Fatalf("bind ROUTER %s: %v", endpoint, err)
	}
	ep, _ := s.GetLastEndpoint()
	r := &replayServer{t: t, sock: s, endpoint: ep}
	t.Cleanup(func() { _ = s.Close() })
	return r
}

// request waits for one replay request and returns the requester identity
// and the frames after it.
func (r *replayServer) request(timeout time.Duration) (identity []byte, frames [][]byte) {
	r.t.Helper()
	poller := zmq.NewPoller()
	poller.Add(r.sock, zmq.POLLIN)
	polled, err := poller.Poll(timeout)
	if err != nil || len(polled) == 0 {
		r.t.Fatalf("no replay request within %s (err %v)", timeout, err)
	}
	msg, err := r.sock.RecvMessageBytes(0)
	if err != nil {
		r.t.Fatalf("recv replay request: %v", err)
	}
	return msg[0], msg[1:]
}

func (r *replayServer) reply(identity []byte, frames ...[]byte) {
	r.t.Helper()
	all := append([][]byte{identity}, frames...)
	for i, f := range all {
		flag := zmq.SNDMORE
		if i == len(all)-1 {
			flag = 0
		}
		if _, err := r.sock.SendBytes(f, flag); err != nil {
			r.t.Fatalf("send replay frame: %v", err)
		}
	}
}

// ---- helpers ----------------------------------------------------------------

// ipcEndpoint returns an ipc endpoint under t.TempDir(), or under a shorter
// temporary directory when that path would exceed the ~107-byte limit of a
// Unix socket path.
func ipcEndpoint(t testing.TB, name string) string {
	dir := t.TempDir()
	if len(dir)+len(name) > 100 {
		var err error
		if dir, err = os.MkdirTemp("", "sub"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.RemoveAll(dir) })
	}
	return "ipc://" + filepath.Join(dir, name)
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func waitSeq(t testing.TB, s *Subscriber, seq uint64) {
	t.Helper()
	waitFor(t, fmt.Sprintf("seq %d applied", seq), 10*time.Second, func() bool {
		got, ok := s.LastSeq()
		return ok && got >= seq
	})
}

// emptyBatch is a valid batch with no events for the source type.
func emptyBatch(typ string) []byte {
	var ts any = 1789095808.5
	if typ == "Mooncake" {
		ts = uint64(1789095808500)
	}
	b, err := msgpack.Marshal([]any{ts, []any{}, 0})
	if err != nil {
		panic(err)
	}
	return b
}

// mustStart starts a subscriber or fails the test; the caller stops it.
func mustStart(t testing.TB, cfg Config) *Subscriber {
	t.Helper()
	s, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
