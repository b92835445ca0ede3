package subscriber

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/events"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/hashing/hashcheck"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
	zmq "github.com/pebbe/zmq4"
	"github.com/vmihailenco/msgpack/v5"
)

// ---- configs --------------------------------------------------------------

// env is one subscription under test: its config and recording sinks.
type env struct {
	cfg      Config
	engine   *eventtest.Recorder
	shared   *eventtest.Recorder // the table bound by also_registered engines
	mu       sync.Mutex
	outcomes map[uint64][]events.Outcome
	applied  []uint64
	epoch    int // where the current epoch starts in applied
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

// epochOrder is appliedOrder since the last publisher restart detected.
func (e *env) epochOrder() []uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.applied[e.epoch:])
}

// newEnv builds the Config of a manifest registration with recording sinks.
// Mooncake registrations get a lookup that knows the contexts of also.
func newEnv(t testing.TB, m *eventtest.Manifest, regName string, also []string, endpoint, replayEndpoint string) *env {
	t.Helper()
	reg := m.Registration(t, regName)
	e := &env{engine: &eventtest.Recorder{}, shared: &eventtest.Recorder{}, outcomes: map[uint64][]events.Outcome{}, counters: NewCounters()}
	prof := eventtest.ResolveProfile(t, reg)
	tables := m.Profiles(t, also)
	typ, ok := sourcetype.Parse(reg.Type)
	if !ok {
		t.Fatalf("registration type %q", reg.Type)
	}
	e.cfg = Config{
		Source:    SourceConfig{Key: reg.InstanceID + "|default|" + fmt.Sprint(reg.DPRank), Type: typ, Endpoint: endpoint, ReplayEndpoint: replayEndpoint, DPRank: reg.DPRank},
		Index:     IndexConfig{Context: eventtest.ContextOf(reg), Profile: prof, Owner: eventtest.Owner},
		Report:    ReportConfig{Logger: eventtest.Logger(t)},
		Resources: NewResources(ResourcesOptions{Counters: e.counters}),
		test: testHooks{onEvent: func(seq uint64, o events.Outcome) {
			e.mu.Lock()
			e.outcomes[seq] = append(e.outcomes[seq], o)
			e.mu.Unlock()
		}, onApply: func(seq uint64) {
			e.mu.Lock()
			e.applied = append(e.applied, seq)
			e.mu.Unlock()
		}, onEpoch: func() {
			e.mu.Lock()
			e.epoch = len(e.applied)
			e.mu.Unlock()
		}},
	}
	if reg.Type == "Mooncake" {
		e.cfg.Index.Lookup = func(ctx index.ContextKey) (events.SharedSink, *hashing.Profile, bool) {
			p, ok := tables[ctx]
			if !ok {
				return nil, nil, false
			}
			return e.shared, p, true
		}
	} else {
		e.cfg.Index.Engine = e.engine
		e.check = hashcheck.NewSet(hashcheck.Options{Logger: eventtest.Logger(t)}).Add(e.cfg.Source.Key, &prof, reg.BlockSize, reg.LoraName)
		e.cfg.Verify.HashCheck = e.check
	}
	return e
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
	if err := bindWhenFree(s, endpoint); err != nil {
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

// bindWhenFree binds s to endpoint, waiting (up to 10 s) for a socket that
// was just closed there to let it go: libzmq closes listeners in its I/O
// thread, after zmq_close returned. A publisher restarted in place rebinds
// its predecessor's endpoint.
func bindWhenFree(s *zmq.Socket, endpoint string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := s.Bind(endpoint)
		if err == nil || zmq.AsErrno(err) != zmq.Errno(syscall.EADDRINUSE) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(time.Millisecond) // polling for the I/O thread; nothing else to wait on
	}
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

func waitSeq(t testing.TB, s *Subscriber, seq uint64) {
	t.Helper()
	eventtest.WaitFor(t, fmt.Sprintf("seq %d applied", seq), 10*time.Second, func() bool {
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
