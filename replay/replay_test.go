package replay

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	zmq "github.com/pebbe/zmq4"
	"github.com/vmihailenco/msgpack/v5"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// router is an in-process replay publisher (ROUTER) on loopback TCP.
type router struct {
	t    *testing.T
	sock *zmq.Socket
	ep   string
}

func newRouter(t *testing.T) *router {
	t.Helper()
	s, err := zmq.NewSocket(zmq.ROUTER)
	if err != nil {
		t.Fatal(err)
	}
	_ = s.SetLinger(0)
	if err := s.Bind("tcp://127.0.0.1:*"); err != nil {
		t.Fatal(err)
	}
	ep, _ := s.GetLastEndpoint()
	t.Cleanup(func() { _ = s.Close() })
	return &router{t: t, sock: s, ep: ep}
}

// request returns the next request's identity and frames.
func (r *router) request() ([]byte, [][]byte) {
	r.t.Helper()
	p := zmq.NewPoller()
	p.Add(r.sock, zmq.POLLIN)
	polled, err := p.Poll(5 * time.Second)
	if err != nil || len(polled) == 0 {
		r.t.Fatalf("no request (err %v)", err)
	}
	msg, err := r.sock.RecvMessageBytes(0)
	if err != nil {
		r.t.Fatal(err)
	}
	return msg[0], msg[1:]
}

// tryRequest is request without failing: ok is false when no request
// arrived within wait.
func (r *router) tryRequest(wait time.Duration) (id []byte, frames [][]byte, ok bool) {
	r.t.Helper()
	p := zmq.NewPoller()
	p.Add(r.sock, zmq.POLLIN)
	polled, err := p.Poll(wait)
	if err != nil {
		r.t.Fatal(err)
	}
	if len(polled) == 0 {
		return nil, nil, false
	}
	msg, err := r.sock.RecvMessageBytes(0)
	if err != nil {
		r.t.Fatal(err)
	}
	return msg[0], msg[1:], true
}

func (r *router) send(id []byte, frames ...[]byte) {
	r.t.Helper()
	all := append([][]byte{id}, frames...)
	for i, f := range all {
		fl := zmq.SNDMORE
		if i == len(all)-1 {
			fl = 0
		}
		if _, err := r.sock.SendBytes(f, fl); err != nil {
			r.t.Fatal(err)
		}
	}
}

func seq8(s uint64) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, s)
	return b
}

var end = seq8(EndMarker)

func fixtureFrames(t *testing.T, id string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("../testdata/events/payloads", id+".frames.msgpack"))
	if err != nil {
		t.Fatal(err)
	}
	var frames [][]byte
	if err := msgpack.Unmarshal(b, &frames); err != nil {
		t.Fatal(err)
	}
	return frames
}

// fetchAsync runs Fetch in a goroutine (the router runs in the test one).
func fetchAsync(c *Client, req Request) <-chan result {
	ch := make(chan result, 1)
	go func() {
		recs, err := c.Fetch(req)
		ch <- result{recs, err}
	}()
	return ch
}

type result struct {
	recs []Record
	err  error
}

func wait(t *testing.T, ch <-chan result) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("Fetch did not return")
	}
	return result{}
}

func TestFixtureFrameLayouts(t *testing.T) {
	req := fixtureFrames(t, "replay_request_dealer")
	if want := EncodeRequest(6); len(req) != 2 || !bytes.Equal(req[0], want[0]) || !bytes.Equal(req[1], want[1]) {
		t.Errorf("request fixture %x, encoder %x", req, want)
	}
	for _, id := range []string{"replay_response_vllm_new", "replay_response_legacy"} {
		seq, payload, err := ParseReply(fixtureFrames(t, id))
		if err != nil || seq == EndMarker || len(payload) == 0 {
			t.Errorf("%s: seq %d, %d payload bytes, err %v", id, seq, len(payload), err)
		}
	}
	for _, id := range []string{"replay_end_vllm_new", "replay_end_legacy"} {
		seq, payload, err := ParseReply(fixtureFrames(t, id))
		if err != nil || seq != EndMarker || len(payload) != 0 {
			t.Errorf("%s: seq %x, payload %d, err %v", id, seq, len(payload), err)
		}
	}
}

