package subscriber

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/contexts"
	"github.com/mooncake-conductor-go/conductor/internal/events"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
	zmq "github.com/pebbe/zmq4"
	"github.com/vmihailenco/msgpack/v5"
	"go.uber.org/goleak"
)

// TestMain fails the package if any test leaves a goroutine behind: every
// Subscriber must be fully gone once Stop returns.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// storedBatch encodes a vLLM BlockStored batch of the given hashes.
func storedBatch(hashes []uint64, blockSize int, dp any) []byte {
	tokens := make([]int32, len(hashes)*blockSize)
	for i := range tokens {
		tokens[i] = int32(1000 + i)
	}
	extra := make([]any, len(hashes))
	ev := map[string]any{
		"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": nil,
		"token_ids": tokens, "block_size": blockSize, "lora_id": nil, "medium": "GPU",
		"lora_name": nil, "extra_keys": extra, "group_idx": 0, "kv_cache_spec_kind": "full_attention",
	}
	b, err := msgpack.Marshal([]any{1789095808.5, []any{ev}, dp})
	if err != nil {
		panic(err)
	}
	return b
}

// replayService answers replay requests from a shared store in its own
// goroutine, like a publisher's ROUTER thread.
type replayService struct {
	endpoint string
	mu       sync.Mutex
	store    map[uint64][]byte
	hold     chan struct{} // while open, requests are received but not answered
	requests []uint64
	stop     chan struct{}
	done     chan struct{}
}

func startReplayService(t *testing.T) *replayService {
	t.Helper()
	return startReplayServiceAt(t, "tcp://127.0.0.1:*", map[uint64][]byte{})
}

// startReplayServiceAt binds a replay service to endpoint, answering from
// store (which it then owns); a restarted publisher's comes back on the
// same endpoint with a store of its own.
func startReplayServiceAt(t *testing.T, endpoint string, store map[uint64][]byte) *replayService {
	t.Helper()
	sock, err := zmq.NewSocket(zmq.ROUTER)
	if err != nil {
		t.Fatal(err)
	}
	_ = sock.SetLinger(0)
	// No send limit: a ROUTER drops what exceeds it, and a reply stream
	// that loses messages would fail the recovery for the test's sake.
	_ = sock.SetSndhwm(0)
	if err := bindWhenFree(sock, endpoint); err != nil {
		t.Fatal(err)
	}
	ep, _ := sock.GetLastEndpoint()
	rs := &replayService{endpoint: ep, store: store, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(rs.done)
		defer sock.Close()
		p := zmq.NewPoller()
		p.Add(sock, zmq.POLLIN)
		for {
			select {
			case <-rs.stop:
				return
			default:
			}
			polled, err := p.Poll(10 * time.Millisecond)
			if err != nil || len(polled) == 0 {
				continue
			}
			msg, err := sock.RecvMessageBytes(0)
			if err != nil || len(msg) != 3 {
				continue
			}
			from := binary.BigEndian.Uint64(msg[2])
			rs.mu.Lock()
			rs.requests = append(rs.requests, from)
			hold := rs.hold
			rs.mu.Unlock()
			if hold != nil {
				select {
				case <-hold:
				case <-rs.stop:
					return
				}
			}
			rs.mu.Lock()
			var seqs []uint64
			for s := range rs.store {
				if s >= from {
					seqs = append(seqs, s)
				}
			}
			slices.Sort(seqs)
			for _, s := range seqs {
				_, _ = sock.SendMessage(msg[0], "", "kv-events", seqFrame(s), rs.store[s])
			}
			rs.mu.Unlock()
			_, _ = sock.SendMessage(msg[0], "", "", seqFrame(^uint64(0)), "")
		}
	}()
	t.Cleanup(rs.close)
	return rs
}

func (rs *replayService) close() {
	select {
	case <-rs.stop:
	default:
		close(rs.stop)
	}
	<-rs.done
}

func (rs *replayService) put(seq uint64, payload []byte) {
	rs.mu.Lock()
	rs.store[seq] = payload
	rs.mu.Unlock()
}

