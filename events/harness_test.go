package events

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/mooncake-conductor-go/conductor/hashcheck"
	"github.com/mooncake-conductor-go/conductor/hashing"
	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/source"
	"github.com/rs/zerolog"
	"github.com/vmihailenco/msgpack/v5"
)

// The decoders are tested here without sockets: a tester feeds payloads to
// a Decoder the way the subscriber does (decode, check the batch dp_rank,
// apply) and records every sink call and outcome.

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

// ---- tester ----------------------------------------------------------------

const testOwner index.OwnerID = 7

// tester is one decoder under test with recording sinks.
type tester struct {
	reg      fxRegistration
	dec      Decoder
	engine   *recorder
	shared   *recorder // the table bound by also_registered engines
	seq      uint64    // the batch being applied
	outcomes map[uint64][]Outcome
	// envRejected and batchRejected count envelopes the decoder rejected
	// and engine batches whose dp_rank is not the registration's.
	envRejected, batchRejected int
	lastEnvReason              Reason
	// check is an engine registration's hash checker, which checks every
	// block; checkLog holds its warnings.
	check    *hashcheck.Checker
	checkLog *bytes.Buffer
}

func testLogger(t testing.TB) zerolog.Logger {
	if testing.Verbose() {
		return zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.DebugLevel)
	}
	return zerolog.Nop()
}

// newTester builds the decoder of a manifest registration with recording
// sinks. Mooncake registrations get a lookup that knows the contexts of
// also.
func newTester(t testing.TB, m *fxManifest, regName string, also ...string) *tester {
	t.Helper()
	reg, ok := m.Registrations[regName]
	if !ok {
		t.Fatalf("no registration %q", regName)
	}
	x := &tester{reg: reg, engine: &recorder{}, shared: &recorder{}, outcomes: map[uint64][]Outcome{}}
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
	cfg := Config{Type: typ, Profile: resolveProfile(t, reg), Context: contextOf(reg), Owner: testOwner, Logger: testLogger(t)}
	if typ == source.Mooncake {
		cfg.Lookup = func(ctx index.ContextKey) (SharedSink, *hashing.Profile, bool) {
			p, ok := tables[ctx]
			if !ok {
				return nil, nil, false
			}
			return x.shared, p, true
		}
	} else {
		cfg.Engine = x.engine
		x.checkLog = &bytes.Buffer{}
		set := hashcheck.NewSet(hashcheck.Options{Warmup: 1 << 30, Logger: zerolog.New(x.checkLog)})
		x.check = set.Add(reg.InstanceID, &cfg.Profile, reg.BlockSize, reg.LoraName)
		cfg.Check = x.check
	}
	dec, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	x.dec = dec
	return x
}

// applyBatch decodes and applies one payload as the subscriber does.
func (x *tester) applyBatch(seq uint64, payload []byte) {
	if rej := x.dec.Decode(payload); rej != ReasonNone {
		x.envRejected++
		x.lastEnvReason = rej
		return
	}
	if dp, ok := x.dec.DPRank(); ok && x.reg.Type != "Mooncake" && dp != uint64(x.reg.DPRank) {
		x.batchRejected++
		return
	}
	x.seq = seq
	x.dec.Apply(x)
	x.dec.Forget()
}

func (x *tester) Report(i int, res Result, why Reason) {
	x.outcomes[x.seq] = append(x.outcomes[x.seq], Outcome{Index: i, Result: res, Reason: why})
}

func (x *tester) retract() { x.dec.Retract() }

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

func resultOf(s string) Result {
	switch {
	case strings.HasPrefix(s, "applied"):
		return Applied
	case strings.HasPrefix(s, "ignored"):
		return Ignored
	case strings.HasPrefix(s, "rejected"):
		return Rejected
	case strings.HasPrefix(s, "no-op"):
		return NoOp
	}
	panic("unknown event expectation " + s)
}
