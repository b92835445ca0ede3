package subscriber

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"reflect"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/mooncake-conductor-go/conductor/internal/events"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/racebuild"
	"github.com/mooncake-conductor-go/conductor/internal/zmqx"
	zmq "github.com/pebbe/zmq4"
)

// TestSocketHandleFieldPresent guards the one assumption the batch receive
// path makes about pebbe/zmq4: zmq.Socket is laid out as pebbeSocket, the
// libzmq handle first. The build and CheckZMQBinding already refuse
// another layout; this checks the check, and that the handle read through
// the mirror is the socket's.
func TestSocketHandleFieldPresent(t *testing.T) {
	if err := checkSocketLayout(reflect.TypeFor[zmq.Socket]()); err != nil {
		t.Fatal(err)
	}
	type retyped struct {
		soc    uintptr
		ctx    *zmq.Context
		opened bool
		err    error
	}
	type renamed struct {
		handle unsafe.Pointer
		ctx    *zmq.Context
		opened bool
		err    error
	}
	type grown struct {
		soc    unsafe.Pointer
		ctx    *zmq.Context
		opened bool
		err    error
		extra  int
	}
	for _, typ := range []reflect.Type{reflect.TypeFor[retyped](), reflect.TypeFor[renamed](), reflect.TypeFor[grown]()} {
		if checkSocketLayout(typ) == nil {
			t.Errorf("%v passes the layout check", typ)
		}
	}
	s, err := zmq.NewSocket(zmq.SUB)
	if err != nil {
		t.Fatal(err)
	}
	if rawSocket(s) == nil {
		t.Fatal("open socket has a nil handle")
	}
	_ = s.Close()
	if rawSocket(s) != nil {
		t.Fatal("closed socket still has a handle")
	}
	r := batchReceiver{shared: NewResources(ResourcesOptions{})}
	if _, err := r.recv(s, nil, 1); err != zmq.ErrorSocketClosed {
		t.Fatalf("receive on a closed socket: %v", err)
	}
	r.discard()
}

// subPair connects two SUB sockets to one inproc XPUB. Over inproc a sent
// message is in the subscribers' pipes when the send returns, so a test can
// publish first and then receive everything in known batches.
type subPair struct {
	pub  *publisher
	a, b *zmq.Socket
}

var inprocSeq atomic.Uint64

func newSubPair(t *testing.T) *subPair {
	t.Helper()
	ep := fmt.Sprintf("inproc://recv-test-%d", inprocSeq.Add(1))
	pub := newPublisher(t, ep)
	if err := pub.sock.SetXpubVerbose(1); err != nil { // report the second, identical subscription too
		t.Fatal(err)
	}
	p := &subPair{pub: pub}
	for _, sp := range []**zmq.Socket{&p.a, &p.b} {
		s, err := zmq.NewSocket(zmq.SUB)
		if err != nil {
			t.Fatal(err)
		}
		_ = s.SetLinger(0)
		_ = s.SetRcvhwm(0)
		if err := s.SetSubscribe(""); err != nil {
			t.Fatal(err)
		}
		if err := s.Connect(ep); err != nil {
			t.Fatal(err)
		}
		*sp = s
		pub.waitSubscribed()
	}
	t.Cleanup(func() {
		_ = p.a.Close()
		_ = p.b.Close()
	})
	return p
}