func (rs *replayService) requestCount() int {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return len(rs.requests)
}

func vllmEnv(t *testing.T, endpoint, replayEP string) *env {
	t.Helper()
	e := newEnv(t, eventtest.LoadManifest(t), "vllm-a", nil, endpoint, replayEP)
	e.cfg.Tuning = Tuning{ReplayReceiveTimeout: time.Second, ReplayTotalTimeout: 5 * time.Second}
	return e
}

// TestGapReplayLosesNothing drops single messages and runs of messages from
// the live stream; every one must come back through replay, in order, with
// every block stored exactly once.
func TestGapReplayLosesNothing(t *testing.T) {
	rs := startReplayService(t)
	pub := newPublisher(t, "tcp://127.0.0.1:*")
	e := vllmEnv(t, pub.endpoint, rs.endpoint)
	s := mustStart(t, e.cfg)
	defer s.Stop()
	pub.waitSubscribed()
	const n = 600
	var want []uint64
	for seq := uint64(1); seq <= n; seq++ {
		key := seq * 1000003
		want = append(want, key)
		p := storedBatch([]uint64{key}, 4, 0)
		rs.put(seq, p)
		lost := seq%37 == 0 || (seq >= 200 && seq < 205) || (seq >= 400 && seq%2 == 0 && seq < 420)
		if !lost || seq == n {
			pub.send(seq, p)
		}
	}
	waitSeq(t, s, n)
	eventtest.WaitFor(t, "live", 5*time.Second, func() bool { return s.State() == Live })
	var got []uint64
	for _, o := range e.engine.Snapshot() {
		if o.Kind == "store" {
			got = append(got, o.Key)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("stored %d keys, want %d (first difference matters)", len(got), len(want))
	}
	order := e.appliedOrder()
	for i, sq := range order {
		if sq != uint64(i+1) {
			t.Fatalf("applied order broken at %d: %d", i, sq)
		}
	}
	if e.counters.Total(MetricGaps, sourcetype.VLLM) == 0 || e.counters.Value(MetricReplays, sourcetype.VLLM, events.ReplayRecovered) == 0 {
		t.Errorf("counters %v", e.counters.Snapshot())
	}
	t.Logf("gaps %d, replay requests %d", e.counters.Total(MetricGaps, sourcetype.VLLM), rs.requestCount())
}

// TestLiveBufferedDuringReplay: live messages that arrive while the replay
// is outstanding are held and applied after the replayed range; a second
// hole among them triggers another round from the new last-applied seq.
func TestLiveBufferedDuringReplay(t *testing.T) {
	rs := startReplayService(t)
	hold := make(chan struct{})
	rs.hold = hold
	pub := newPublisher(t, ipcEndpoint(t, "pub"))
	e := vllmEnv(t, pub.endpoint, rs.endpoint)
	s := mustStart(t, e.cfg)
	defer s.Stop()
	pub.waitSubscribed()
	for seq := uint64(1); seq <= 12; seq++ {
		rs.put(seq, storedBatch([]uint64{seq}, 4, 0))
	}
	pub.send(1, rs.store[1])
	pub.send(3, rs.store[3]) // gap at 2
	eventtest.WaitFor(t, "recovering", 5*time.Second, func() bool { return s.State() == Recovering })
	for _, seq := range []uint64{4, 5, 7, 8, 12} { // 6 and 9-11 lost as well
		pub.send(seq, rs.store[seq])
	}
	eventtest.WaitFor(t, "live messages drained while replay waits", 5*time.Second, func() bool {
		return e.counters.Value(MetricReceived, sourcetype.VLLM, events.ReasonNone) == 7
	})
	if got := e.appliedOrder(); !slices.Equal(got, []uint64{1}) {
		t.Fatalf("applied before replay answered: %v", got)
	}
	rs.mu.Lock()
	rs.hold = nil
	rs.mu.Unlock()
	close(hold)
	waitSeq(t, s, 12)
	eventtest.WaitFor(t, "live", 5*time.Second, func() bool { return s.State() == Live })
	want := []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	if got := e.appliedOrder(); !slices.Equal(got, want) {
		t.Errorf("applied %v", got)
	}
	if rs.requestCount() < 2 {
		t.Errorf("expected a second recovery round, got %d requests", rs.requestCount())
	}
	// the stream goes on normally afterwards
	pub.send(13, storedBatch([]uint64{13}, 4, 0))
	waitSeq(t, s, 13)
}

// TestReplayConflictMakesStale: the replayed copy of a buffered sequence
// differs from the live one.
func TestReplayConflictMakesStale(t *testing.T) {
	rs := startReplayService(t)
	pub := newPublisher(t, "tcp://127.0.0.1:*")
	e := vllmEnv(t, pub.endpoint, rs.endpoint)
	s := mustStart(t, e.cfg)
	defer s.Stop()
	pub.waitSubscribed()
	rs.put(2, storedBatch([]uint64{2}, 4, 0))
	rs.put(3, storedBatch([]uint64{333}, 4, 0))
	pub.send(1, storedBatch([]uint64{1}, 4, 0))
	pub.send(3, storedBatch([]uint64{3}, 4, 0))
	eventtest.WaitFor(t, "stale", 5*time.Second, s.Stale)
	if e.counters.Value(MetricStale, sourcetype.VLLM, events.StaleReplay) != 1 {
		t.Errorf("counters %v", e.counters.Snapshot())
	}
	assertRetracted(t, e)
}

// TestRecoveryBufferOverflow: more live messages than the recovery buffer
// may hold while a replay is outstanding makes the source stale.
func TestRecoveryBufferOverflow(t *testing.T) {
	rs := startReplayService(t)
	hold := make(chan struct{})
	rs.hold = hold
	defer close(hold)
	pub := newPublisher(t, "tcp://127.0.0.1:*")
	e := vllmEnv(t, pub.endpoint, rs.endpoint)
	e.cfg.Tuning.MaxBufferedMessages = 3
	s := mustStart(t, e.cfg)
	defer s.Stop()
	pub.waitSubscribed()
	pub.send(1, emptyBatch("vLLM"))
	for seq := uint64(3); seq <= 8; seq++ {
		pub.send(seq, emptyBatch("vLLM"))
	}
	eventtest.WaitFor(t, "stale", 5*time.Second, s.Stale)
	if e.counters.Value(MetricStale, sourcetype.VLLM, events.StaleBufferOverflow) != 1 {
		t.Errorf("counters %v", e.counters.Snapshot())
	}
}

// TestStopDuringReplay: Stop interrupts a replay that will never be
// answered, instead of waiting out its timeouts, retracts the source and
// leaks nothing (goleak in TestMain). The replay's timeouts are long, so
// the outcome tells an interrupted replay (stopped) from one that ran its
// course (retried, then deadline).
func TestStopDuringReplay(t *testing.T) {
	for _, transport := range []string{"tcp", "ipc"} {
		t.Run(transport, func(t *testing.T) {
			r := newReplayServer(t, "tcp://127.0.0.1:*") // never answers
			ep := "tcp://127.0.0.1:*"
			if transport == "ipc" {
				ep = ipcEndpoint(t, "pub")
			}
			pub := newPublisher(t, ep)
			e := vllmEnv(t, pub.endpoint, r.endpoint)
			e.cfg.Tuning.ReplayReceiveTimeout = 30 * time.Second
			e.cfg.Tuning.ReplayTotalTimeout = time.Minute
			s := mustStart(t, e.cfg)
			pub.waitSubscribed()
			pub.send(1, storedBatch([]uint64{11}, 4, 0))
			pub.send(5, storedBatch([]uint64{55}, 4, 0))
			r.request(5 * time.Second)
			if st := s.State(); st != Recovering {
				t.Fatalf("state %v", st)
			}
			start := time.Now()
			s.Stop()
			t.Logf("Stop during replay took %v", time.Since(start))
			if st := s.State(); st != Stopped {
				t.Errorf("state %v", st)
			}
			assertRetracted(t, e)
			if e.counters.Value(MetricReplays, sourcetype.VLLM, events.ReplayStopped) != 1 ||
				e.counters.Value(MetricReplays, sourcetype.VLLM, events.ReplayRetried) != 0 ||
				e.counters.Value(MetricReplays, sourcetype.VLLM, events.ReplayDeadline) != 0 {
				t.Errorf("replay not interrupted by Stop: counters %v", e.counters.Snapshot())
			}
			s.Stop() // idempotent
			goleak.VerifyNone(t)
		})
	}
}

// TestStopPromptAndIdempotent: concurrent Stops on a busy subscriber all
// return, and the engine owner is cleared once. (That Stop interrupts work
// rather than waiting for it is asserted by TestStopDuringReplay and
// TestStopPromptBehindBacklog on what was done, not on elapsed time.)
func TestStopPromptAndIdempotent(t *testing.T) {
	pub := newPublisher(t, "tcp://127.0.0.1:*")
	e := vllmEnv(t, pub.endpoint, "")
	s := mustStart(t, e.cfg)
	pub.waitSubscribed()
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		for seq := uint64(1); seq < 200; seq++ {
			pub.send(seq, storedBatch([]uint64{seq}, 4, 0))
		}
	}()
	defer func() { <-sent }()
	waitSeq(t, s, 1)
	start := time.Now()
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() { defer wg.Done(); s.Stop() }()
	}
	wg.Wait()
	t.Logf("concurrent Stops took %v", time.Since(start))
	clears := 0
	for _, o := range e.engine.Snapshot() {
		if o.Kind == "clear" {
			clears++
		}
	}
	if clears != 1 {
		t.Errorf("%d clears", clears)
	}
	if _, ok := s.LastSeq(); !ok {
		t.Error("LastSeq lost after Stop")
	}
}