// TestFetchBothGenerations replays the fixture replies of both publisher
// generations and checks the request bytes and the records returned.
func TestFetchBothGenerations(t *testing.T) {
	for _, gen := range []struct{ data, end string }{
		{"replay_response_vllm_new", "replay_end_vllm_new"},
		{"replay_response_legacy", "replay_end_legacy"},
	} {
		t.Run(gen.data, func(t *testing.T) {
			r := newRouter(t)
			data := fixtureFrames(t, gen.data)
			seq, payload, _ := ParseReply(data)
			c := NewClient(r.ep, 0)
			defer c.Close()
			ch := fetchAsync(c, Request{From: seq, Deadline: time.Now().Add(5 * time.Second)})
			id, req := r.request()
			if want := fixtureFrames(t, "replay_request_dealer"); seq == 6 && (!bytes.Equal(req[0], want[0]) || !bytes.Equal(req[1], want[1])) {
				t.Errorf("request %x, want %x", req, want)
			}
			r.send(id, data...)
			r.send(id, fixtureFrames(t, gen.end)...)
			res := wait(t, ch)
			if res.err != nil {
				t.Fatal(res.err)
			}
			if len(res.recs) != 1 || res.recs[0].Seq != seq || !bytes.Equal(res.recs[0].Payload, payload) {
				t.Errorf("records %+v", res.recs)
			}
		})
	}
}

// TestFetchSequencing covers the keep/ignore rules of docs/events.md#recovery.
func TestFetchSequencing(t *testing.T) {
	r := newRouter(t)
	c := NewClient(r.ep, 0)
	defer c.Close()
	var beyond []uint64
	ch := fetchAsync(c, Request{
		From: 5, Until: 8, HasUntil: true, Deadline: time.Now().Add(5 * time.Second),
		Beyond: func(s uint64, _ []byte) error { beyond = append(beyond, s); return nil },
	})
	id, _ := r.request()
	for _, s := range []uint64{3, 4, 5, 5, 6, 7, 8, 9} { // older, dup, beyond
		r.send(id, nil, seq8(s), []byte{byte(s)})
	}
	r.send(id, nil, end, nil)
	res := wait(t, ch)
	if res.err != nil {
		t.Fatal(res.err)
	}
	var got []uint64
	for _, rec := range res.recs {
		got = append(got, rec.Seq)
	}
	if len(got) != 3 || got[0] != 5 || got[2] != 7 {
		t.Errorf("kept %v, want [5 6 7]", got)
	}
	if len(beyond) != 2 {
		t.Errorf("beyond %v, want [8 9]", beyond)
	}
}

func TestFetchUnrecoverable(t *testing.T) {
	cases := []struct {
		name    string
		replies [][][]byte
		until   uint64
	}{
		{"window expired", [][][]byte{{nil, []byte("t"), seq8(10000), {1}}}, 0},
		{"early end", [][][]byte{{nil, nil, end, nil}}, 9},
		{"end before until", [][][]byte{{nil, seq8(6), {1}}, {nil, end, nil}}, 9},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRouter(t)
			c := NewClient(r.ep, 0)
			defer c.Close()
			req := Request{From: 6, Deadline: time.Now().Add(5 * time.Second)}
			if tc.until != 0 {
				req.Until, req.HasUntil = tc.until, true
			}
			ch := fetchAsync(c, req)
			id, _ := r.request()
			for _, rep := range tc.replies {
				r.send(id, rep...)
			}
			res := wait(t, ch)
			if !errors.Is(res.err, ErrUnrecoverable) {
				t.Errorf("err = %v, want ErrUnrecoverable", res.err)
			}
		})
	}
}