// TestBatchReceiveMatchesPerFrame sends messages of 1 to 7 frames, empty
// frames and a frame far larger than a batch's byte budget, and checks that
// the batch path hands out exactly what the per-frame path does (first four
// frames, then nil up to five entries), message by message.
func TestBatchReceiveMatchesPerFrame(t *testing.T) {
	p := newSubPair(t)
	big := bytes.Repeat([]byte("0123456789abcdef"), (batchMaxBytes+12345)/16)
	var sent int
	send := func(frames ...[]byte) {
		p.pub.sendFrames(frames...)
		sent++
	}
	for round := range 40 {
		for n := 1; n <= 7; n++ {
			frames := make([][]byte, n)
			for i := range frames {
				frames[i] = fmt.Appendf(nil, "r%d-n%d-f%d", round, n, i)
			}
			send(frames...)
		}
		send([]byte{}, seqFrame(uint64(round)), []byte{})
		send(nil, seqFrame(uint64(round)), bytes.Repeat([]byte{byte(round)}, 40)) // above libzmq's inline size
		if round%13 == 0 {
			send([]byte("big"), seqFrame(uint64(round)), big)
		}
	}
	r := batchReceiver{shared: NewResources(ResourcesOptions{})}
	defer r.discard()
	var got [][]byte
	for i := range sent {
		want, err := zmqx.RecvMessage(p.a, nil, keepFrames)
		if err != nil {
			t.Fatalf("message %d: per-frame receive: %v", i, err)
		}
		got, err = r.recv(p.b, got[:0], drainBurst)
		if err != nil {
			t.Fatalf("message %d: batch receive: %v", i, err)
		}
		if len(got) != len(want) {
			t.Fatalf("message %d: %d frames, per-frame path %d", i, len(got), len(want))
		}
		for j := range want {
			// the fifth entry, when present, is the nil that stands for the
			// frames beyond the fourth
			if !bytes.Equal(got[j], want[j]) || (j == 4 && got[j] != nil) {
				t.Fatalf("message %d frame %d: %.40q, per-frame path %.40q", i, j, got[j], want[j])
			}
		}
	}
	if _, err := r.recv(p.b, got[:0], drainBurst); zmq.AsErrno(err) != zmq.Errno(syscall.EAGAIN) {
		t.Fatalf("empty socket: %v, want EAGAIN", err)
	}
}

// TestBatchReceiveLimits: one fill takes at most the caller's limit, at
// most 64 messages, and a message larger than the byte budget alone; order
// is kept across fills.
func TestBatchReceiveLimits(t *testing.T) {
	p := newSubPair(t)
	big := make([]byte, batchMaxBytes+1)
	const n = 300
	for i := range n {
		if i == 150 || i == 151 {
			p.pub.sendFrames([]byte("t"), seqFrame(uint64(i)), big)
			continue
		}
		p.pub.send(uint64(i), []byte{byte(i)})
	}
	r := batchReceiver{shared: NewResources(ResourcesOptions{})}
	defer r.discard()
	var frames [][]byte
	var err error
	var fills []int
	for i := range n {
		limit := drainBurst
		if i < 100 {
			limit = 10
		}
		if !r.queued() {
			fills = append(fills, i)
		}
		if frames, err = r.recv(p.b, frames[:0], limit); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if len(frames) != 3 || string(frames[1]) != string(seqFrame(uint64(i))) {
			t.Fatalf("message %d: got %q", i, frames)
		}
		if i != 150 && i != 151 && !bytes.Equal(frames[2], []byte{byte(i)}) {
			t.Fatalf("message %d: payload %q", i, frames[2])
		}
		if (i == 150 || i == 151) && len(frames[2]) != len(big) {
			t.Fatalf("message %d: %d payload bytes, sent %d", i, len(frames[2]), len(big))
		}
	}
	// 10 at a time up to 100, then 64 at a time; each big message ends its
	// batch (the budget is checked before a message is taken) and the second
	// one therefore comes alone.
	want := []int{0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 151, 152, 216, 280}
	if fmt.Sprint(fills) != fmt.Sprint(want) {
		t.Fatalf("batches started at %v, want %v", fills, want)
	}
}