// TestStartErrors: a configuration Start cannot run is refused with an
// error that names the service and what is wrong.
func TestStartErrors(t *testing.T) {
	m := eventtest.LoadManifest(t)
	base := newEnv(t, m, "vllm-a", nil, "tcp://127.0.0.1:1", "").cfg
	for _, tc := range []struct {
		name string
		mod  func(c *Config)
		want string
	}{
		{"unknown type", func(c *Config) { c.Source.Type = sourcetype.NumTypes }, "unknown publisher type"},
		{"no engine sink", func(c *Config) { c.Index.Engine = nil }, "engine source needs an index table"},
		{"unresolved profile", func(c *Config) { c.Index.Profile = hashing.Profile{} }, "hash profile is not resolved"},
		{"bad endpoint", func(c *Config) { c.Source.Endpoint = "tcp://no-port" }, "connect SUB socket to tcp://no-port"},
		{"mooncake no lookup", func(c *Config) { c.Source.Type = sourcetype.Mooncake }, "Mooncake source needs a context lookup"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := base
			tc.mod(&c)
			s, err := Start(c)
			if err == nil {
				s.Stop()
				t.Fatal("Start succeeded")
			}
			if msg := err.Error(); !strings.HasPrefix(msg, "start subscriber "+c.Source.Key+": ") || !strings.Contains(msg, tc.want) {
				t.Errorf("error %q: want it to name %q and %q", msg, "start subscriber "+c.Source.Key, tc.want)
			}
		})
	}
}