// TestFetchRetriesWithFreshDealer: a timed-out or malformed attempt is
// retried from a new DEALER (new identity), and a late reply to the old
// request is never mixed into the new one.
func TestFetchRetriesWithFreshDealer(t *testing.T) {
	for _, bad := range []struct {
		name  string
		reply [][]byte // nil = stay silent
	}{
		{"timeout", nil},
		{"two frames", [][]byte{nil, seq8(6)}},
		{"non-empty delimiter", [][]byte{{1}, seq8(6), {1}}},
		{"short sequence", [][]byte{nil, {0, 6}, {1}}},
		{"end marker with payload", [][]byte{nil, end, {1}}},
	} {
		t.Run(bad.name, func(t *testing.T) {
			r := newRouter(t)
			c := NewClient(r.ep, 0)
			defer c.Close()
			retries := 0
			ch := fetchAsync(c, Request{
				From: 6, Deadline: time.Now().Add(5 * time.Second), ReceiveTimeout: 100 * time.Millisecond,
				OnRetry: func(error) { retries++ },
			})
			id1, _ := r.request()
			if bad.reply != nil {
				r.send(id1, bad.reply...)
			}
			// Answer every retry until Fetch returns: on a loaded machine
			// a retry can itself time out before its answer is sent, and
			// then the next one must get it. Each retry must come from a
			// fresh identity and ask for the same start.
			ids := [][]byte{id1}
			var res result
			for done := false; !done; {
				select {
				case res = <-ch:
					done = true
					continue
				default:
				}
				id, req, ok := r.tryRequest(50 * time.Millisecond)
				if !ok {
					continue
				}
				for _, old := range ids {
					if bytes.Equal(old, id) {
						t.Errorf("retry %d reused a DEALER identity", len(ids))
					}
				}
				ids = append(ids, id)
				if binary.BigEndian.Uint64(req[1]) != 6 {
					t.Errorf("retry asked for %x", req[1])
				}
				r.send(id1, nil, seq8(6), []byte("stale")) // late reply to the old request: must be lost
				r.send(id, nil, seq8(6), []byte("good"))
				r.send(id, nil, end, nil)
			}
			if res.err != nil {
				t.Fatal(res.err)
			}
			if len(res.recs) != 1 || string(res.recs[0].Payload) != "good" {
				t.Errorf("records %+v", res.recs)
			}
			// Every request after the first follows a retry; a retry can
			// also fail before its request leaves (a send error), so the
			// count may exceed the requests seen, never fall short.
			if len(ids) < 2 || retries < len(ids)-1 {
				t.Errorf("retries = %d after %d requests, want at least one fewer and at least one", retries, len(ids))
			}
		})
	}
}

func TestFetchDeadline(t *testing.T) {
	r := newRouter(t)
	c := NewClient(r.ep, 0)
	defer c.Close()
	deadline := time.Now().Add(300 * time.Millisecond)
	_, err := c.Fetch(Request{From: 1, Deadline: deadline, ReceiveTimeout: 100 * time.Millisecond})
	if !errors.Is(err, ErrDeadline) {
		t.Fatalf("err = %v, want ErrDeadline", err)
	}
	if now := time.Now(); now.Before(deadline) {
		t.Errorf("gave up %v before the deadline", deadline.Sub(now))
	}
}

func TestFetchBudget(t *testing.T) {
	r := newRouter(t)
	c := NewClient(r.ep, 0)
	defer c.Close()
	b := &Budget{MaxMessages: 2}
	ch := fetchAsync(c, Request{From: 1, Deadline: time.Now().Add(5 * time.Second), Budget: b})
	id, _ := r.request()
	for s := uint64(1); s <= 3; s++ {
		r.send(id, nil, seq8(s), []byte{1})
	}
	r.send(id, nil, end, nil)
	res := wait(t, ch)
	if !errors.Is(res.err, ErrBudget) || !errors.Is(res.err, ErrUnrecoverable) {
		t.Errorf("err = %v, want ErrBudget", res.err)
	}
	if n, _ := b.Used(); n != 0 {
		t.Errorf("budget still holds %d messages after failure", n)
	}
}

func TestFetchBeyondConflict(t *testing.T) {
	r := newRouter(t)
	c := NewClient(r.ep, 0)
	defer c.Close()
	ch := fetchAsync(c, Request{
		From: 1, Until: 2, HasUntil: true, Deadline: time.Now().Add(5 * time.Second),
		Beyond: func(s uint64, p []byte) error { return errors.New("differs") },
	})
	id, _ := r.request()
	r.send(id, nil, seq8(1), []byte{1})
	r.send(id, nil, seq8(2), []byte{2})
	res := wait(t, ch)
	if !errors.Is(res.err, ErrUnrecoverable) {
		t.Errorf("err = %v", res.err)
	}
}