// TestBufferedLivePayloadIsCopied: messages held during a replay outlive the
// receive batch they arrived in, so bufferLive must keep a copy.
func TestBufferedLivePayloadIsCopied(t *testing.T) {
	e := vllmEnv(t, "inproc://unused", "")
	s, err := newSubscriber(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.rec.budget.MaxMessages, s.rec.budget.MaxBytes = 10, 1<<20
	payload := []byte("payload bytes")
	if err := s.bufferLive([][]byte{nil, seqFrame(5), payload}); err != nil {
		t.Fatal(err)
	}
	copy(payload, "XXXXXXXXXXXXX")
	if len(s.rec.buffered) != 1 || string(s.rec.buffered[0].payload) != "payload bytes" {
		t.Fatalf("buffered %v", s.rec.buffered)
	}
}

// TestRecoveryWithQueuedMessages: live messages already received into the
// batch when a gap is detected are buffered for the recovery and applied
// after it, in order, although the SUB socket never reports them again;
// the publisher keeps streaming meanwhile so later batches reuse the
// memory the first one used.
func TestRecoveryWithQueuedMessages(t *testing.T) {
	rs := startReplayService(t)
	hold := make(chan struct{})
	rs.hold = hold
	pub := newPublisher(t, "tcp://127.0.0.1:*")
	e := vllmEnv(t, pub.endpoint, rs.endpoint)
	s := mustStart(t, e.cfg)
	defer s.Stop()
	pub.waitSubscribed()
	var want []uint64
	key := func(seq uint64) uint64 { return seq*7919 + 1 }
	pub.send(1, storedBatch([]uint64{key(1)}, 4, 0))
	waitSeq(t, s, 1)
	want = append(want, key(1))
	rs.put(2, storedBatch([]uint64{key(2)}, 4, 0))
	// seq 2 is missing live; 3..40 arrive in one burst behind the gap.
	for seq := uint64(3); seq <= 40; seq++ {
		pub.send(seq, storedBatch([]uint64{key(seq)}, 4, 0))
	}
	eventtest.WaitFor(t, "recovery", 5*time.Second, func() bool { return s.State() == Recovering })
	for seq := uint64(41); seq <= 300; seq++ {
		pub.send(seq, storedBatch([]uint64{key(seq)}, 4, 0))
	}
	eventtest.WaitFor(t, "live messages buffered", 5*time.Second, func() bool {
		return e.counters.Value(MetricReceived, sourcetype.VLLM, events.ReasonNone) == 299
	})
	close(hold)
	waitSeq(t, s, 300)
	for seq := uint64(2); seq <= 300; seq++ {
		want = append(want, key(seq))
	}
	var got []uint64
	for _, o := range e.engine.Snapshot() {
		if o.Kind == "store" {
			got = append(got, o.Key)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("stored %d blocks, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("block %d: key %d, want %d", i, got[i], want[i])
		}
	}
	if s.Stale() || e.counters.Value(MetricReplays, sourcetype.VLLM, events.ReplayRecovered) != 1 {
		t.Fatalf("state %v, counters %v", s.State(), e.counters.Snapshot())
	}
}

// countTrims returns subscribers' shared state whose trimmer counts trims
// instead of trimming.
func countTrims(t *testing.T) (*Resources, *atomic.Int64) {
	var n atomic.Int64
	sh := NewResources(ResourcesOptions{Trimmer: zmqx.NewTrimmer(func() { n.Add(1) })})
	t.Cleanup(sh.Trimmer().Wait)
	return sh, &n
}

// TestTrimAfterBacklogDrains: a source that had a backlog of several MiB
// asks for a trim once its socket is empty; a source that keeps up does not.
func TestTrimAfterBacklogDrains(t *testing.T) {
	sh, n := countTrims(t)
	p := newSubPair(t)
	payload := make([]byte, 64<<10)
	for i := range 100 { // 6.4 MiB, more than one batch
		p.pub.send(uint64(i), payload)
	}
	r := batchReceiver{shared: sh}
	defer r.discard()
	var frames [][]byte
	var err error
	for i := range 100 {
		if frames, err = r.recv(p.b, frames[:0], drainBurst); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	if n.Load() != 0 {
		t.Fatal("trimmed before the socket was empty")
	}
	if _, err := r.recv(p.b, frames[:0], drainBurst); zmq.AsErrno(err) != zmq.Errno(syscall.EAGAIN) {
		t.Fatalf("empty socket: %v", err)
	}
	eventtest.WaitFor(t, "a trim after the backlog drained", 5*time.Second, func() bool { return n.Load() == 1 })
	// Small traffic received in one batch each time: no backlog, no trim.
	for i := range 50 {
		p.pub.send(uint64(i), payload[:100])
		for range 2 {
			_, _ = r.recv(p.b, frames[:0], drainBurst)
		}
	}
	eventtest.WaitFor(t, "trimmer idle", 5*time.Second, func() bool { return !sh.Trimmer().Running() })
	if got := n.Load(); got != 1 {
		t.Fatalf("%d trims, want 1", got)
	}
}

// TestLiveIngestDoesNotAllocate: receiving, decoding and applying a stream
// of well-formed batches allocates nothing in steady state (the batch
// receive reads frames in place, the decoders reuse their buffers).
func TestLiveIngestDoesNotAllocate(t *testing.T) {
	if racebuild.Enabled {
		t.Skip("the race detector allocates")
	}
	// both event dialects (docs/events.md#array-encoded-events)
	for _, arrays := range []bool{false, true} {
		t.Run(map[bool]string{false: "map", true: "array"}[arrays], func(t *testing.T) { liveIngestAllocs(t, arrays) })
	}
}

func liveIngestAllocs(t *testing.T, arrays bool) {
	m := eventtest.LoadManifest(t)
	pub := newPublisher(t, fmt.Sprintf("inproc://recv-test-%d", inprocSeq.Add(1)))
	e := newEnv(t, m, "vllm-a", nil, pub.endpoint, "")
	e.cfg.Index.Context.BlockSize = benchBlockSize
	e.cfg.Index.Engine = nopSink{}
	e.cfg.test.onEvent, e.cfg.test.onApply = nil, nil
	s, err := newSubscriber(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.conn.open(s); err != nil {
		t.Fatal(err)
	}
	defer func() {
		s.rx.batch.discard()
		s.conn.close(s)
	}()
	pub.waitSubscribed()
	payload, offs := vllmBatchTemplateOf(arrays)
	topic, seqb := []byte("kv"), make([]byte, 8)
	var seq uint64
	send := func(n int) {
		for range n {
			patchHashes(payload, offs, seq)
			binary.BigEndian.PutUint64(seqb, seq)
			seq++
			_, _ = pub.sock.SendBytes(topic, zmq.SNDMORE)
			_, _ = pub.sock.SendBytes(seqb, zmq.SNDMORE)
			_, _ = pub.sock.SendBytes(payload, 0)
		}
	}
	send(100) // warm up: buffers grow to their steady size
	if err := s.drain(s.onLive); err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(20, func() {
		send(100)
		if err := s.drain(s.onLive); err != nil {
			t.Fatal(err)
		}
	})
	if last, ok := s.LastSeq(); !ok || last != seq-1 {
		t.Fatalf("applied up to %d (%v), sent %d", last, ok, seq)
	}
	if got := e.counters.Value(MetricApplied, sourcetype.VLLM, events.ReasonNone); got != seq {
		t.Fatalf("%d events applied, want %d", got, seq)
	}
	if allocs != 0 {
		t.Fatalf("%.1f allocations per 100 messages", allocs)
	}
}

// TestCheckZMQBinding: the build's pebbe/zmq4 must be the release the
// mirror was written for, unreplaced; build information without
// dependencies (a test binary's) leaves the layout check alone. The
// errors name the release found and the one mirrored. (The binary's own
// build information is checked in the top-level TestCommandLine.)
func TestCheckZMQBinding(t *testing.T) {
	dep := func(version string, replace *debug.Module) *debug.BuildInfo {
		return &debug.BuildInfo{Deps: []*debug.Module{
			{Path: "github.com/rs/zerolog", Version: "v1.35.1"},
			{Path: pebbePath, Version: version, Replace: replace},
		}}
	}
	for _, tc := range []struct {
		name string
		bi   *debug.BuildInfo
		want []string // substrings of the error; nil: no error
	}{
		{"no build information", nil, nil},
		{"test binary", &debug.BuildInfo{}, nil},
		{"pinned release", dep(pebbeVersion, nil), nil},
		{"other release", dep("v1.5.0", nil), []string{"v1.5.0", pebbeVersion, "recv_cgo.go"}},
		{"replaced", dep(pebbeVersion, &debug.Module{Path: "example.com/fork/zmq4", Version: "v1.4.1"}), []string{"example.com/fork/zmq4 v1.4.1", pebbeVersion}},
	} {
		err := CheckZMQBinding(tc.bi)
		if (err != nil) != (tc.want != nil) {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not name %q", tc.name, err, w)
			}
		}
	}
}