// TestClearedDoesNotTouchOthers uses the real index: vLLM's clear empties
// only its own device tier, a Mooncake cleared only its backend+tenant.
func TestClearedDoesNotTouchOthers(t *testing.T) {
	m := eventtest.LoadManifest(t)
	cat := contexts.New(index.New(index.Options{}))
	reg := m.Registration(t, "vllm-a")
	prof := eventtest.ResolveProfile(t, reg)
	tb := cat.Ensure(eventtest.ContextOf(reg), prof).Table
	other := tb.AddEngineOwner("vllm-b", 0)
	tb.Store(other, index.Put{Key: 2164874634404590027, Tier: index.Device})
	var ref index.SharedRef // another master's object
	ref.Init(nil, index.CPUShare, 0, 99, 0, nil)
	tb.Acquire(&ref)

	pubV := newPublisher(t, ipcEndpoint(t, "v"))
	sv, err := Start(Config{
		Source: SourceConfig{Key: "vllm-a", Type: sourcetype.VLLM, Endpoint: pubV.endpoint},
		Index:  IndexConfig{Context: eventtest.ContextOf(reg), Profile: prof, Engine: tb, Owner: tb.AddEngineOwner("vllm-a", 0)},
		Report: ReportConfig{Logger: eventtest.Logger(t)},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sv.Stop()
	pubM := newPublisher(t, ipcEndpoint(t, "m"))
	sm, err := Start(Config{
		Source: SourceConfig{Key: "pool-a-sub", Type: sourcetype.Mooncake, Endpoint: pubM.endpoint},
		Index: IndexConfig{Context: eventtest.ContextOf(reg), Profile: prof, Lookup: ContextLookup(func(ctx index.ContextKey) (*contexts.Entry, bool) {
			c := cat.Get(ctx)
			return c, c != nil
		})},
		Report: ReportConfig{Logger: eventtest.Logger(t)},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sm.Stop()
	pubV.waitSubscribed()
	pubM.waitSubscribed()

	counts := func() [4]int { return tb.TierBlocks() }
	pubV.send(1, eventtest.Payload(t, m.Fixture(t, "vllm_stored_gpu_2blocks")))
	pubM.send(1, eventtest.Payload(t, m.Fixture(t, "mooncake_stored_vllm_cpu_disk")))
	waitSeq(t, sv, 1)
	waitSeq(t, sm, 1)
	before := counts()
	pubV.send(2, eventtest.Payload(t, m.Fixture(t, "vllm_all_cleared")))
	pubM.send(2, eventtest.Payload(t, m.Fixture(t, "mooncake_cleared")))
	waitSeq(t, sv, 2)
	waitSeq(t, sm, 2)
	after := counts()
	t.Logf("tier blocks before %v after %v", before, after)
	// vllm-b keeps V1 on device; the foreign shared reference on 99 stays
	if after[index.Device] != 1 || after[index.CPUShare] != 1 || after[index.Disk] != 0 {
		t.Errorf("after clears: %v", after)
	}
	sv.Stop()
	sm.Stop()
	if got := counts(); got[index.Device] != 1 || got[index.CPUShare] != 1 {
		t.Errorf("after Stop: %v", got)
	}
}

func TestCountersSnapshot(t *testing.T) {
	c := NewCounters()
	c.add(MetricRejected, sourcetype.SGLang, events.EvNotMap, 3)
	c.add(MetricApplied, sourcetype.VLLM, events.ReasonNone, 2)
	snap := c.Snapshot()
	want := []Sample{
		{Metric: "events_applied", Source: "vLLM", Value: 2},
		{Metric: "events_rejected", Source: "SGLang", Reason: "not_map", Value: 3},
	}
	if fmt.Sprint(snap) != fmt.Sprint(want) {
		t.Errorf("snapshot %v", snap)
	}
	var nilC *Counters
	nilC.add(MetricApplied, sourcetype.VLLM, events.ReasonNone, 1)
	if nilC.Snapshot() != nil || nilC.Value(MetricApplied, sourcetype.VLLM, events.ReasonNone) != 0 {
		t.Error("nil counters must be inert")
	}
}

// slowSink makes every store take a while, like a contended index.
type slowSink struct{ eventtest.Recorder }

func (s *slowSink) Store(id index.OwnerID, p index.Put) (uint32, bool) {
	time.Sleep(100 * time.Microsecond)
	return s.Recorder.Store(id, p)
}

// TestStopPromptBehindBacklog: with thousands of batches queued and a slow
// index (~0.6 s of work in all), Stop interrupts the backlog instead of
// working through it. Asserted on what was applied, not on elapsed time.
func TestStopPromptBehindBacklog(t *testing.T) {
	pub := newPublisher(t, ipcEndpoint(t, "pub"))
	e := vllmEnv(t, pub.endpoint, "")
	sink := &slowSink{}
	e.cfg.Index.Engine = sink
	s := mustStart(t, e.cfg)
	pub.waitSubscribed()
	for seq := uint64(1); seq <= 3000; seq++ {
		pub.send(seq, storedBatch([]uint64{seq, seq + 1<<40}, 4, 0))
	}
	waitSeq(t, s, 10)
	start := time.Now()
	s.Stop()
	el := time.Since(start)
	last, _ := s.LastSeq()
	t.Logf("Stop behind a backlog took %v (applied %d of 3000)", el, last)
	if last >= 3000 {
		t.Errorf("Stop applied the whole backlog (%d batches) before returning", last)
	}
	if ops := sink.Snapshot(); ops[len(ops)-1].Kind != "clear" {
		t.Errorf("not retracted")
	}
}

// panicSink stands in for an index bug.
type panicSink struct{ eventtest.Recorder }

func (p *panicSink) Store(index.OwnerID, index.Put) (uint32, bool) { panic("index bug") }

// TestPanicMakesStale: a panic while applying a batch retracts the source
// instead of crashing the service.
func TestPanicMakesStale(t *testing.T) {
	e := newEnv(t, eventtest.LoadManifest(t), "vllm-a", nil, "inproc://unused", "")
	sink := &panicSink{}
	e.cfg.Index.Engine = sink
	s, err := newSubscriber(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.seq.started = true
	s.setState(Live)
	s.applyBatch(1, eventtest.Payload(t, eventtest.LoadManifest(t).Fixture(t, "vllm_stored_gpu_2blocks")))
	if s.State() != Stale || e.counters.Value(MetricStale, sourcetype.VLLM, events.StaleInternal) != 1 {
		t.Errorf("state %v counters %v", s.State(), e.counters.Snapshot())
	}
	if ops := sink.Snapshot(); len(ops) != 1 || ops[0].Kind != "clear" {
		t.Errorf("ops %v", ops)
	}
	if last, ok := s.LastSeq(); !ok || last != 1 {
		t.Errorf("last %d %v", last, ok)
	}
}

func TestTypedNilTableRejected(t *testing.T) {
	e := newEnv(t, eventtest.LoadManifest(t), "vllm-a", nil, "tcp://127.0.0.1:1", "")
	var tb *index.Table
	e.cfg.Index.Engine = tb
	if s, err := Start(e.cfg); err == nil {
		s.Stop()
		t.Fatal("Start accepted a nil *index.Table")
	}
}

// TestIPv6Endpoint: the SUB socket is dual-stack, so an engine registered
// with an IPv6 address is reachable.
func TestIPv6Endpoint(t *testing.T) {
	s, err := zmq.NewSocket(zmq.XPUB)
	if err != nil {
		t.Fatal(err)
	}
	_ = s.SetIpv6(true)
	_ = s.SetLinger(0)
	if err := s.Bind("tcp://[::1]:*"); err != nil {
		_ = s.Close()
		t.Skipf("no IPv6 loopback: %v", err)
	}
	ep, _ := s.GetLastEndpoint()
	pub := &publisher{t: t, sock: s, endpoint: ep}
	t.Cleanup(func() { pub.waitUnsubscribed(); _ = s.Close() })
	e := vllmEnv(t, ep, "")
	sub, err := Start(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop()
	pub.waitSubscribed()
	pub.send(3, emptyBatch("vLLM"))
	waitSeq(t, sub, 3)
}

// TestOwnerRemovedAfterStop: with the flag, Stop leaves an engine source's
// entries for the caller's owner removal (no clear is issued); without it,
// Stop clears every tier.
func TestOwnerRemovedAfterStop(t *testing.T) {
	for _, removed := range []bool{false, true} {
		pub := newPublisher(t, ipcEndpoint(t, "pub"))
		e := vllmEnv(t, pub.endpoint, "")
		e.cfg.Index.OwnerRemovedAfterStop = removed
		s := mustStart(t, e.cfg)
		pub.waitSubscribed()
		pub.send(1, storedBatch([]uint64{11, 12}, 4, 0))
		waitSeq(t, s, 1)
		s.Stop()
		ops := e.engine.Snapshot()
		clears := 0
		for _, o := range ops {
			if o.Kind == "clear" {
				clears++
			}
		}
		if want := map[bool]int{false: 1, true: 0}[removed]; clears != want || ops[0].Kind != "store" {
			t.Errorf("OwnerRemovedAfterStop=%v: %d clears in %v, want %d after the stores", removed, clears, ops, want)
		}
	}
}

// TestStateConnectedBeforeFirstBatch: a source reports connected once its
// connection is up, before any batch, as readiness does, whether readiness
// waits for it (a config-file service) or not (one registered at run
// time); the first batch makes it live. Its monitor stays, to see
// reconnections, and its slot is given back by Stop.
func TestStateConnectedBeforeFirstBatch(t *testing.T) {
	for _, watch := range []bool{true, false} {
		t.Run(fmt.Sprintf("WatchConnection=%v", watch), func(t *testing.T) {
			pub := newPublisher(t, "tcp://127.0.0.1:*")
			e := vllmEnv(t, pub.endpoint, "")
			e.cfg.Session.WatchConnection = watch
			sh := e.cfg.Resources
			base := sh.monitors.Load()
			s := mustStart(t, e.cfg)
			defer s.Stop()
			eventtest.WaitFor(t, "connection", 10*time.Second, s.Connected)
			if st := s.State(); st != Connected || st.String() != "connected" {
				t.Fatalf("state %v after the connection came up, want connected", st)
			}
			held := base
			if !watch {
				held++
			}
			if got := sh.monitors.Load(); got != held {
				t.Errorf("%d optional monitors while connected, want %d", got, held)
			}
			pub.waitSubscribed()
			pub.send(1, storedBatch([]uint64{11}, 4, 0))
			waitSeq(t, s, 1)
			if st := s.State(); st != Live {
				t.Fatalf("state %v after the first batch, want live", st)
			}
			s.Stop()
			if got := sh.monitors.Load(); got != base {
				t.Errorf("%d optional monitors after Stop, want %d", got, base)
			}
		})
	}
}

// TestOptionalMonitorsBounded: with MaxOptionalMonitors held by sources
// whose publishers are down, a further source registered at run time gets
// no monitor (its descriptors stay within the budget) and reports connected
// with its first batch, while one readiness waits for still gets one. Every
// slot taken is given back, by connecting or by Stop.
func TestOptionalMonitorsBounded(t *testing.T) {
	sh := NewResources(ResourcesOptions{})
	base := sh.monitors.Load()
	down := make([]*Subscriber, 0, 3)
	for i := range 3 {
		e := vllmEnv(t, ipcEndpoint(t, fmt.Sprintf("down-%d", i)), "")
		e.cfg.Resources = sh
		down = append(down, mustStart(t, e.cfg))
	}
	if got := sh.monitors.Load(); got != base+3 {
		t.Fatalf("%d optional monitors after three unconnected sources, want %d", got, base+3)
	}
	for _, s := range down {
		s.Stop()
	}
	if got := sh.monitors.Load(); got != base {
		t.Fatalf("%d optional monitors after Stop, want %d", got, base)
	}

	// Fill the remaining slots as unreachable publishers would.
	sh.monitors.Add(MaxOptionalMonitors - base)
	defer sh.monitors.Add(base - MaxOptionalMonitors)
	for _, watch := range []bool{false, true} {
		pub := newPublisher(t, "tcp://127.0.0.1:*")
		e := vllmEnv(t, pub.endpoint, "")
		e.cfg.Session.WatchConnection = watch
		e.cfg.Resources = sh
		s := mustStart(t, e.cfg)
		pub.waitSubscribed() // the connection is up
		if watch {
			eventtest.WaitFor(t, "connection", 10*time.Second, s.Connected)
		} else {
			if s.conn.mon != nil || s.conn.monSlot {
				t.Fatal("a source beyond the bound has a monitor")
			}
			if st := s.State(); st != Connecting {
				t.Fatalf("state %v without a monitor or a batch, want connecting", st)
			}
			pub.send(1, storedBatch([]uint64{11}, 4, 0))
			waitSeq(t, s, 1)
			if !s.Connected() || s.State() != Live {
				t.Fatalf("after the first batch: connected %v, state %v", s.Connected(), s.State())
			}
		}
		s.Stop()
		if got := sh.monitors.Load(); got != MaxOptionalMonitors {
			t.Fatalf("WatchConnection=%v: %d optional monitors, want %d", watch, got, MaxOptionalMonitors)
		}
	}
}

// TestOnStateTellsEveryChange: OnState hears each state change once, in
// order — connected, live, recovering and live again around a replayed
// gap, stale on a gap the replay cannot fill, stopped — and by the time it
// hears stale the source's entries are retracted.
func TestOnStateTellsEveryChange(t *testing.T) {
	rs := startReplayService(t)
	pub := newPublisher(t, "tcp://127.0.0.1:*")
	e := vllmEnv(t, pub.endpoint, rs.endpoint)
	e.cfg.Session.WatchConnection = true
	var (
		mu        sync.Mutex
		told      []State
		clearedAt = -1 // how many states had been told when the retraction was seen
	)
	e.cfg.Report.OnState = func(st State) {
		mu.Lock()
		defer mu.Unlock()
		told = append(told, st)
		if st == Stale {
			for _, o := range e.engine.Snapshot() {
				if o.Kind == "clear" {
					clearedAt = len(told)
				}
			}
		}
	}
	states := func() []State {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(told)
	}
	s := mustStart(t, e.cfg)
	eventtest.WaitFor(t, "connection", 10*time.Second, s.Connected)
	pub.waitSubscribed()
	for seq := uint64(1); seq <= 4; seq++ {
		p := storedBatch([]uint64{seq * 7}, 4, 0)
		rs.put(seq, p)
		if seq != 3 { // 3 comes back through the replay
			pub.send(seq, p)
		}
	}
	waitSeq(t, s, 4)
	eventtest.WaitFor(t, "live after the replay", 10*time.Second, func() bool { return s.State() == Live })
	// 6 and 7 are lost and the replay does not have them: stale.
	pub.send(8, storedBatch([]uint64{8 * 7}, 4, 0))
	eventtest.WaitFor(t, "stale", 10*time.Second, s.Stale)
	s.Stop()
	want := []State{Connected, Live, Recovering, Live, Recovering, Stale, Stopped}
	if got := states(); !slices.Equal(got, want) {
		t.Fatalf("told %v, want %v", got, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if clearedAt != 6 {
		t.Fatalf("the retraction was not in place when stale was told (seen at %d)", clearedAt)
	}
}

// TestServiceOutcomes: a source's own rejected and ignored counts, by
// reason; Each lists every reason of both families, zero or not (the series
// exported from registration on), plus any other reason counted, and a nil
// set is inert.
func TestServiceOutcomes(t *testing.T) {
	var o ServiceOutcomes
	o.add(true, events.EvWrongType)
	o.add(true, events.EvWrongType)
	o.add(false, events.IgnMedium)
	o.add(true, events.EvStdMapFull) // outside the exported-at-zero span
	got := map[string]uint64{}
	o.Each(func(rejected bool, reason string, n uint64) {
		k := "ignored/" + reason
		if rejected {
			k = "rejected/" + reason
		}
		if _, dup := got[k]; dup {
			t.Errorf("%s listed twice", k)
		}
		got[k] = n
	})
	for k, want := range map[string]uint64{
		"rejected/wrong_type": 2, "rejected/not_map": 0, "rejected/layout_conflict": 0, "rejected/standard_map_full": 1,
		"ignored/medium": 1, "ignored/no_binding": 0,
	} {
		if n, ok := got[k]; !ok || n != want {
			t.Errorf("%s = %d (listed %v), want %d", k, n, ok, want)
		}
	}
	for _, k := range []string{"rejected/medium", "ignored/wrong_type", "rejected/gap", "ignored/none"} {
		if _, ok := got[k]; ok {
			t.Errorf("%s listed", k)
		}
	}
	var nilO *ServiceOutcomes
	nilO.add(true, events.EvWrongType)
	if nilO.Value(true, events.EvWrongType) != 0 {
		t.Error("nil outcomes must be inert")
	}
}