// TestFetchWatchAbort: a watched socket's handler can end a replay at once
// (this is how Stop interrupts recovery).
func TestFetchWatchAbort(t *testing.T) {
	r := newRouter(t)
	rx, _ := zmq.NewSocket(zmq.PAIR)
	tx, _ := zmq.NewSocket(zmq.PAIR)
	_ = rx.SetLinger(0)
	_ = tx.SetLinger(0)
	defer rx.Close()
	defer tx.Close()
	if err := rx.Bind("inproc://replay-watch-test"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Connect("inproc://replay-watch-test"); err != nil {
		t.Fatal(err)
	}
	c := NewClient(r.ep, 0)
	defer c.Close()
	stop := errors.New("stop")
	ch := fetchAsync(c, Request{
		From: 1, Deadline: time.Now().Add(10 * time.Second), Watch: []*zmq.Socket{rx},
		OnWatch: func(*zmq.Socket) error { return stop },
	})
	r.request()
	if _, err := tx.SendBytes([]byte{1}, 0); err != nil {
		t.Fatal(err)
	}
	// No receive timeout and a distant deadline: only the watch can have
	// ended the fetch, and it must say so with OnWatch's error.
	res := wait(t, ch)
	if !errors.Is(res.err, stop) {
		t.Errorf("err = %v", res.err)
	}
}

func TestBudget(t *testing.T) {
	var nilB *Budget
	if !nilB.Take(1 << 30) {
		t.Error("nil budget must be unlimited")
	}
	b := &Budget{MaxMessages: 3, MaxBytes: 10}
	if !b.Take(6) || b.Take(6) || !b.Take(4) || b.Take(1) || !b.Take(0) || b.Take(0) {
		t.Errorf("budget accounting wrong: %+v", b)
	}
	b.Give(4)
	if m, n := b.Used(); m != 2 || n != 6 {
		t.Errorf("used %d/%d", m, n)
	}
	b.Reset()
	if m, n := b.Used(); m != 0 || n != 0 {
		t.Errorf("reset left %d/%d", m, n)
	}
	// Room taken before the reset and given back after it (a recovery
	// whose buffer was dropped while a fetch still held records) does not
	// count below zero.
	b.Give(6)
	if m, n := b.Used(); m != 0 || n != 0 {
		t.Errorf("given back after a reset: %d/%d", m, n)
	}
}

// TestReceiveTimeoutIgnoresWatchTraffic: wake-ups from watched sockets do
// not restart the per-reply timeout, so a silent publisher is retried on
// time even while live traffic flows.
func TestReceiveTimeoutIgnoresWatchTraffic(t *testing.T) {
	r := newRouter(t)
	rx, _ := zmq.NewSocket(zmq.PAIR)
	tx, _ := zmq.NewSocket(zmq.PAIR)
	_ = rx.SetLinger(0)
	_ = tx.SetLinger(0)
	defer rx.Close()
	defer tx.Close()
	_ = rx.Bind("inproc://replay-watch-traffic")
	_ = tx.Connect("inproc://replay-watch-traffic")
	c := NewClient(r.ep, 0)
	defer c.Close()
	retried := make(chan struct{}, 4)
	// Traffic flows until the first retry. Were the per-reply timeout
	// restarted by it, no retry would come and the fetch would end at its
	// deadline instead.
	ch := fetchAsync(c, Request{
		From: 1, Deadline: time.Now().Add(time.Minute), ReceiveTimeout: 200 * time.Millisecond,
		Watch: []*zmq.Socket{rx},
		OnWatch: func(s *zmq.Socket) error {
			_, err := s.RecvBytes(0)
			return err
		},
		OnRetry: func(error) { retried <- struct{}{} },
	})
	r.request()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
loop:
	for {
		select {
		case <-retried:
			break loop
		case res := <-ch:
			t.Fatalf("no retry while watched traffic flowed; fetch ended with %v", res.err)
		case <-tick.C:
			_, _ = tx.SendBytes([]byte{1}, 0)
		}
	}
	id, _ := r.request()
	r.send(id, nil, end, nil)
	if res := wait(t, ch); res.err != nil {
		t.Fatal(res.err)
	}
}

// TestFetchResumesPastDroppedReplies: a ROUTER that loses every reply past
// the first perRequest of each request (what a publisher's send high-water
// mark does to a reader that falls behind, end marker included) still
// yields a gap of ten times that, because every attempt asks from the first
// sequence still missing. Before the fix each attempt restarted at From and
// the gap never completed.
func TestFetchResumesPastDroppedReplies(t *testing.T) {
	const (
		perRequest = 50
		gap        = 10 * perRequest
	)
	r := newRouter(t)
	c := NewClient(r.ep, 0)
	defer c.Close()
	budget := &Budget{MaxMessages: gap + 1}
	ch := fetchAsync(c, Request{
		From:     1,
		Deadline: time.Now().Add(60 * time.Second),
		// Only the silence after the dropped replies waits this long; each
		// attempt's replies arrive at once.
		ReceiveTimeout: 100 * time.Millisecond,
		Budget:         budget,
	})
	var froms []uint64
	for {
		id, req := r.request()
		from := binary.BigEndian.Uint64(req[1])
		froms = append(froms, from)
		sent := 0
		for s := from; s <= gap && sent < perRequest; s++ {
			r.send(id, nil, seq8(s), []byte(fmt.Sprintf("batch %d", s)))
			sent++
		}
		if from+uint64(sent) > gap && sent < perRequest {
			r.send(id, nil, end, nil) // the end marker fits under the limit
			break
		}
	}
	res := wait(t, ch)
	if res.err != nil {
		t.Fatalf("Fetch: %v (requests from %v)", res.err, froms)
	}
	want := make([]Record, gap)
	for i := range want {
		want[i] = Record{Seq: uint64(i + 1), Payload: []byte(fmt.Sprintf("batch %d", i+1))}
	}
	if diff := cmp.Diff(want, res.recs); diff != "" {
		t.Errorf("records (-want +got):\n%s", diff)
	}
	// Every attempt gains ground: the requested start never moves back and
	// the first one asks for From.
	if froms[0] != 1 {
		t.Errorf("first request from %d, want 1", froms[0])
	}
	for i := 1; i < len(froms); i++ {
		if froms[i] < froms[i-1] {
			t.Errorf("request %d asked from %d after %d: %v", i, froms[i], froms[i-1], froms)
		}
	}
	if len(froms) < gap/perRequest+1 {
		t.Errorf("%d requests, want at least %d (each loses replies past %d): %v", len(froms), gap/perRequest+1, perRequest, froms)
	}
	if m, _ := budget.Used(); m != gap {
		t.Errorf("budget holds %d messages, want %d", m, gap)
	}
}

// TestFetchDeadlineGivesBackPartialRecords: when the deadline ends a
// recovery that kept records from earlier attempts, none is returned and
// their budget is released.
func TestFetchDeadlineGivesBackPartialRecords(t *testing.T) {
	r := newRouter(t)
	c := NewClient(r.ep, 0)
	defer c.Close()
	budget := &Budget{}
	ch := fetchAsync(c, Request{
		From: 1, Deadline: time.Now().Add(2 * time.Second), ReceiveTimeout: 100 * time.Millisecond,
		Budget: budget,
	})
	id, _ := r.request()
	r.send(id, nil, seq8(1), []byte("one"))
	r.send(id, nil, seq8(2), []byte("two"))
	// No end marker, and later requests get nothing: the deadline ends it.
	res := wait(t, ch)
	if !errors.Is(res.err, ErrDeadline) {
		t.Fatalf("err = %v, want ErrDeadline", res.err)
	}
	if res.recs != nil {
		t.Errorf("records %+v returned with an error", res.recs)
	}
	if m, b := budget.Used(); m != 0 || b != 0 {
		t.Errorf("budget still holds %d messages, %d bytes", m, b)
	}
}

// TestFetchAnchor: with an anchor the request starts one sequence earlier;
// the record there is checked before anything is kept. A different record
// means another process; a missing one (the window moved on) proves
// nothing and the replay goes on as without an anchor. Without an upper
// bound (open) every later record is kept, and nothing at or after the
// anchor is ErrBehind: the endpoint's process has not got that far.
func TestFetchAnchor(t *testing.T) {
	cases := []struct {
		name    string
		open    bool
		replies []uint64 // sequences replied, each with payload {seq}
		wantErr error
		wantRec []uint64
	}{
		{"same process", false, []uint64{4, 5, 6, 7}, nil, []uint64{5, 6, 7}},
		{"another process", false, []uint64{4, 5, 6, 7}, ErrAnotherProcess, nil},
		{"anchor gone, range held", false, []uint64{5, 6, 7}, nil, []uint64{5, 6, 7}},
		{"anchor gone, range gone", false, []uint64{6, 7}, ErrUnrecoverable, nil},
		{"nothing buffered", false, nil, ErrUnrecoverable, nil},
		{"open, same process", true, []uint64{4, 5, 6, 7, 8, 9}, nil, []uint64{5, 6, 7, 8, 9}},
		{"open, anchor only", true, []uint64{4}, nil, nil},
		{"open, anchor gone", true, []uint64{6, 7}, ErrUnrecoverable, nil},
		{"open, nothing at or after the anchor", true, nil, ErrBehind, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRouter(t)
			c := NewClient(r.ep, 0)
			defer c.Close()
			var checked [][]byte
			want := []byte{4}
			if tc.name == "another process" {
				want = []byte{44}
			}
			ch := fetchAsync(c, Request{
				From: 5, Until: 8, HasUntil: !tc.open, Deadline: time.Now().Add(5 * time.Second),
				Anchor: func(p []byte) bool { checked = append(checked, bytes.Clone(p)); return bytes.Equal(p, want) },
			})
			id, req := r.request()
			if got := binary.BigEndian.Uint64(req[1]); got != 4 {
				t.Errorf("request from %d, want 4 (the anchor)", got)
			}
			for _, s := range tc.replies {
				r.send(id, nil, seq8(s), []byte{byte(s)})
			}
			r.send(id, nil, end, nil)
			res := wait(t, ch)
			if tc.wantErr != nil {
				if !errors.Is(res.err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", res.err, tc.wantErr)
				}
				if tc.wantErr == ErrUnrecoverable && (errors.Is(res.err, ErrAnotherProcess) || errors.Is(res.err, ErrBehind)) {
					t.Fatalf("err = %v: a missing anchor is no evidence of another process", res.err)
				}
				return
			}
			if res.err != nil {
				t.Fatal(res.err)
			}
			var got []uint64
			for _, rec := range res.recs {
				got = append(got, rec.Seq)
			}
			if diff := cmp.Diff(tc.wantRec, got); diff != "" {
				t.Errorf("records (-want +got):\n%s", diff)
			}
			wantChecked := 0
			if len(tc.replies) > 0 && tc.replies[0] == 4 {
				wantChecked = 1
			}
			if len(checked) != wantChecked {
				t.Errorf("anchor checked %d times, want %d", len(checked), wantChecked)
			}
		})
	}
}

// TestFetchFromFirst: a stream started over begins at its oldest buffered
// record; with nothing buffered before Until the range is empty.
func TestFetchFromFirst(t *testing.T) {
	for _, tc := range []struct {
		name    string
		replies []uint64
		want    []uint64
	}{
		{"from zero", []uint64{0, 1, 2, 3}, []uint64{0, 1, 2}},
		{"oldest evicted", []uint64{1, 2, 3}, []uint64{1, 2}},
		{"nothing before until", []uint64{3}, nil},
		{"nothing at all", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRouter(t)
			c := NewClient(r.ep, 0)
			defer c.Close()
			ch := fetchAsync(c, Request{From: 0, FromFirst: true, Until: 3, HasUntil: true, Deadline: time.Now().Add(5 * time.Second)})
			id, _ := r.request()
			for _, s := range tc.replies {
				r.send(id, nil, seq8(s), []byte{byte(s)})
			}
			r.send(id, nil, end, nil)
			res := wait(t, ch)
			if res.err != nil {
				t.Fatal(res.err)
			}
			var got []uint64
			for _, rec := range res.recs {
				got = append(got, rec.Seq)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("records (-want +got):\n%s", diff)
			}
		})
	}
}
