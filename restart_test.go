package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	zmq "github.com/pebbe/zmq4"
	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/mooncake-conductor-go/conductor/internal/config"
	"github.com/mooncake-conductor-go/conductor/internal/state/regstore"
	"github.com/mooncake-conductor-go/conductor/internal/state/statedir"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
	"github.com/mooncake-conductor-go/conductor/registry"
)

// These tests run the real binary against real ZMQ publishers on loopback
// and real files, and restart it: gracefully, by SIGKILL in the middle of
// ingestion, and for longer than a publisher's replay buffer.

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// TestMain removes the binary conductorBinary built, which would otherwise
// stay behind in the temporary directory after every run.
func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		_ = os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}

// Version and commit stamped into the test binary at link time, which
// TestCommandLine checks --version against.
const (
	testBinaryVersion = "v9.8.7"
	testBinaryCommit  = "0123abc"
)

// conductorBinary builds the binary once per test run (building it costs
// tens of seconds on a busy machine; every test that runs it shares it).
func conductorBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and restarts the binary")
	}
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "conductor-restart-test")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "conductor")
		const pkg = "github.com/mooncake-conductor-go/conductor/internal/buildinfo"
		build := exec.Command("go", "build", "-ldflags", "-X "+pkg+".version="+testBinaryVersion+" -X "+pkg+".commit="+testBinaryCommit, "-o", binPath, ".")
		build.Stderr = os.Stderr
		binErr = build.Run()
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// proc is one run of the binary.
type proc struct {
	t      *testing.T
	cmd    *exec.Cmd
	base   string
	mu     sync.Mutex
	log    bytes.Buffer
	exited chan struct{}
	err    error
	c      fasthttp.Client
}

// startConductor runs the binary on stateDir and waits until it listens.
func startConductor(t *testing.T, stateDir string, args ...string) *proc {
	t.Helper()
	p, err := tryStart(t, stateDir, args...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func tryStart(t *testing.T, stateDir string, args ...string) (*proc, error) {
	t.Helper()
	bin := conductorBinary(t)
	// Port 0: the address is read back from the "conductor listening" log
	// line, so no port is picked here that another process could take
	// before the binary binds it.
	cmd := exec.Command(bin, append([]string{"--addr", "127.0.0.1", "--port", "0", "--state-dir", stateDir, "--log-level", "INFO"}, args...)...)
	cmd.Env = append(os.Environ(), "CONDUCTOR_CONFIG_PATH="+filepath.Join(t.TempDir(), "none.json"))
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{t: t, cmd: cmd, exited: make(chan struct{})}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.log.Write(sc.Bytes())
			p.log.WriteByte('\n')
			p.mu.Unlock()
			var line map[string]any
			if json.Unmarshal(sc.Bytes(), &line) == nil && line["message"] == "conductor listening" {
				addr <- line["addr"].(string)
			}
		}
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.exited
		if t.Failed() {
			t.Logf("conductor log:\n%s", p.logText())
		}
	})
	select {
	case a := <-addr:
		p.base = "http://" + a
		return p, nil
	case <-p.exited:
		return p, fmt.Errorf("conductor exited before listening: %v\n%s", p.err, p.logText())
	case <-time.After(30 * time.Second):
		return p, fmt.Errorf("conductor did not listen within 30 s")
	}
}

func (p *proc) logText() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// stop sends SIGTERM and waits for a clean exit.
func (p *proc) stop() {
	p.t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(15 * time.Second):
		p.t.Fatal("no exit after SIGTERM")
	}
	if p.err != nil {
		p.t.Fatalf("exit after SIGTERM: %v", p.err)
	}
}

func (p *proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

func (p *proc) do(method, path string, body any) (int, any) {
	p.t.Helper()
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(p.base + path)
	req.Header.SetMethod(method)
	req.Header.Set("Accept", "application/msgpack")
	if body != nil {
		b, err := msgpack.Marshal(body)
		if err != nil {
			p.t.Fatal(err)
		}
		req.Header.SetContentType("application/msgpack")
		req.SetBody(b)
	}
	if err := p.c.DoTimeout(req, resp, 10*time.Second); err != nil {
		p.t.Fatalf("%s %s: %v", method, path, err)
	}
	var out any
	if err := msgpack.Unmarshal(resp.Body(), &out); err != nil {
		p.t.Fatalf("%s %s: %v", method, path, err)
	}
	return resp.StatusCode(), out
}

// answers queries every prompt and returns the answers in order.
func (p *proc) answers(prompts [][]int32) []any {
	p.t.Helper()
	out := make([]any, len(prompts))
	for i, tk := range prompts {
		status, a := p.do("POST", "/query", map[string]any{"model": "deepseek", "block_size": 16, "token_ids": tk})
		if status != 200 {
			p.t.Fatalf("query: %d %v", status, a)
		}
		out[i] = a
	}
	return out
}

// tierCount is one tier's count for one instance in a /query answer (-1:
// the instance is not in it).
func tierCount(answer any, instance, tier string) int64 {
	in, ok := answer.(map[string]any)["instances"].(map[string]any)[instance].(map[string]any)
	if !ok {
		return -1
	}
	v, _ := msgpackInt(in[tier])
	return v
}

// device is the device count of one instance in a /query answer.
func device(answer any, instance string) int64 { return tierCount(answer, instance, "device") }

// scrape returns the exposition text of GET /metrics.
func (p *proc) scrape() string {
	p.t.Helper()
	status, body, err := p.c.GetTimeout(nil, p.base+"/metrics", 10*time.Second)
	if err != nil || status != 200 {
		p.t.Fatalf("GET /metrics: %d %v", status, err)
	}
	return string(body)
}

func (p *proc) metric(series string) float64 {
	p.t.Helper()
	return metricValue(p.scrape(), series)
}

// engine is a fake vLLM publisher with a replay ROUTER that keeps its last
// keep batches, like vLLM's own buffer.
type engine struct {
	t        *testing.T
	name     string
	pub      *zmq.Socket
	endpoint string
	replayEP string
	keep     int

	mu      sync.Mutex
	seq     uint64
	history map[uint64][]byte
	stop    chan struct{}
	done    chan struct{}
	gone    sync.Once
}

func newEngine(t *testing.T, name string, keep int) *engine {
	t.Helper()
	pub, err := zmq.NewSocket(zmq.PUB)
	if err != nil {
		t.Fatal(err)
	}
	_ = pub.SetLinger(0)
	_ = pub.SetSndhwm(0)
	if err := pub.Bind("tcp://127.0.0.1:*"); err != nil {
		t.Fatal(err)
	}
	ep, _ := pub.GetLastEndpoint()
	router, err := zmq.NewSocket(zmq.ROUTER)
	if err != nil {
		t.Fatal(err)
	}
	_ = router.SetLinger(0)
	if err := router.Bind("tcp://127.0.0.1:*"); err != nil {
		t.Fatal(err)
	}
	rep, _ := router.GetLastEndpoint()
	e := &engine{t: t, name: name, pub: pub, endpoint: ep, replayEP: rep, keep: keep, history: map[uint64][]byte{},
		stop: make(chan struct{}), done: make(chan struct{})}
	go e.serveReplay(router)
	t.Cleanup(e.die)
	return e
}

// die ends the publisher for good: its PUB and replay sockets close.
func (e *engine) die() {
	e.gone.Do(func() {
		close(e.stop)
		<-e.done
		e.mu.Lock()
		_ = e.pub.Close()
		e.mu.Unlock()
	})
}

func (e *engine) serveReplay(router *zmq.Socket) {
	defer close(e.done)
	defer router.Close()
	poller := zmq.NewPoller()
	poller.Add(router, zmq.POLLIN)
	for {
		select {
		case <-e.stop:
			return
		default:
		}
		polled, err := poller.Poll(10 * time.Millisecond)
		if err != nil || len(polled) == 0 {
			continue
		}
		msg, err := router.RecvMessageBytes(0)
		if err != nil || len(msg) != 3 || len(msg[2]) != 8 {
			continue
		}
		from := binary.BigEndian.Uint64(msg[2])
		e.mu.Lock()
		var seqs []uint64
		for s := range e.history {
			if s >= from {
				seqs = append(seqs, s)
			}
		}
		slices.Sort(seqs)
		for _, s := range seqs {
			_, _ = router.SendMessage(msg[0], "", "kv-events", seqBytes(s), e.history[s])
		}
		e.mu.Unlock()
		_, _ = router.SendMessage(msg[0], "", "", seqBytes(^uint64(0)), "")
	}
}

func seqBytes(s uint64) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, s)
	return b
}

// send publishes one batch with the next sequence number and keeps it for
// replay.
func (e *engine) send(events ...map[string]any) {
	e.t.Helper()
	payload, err := msgpack.Marshal([]any{float64(time.Now().UnixNano()) / 1e9, events, 0})
	if err != nil {
		e.t.Fatal(err)
	}
	e.publish(payload)
}

// publish sends one encoded batch with the engine's next sequence number
// and keeps it for replay.
func (e *engine) publish(payload []byte) {
	e.t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	e.seq++
	e.history[e.seq] = payload
	delete(e.history, e.seq-uint64(e.keep))
	if _, err := e.pub.SendMessage("kv-events", seqBytes(e.seq), payload); err != nil {
		e.t.Error(err)
	}
}

func (e *engine) register(p *proc) {
	e.t.Helper()
	reg := vllmRegistration(e.name, e.endpoint)
	reg["replay_endpoint"] = e.replayEP
	if status, out := p.do("POST", "/register", reg); status != 200 {
		e.t.Fatalf("register %s: %d %v", e.name, status, out)
	}
}

// prompt i of an engine: 4 blocks of its own tokens.
func prompt(engine, i int) []int32 {
	tk := make([]int32, 64)
	for j := range tk {
		tk[j] = int32(engine*1_000_000 + i*100 + j)
	}
	return tk
}

func storedEvent(t *testing.T, tokens []int32) map[string]any {
	return map[string]any{"type": "BlockStored", "block_hashes": vllmKeys(t, tokens), "parent_block_hash": nil,
		"token_ids": tokens, "block_size": 16, "lora_id": nil, "medium": "GPU", "lora_name": nil}
}

func removedEvent(t *testing.T, tokens []int32) map[string]any {
	return map[string]any{"type": "BlockRemoved", "block_hashes": vllmKeys(t, tokens), "medium": "GPU"}
}

// model is the reference: which prompts each engine holds, fed the whole
// stream it published.
type model map[string]map[int]bool

func (m model) expect(instance string, i int) int64 {
	if m[instance][i] {
		return 64
	}
	return 0
}

// probe publishes until the conductor shows the engine's probe prompt: a SUB
// joins asynchronously, and the first message it gets is its baseline.
func probe(t *testing.T, p *proc, e *engine, m model, n int) {
	t.Helper()
	probeAll(t, []*proc{p}, e, m, n)
}

func engineIndex(name string) int {
	n, _ := strconv.Atoi(strings.TrimPrefix(name, "e"))
	return n
}

// checkAll compares every prompt of every engine with the model, waiting
// until they agree (the conductor applies asynchronously); a timeout names
// the last disagreement.
func checkAll(t *testing.T, p *proc, m model, engines []*engine, prompts int, what string) {
	t.Helper()
	mismatch := func() string {
		for _, e := range engines {
			for i := 0; i < prompts; i++ {
				_, a := p.do("POST", "/query", map[string]any{"model": "deepseek", "block_size": 16, "token_ids": prompt(engineIndex(e.name), i), "instance_id": e.name})
				if got, want := device(a, e.name), m.expect(e.name, i); got != want {
					return fmt.Sprintf("%s prompt %d: device %d, want %d", e.name, i, got, want)
				}
			}
		}
		return ""
	}
	var last string
	deadline := time.Now().Add(20 * time.Second)
	for last = mismatch(); last != ""; last = mismatch() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s", what, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A graceful restart answers every query, /services and /global_view
// exactly as before it; the stream then continues in order.
func TestGracefulRestartAnswersIdentically(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	p := startConductor(t, dir, "--snapshot-interval", "0")
	engines := []*engine{newEngine(t, "e1", 1000), newEngine(t, "e2", 1000)}
	m := registerAll(t, p, engines)
	var prompts [][]int32
	for i := 1; i < 30; i++ {
		for _, e := range engines {
			e.send(storedEvent(t, prompt(engineIndex(e.name), i)))
			m[e.name][i] = true
			if i%4 == 0 {
				e.send(removedEvent(t, prompt(engineIndex(e.name), i-2)))
				m[e.name][i-2] = false
			}
		}
	}
	for _, e := range engines {
		for i := 0; i < 30; i++ {
			prompts = append(prompts, prompt(engineIndex(e.name), i))
		}
	}
	checkAll(t, p, m, engines, 30, "before restart")
	before := p.answers(prompts)
	_, svcs := p.do("GET", "/services", nil)
	_, gv := p.do("GET", "/global_view", nil)
	p.stop()

	p2 := startConductor(t, dir, "--snapshot-interval", "0")
	after := p2.answers(prompts)
	if diff := cmp.Diff(before, after); diff != "" {
		t.Errorf("answers after a graceful restart (-before +after):\n%s", diff)
	}
	_, svcs2 := p2.do("GET", "/services", nil)
	_, gv2 := p2.do("GET", "/global_view", nil)
	if diff := cmp.Diff(svcs, svcs2); diff != "" {
		t.Errorf("/services (-before +after):\n%s", diff)
	}
	if diff := cmp.Diff(gv, gv2); diff != "" {
		t.Errorf("/global_view (-before +after):\n%s", diff)
	}
	// Each source confirms itself through its replay endpoint as soon as
	// it subscribes: readiness waits for that, however briefly.
	if status, out := p2.do("GET", "/readyz", nil); status != 200 && (status != 503 || !strings.Contains(fmt.Sprint(out), "catching up")) {
		t.Errorf("/readyz while the sources resume: %d %v", status, out)
	}
	// The streams continue: nothing restored is dropped. (A message sent
	// before the SUB has joined is lost and then recovered by replay, so
	// both in-order and replayed resumes are right; cold is not.)
	eventtest.Eventually(t, "both sources settled", func() bool {
		for _, e := range engines {
			e.send(storedEvent(t, prompt(engineIndex(e.name), 30)))
			m[e.name][30] = true
		}
		status, _ := p2.do("GET", "/readyz", nil)
		return status == 200
	})
	checkAll(t, p2, m, engines, 31, "after the streams continued")
	inOrder := p2.metric(`conductor_restore_sources{outcome="in_order"}`)
	replayed := p2.metric(`conductor_restore_sources{outcome="replay"}`)
	if inOrder+replayed != 2 || p2.metric(`conductor_restore_sources{outcome="cold"}`) != 0 {
		t.Errorf("resumed in order %v, through replay %v; want both kept", inOrder, replayed)
	}
}

// SIGKILL in the middle of ingestion, with queries running; the publishers
// go on meanwhile. After the restart, replay recovers everything: every
// answer equals the reference fed the complete streams.
func TestCrashRecoversThroughReplay(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	p := startConductor(t, dir, "--snapshot-interval", "50ms")
	engines := []*engine{newEngine(t, "e1", 100000), newEngine(t, "e2", 100000)}
	m := registerAll(t, p, engines)
	const prompts = 120
	stopQ := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // queries while ingesting and while the server dies
		defer wg.Done()
		c := fasthttp.Client{}
		body, _ := msgpack.Marshal(map[string]any{"model": "deepseek", "block_size": 16, "token_ids": prompt(1, 1)})
		for {
			select {
			case <-stopQ:
				return
			default:
			}
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			req.SetRequestURI(p.base + "/query")
			req.Header.SetMethod("POST")
			req.Header.SetContentType("application/msgpack")
			req.SetBody(body)
			_ = c.DoTimeout(req, resp, time.Second)
			fasthttp.ReleaseRequest(req)
			fasthttp.ReleaseResponse(resp)
		}
	}()
	publish := func(from, to int) { publishRange(t, engines, m, from, to) }
	registered := float64(time.Now().UnixNano()) / 1e9
	publish(1, 40)
	eventtest.Eventually(t, "a snapshot with both sources", func() bool {
		return p.metric("conductor_snapshot_last_success_timestamp_seconds") > registered
	})
	publish(40, 60)
	p.kill() // mid-ingest: no shutdown snapshot
	close(stopQ)
	wg.Wait()
	publish(60, 100) // while the conductor is down

	p2 := startConductor(t, dir, "--snapshot-interval", "50ms")
	publish(100, prompts) // the first live message reveals the gap
	eventtest.Eventually(t, "both sources settled", func() bool {
		publish(prompts, prompts+1) // in case the SUB joined after the last
		status, _ := p2.do("GET", "/readyz", nil)
		return status == 200
	})
	checkAll(t, p2, m, engines, prompts+1, "after crash and replay")
	if got := p2.metric(`conductor_restore_sources{outcome="replay"}`); got != 2 {
		t.Errorf("sources recovered through replay: %v\n", got)
	}
	if got := p2.metric(`conductor_restore_sources{outcome="cold"}`); got != 0 {
		t.Errorf("cold resumes: %v", got)
	}
}

// registerAll registers engines with p and returns the model of what
// they hold, empty, once each one's source is live.
func registerAll(t *testing.T, p *proc, engines []*engine) model {
	t.Helper()
	m := model{}
	for _, e := range engines {
		e.register(p)
		probe(t, p, e, m, 0)
	}
	return m
}

// storeAll has every engine store its prompts from..to-1, in that order,
// interleaved across engines, and records them in m.
func storeAll(t *testing.T, engines []*engine, m model, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		for _, e := range engines {
			e.send(storedEvent(t, prompt(engineIndex(e.name), i)))
			m[e.name][i] = true
		}
	}
}

// Downtime longer than one publisher's replay buffer: that source resumes
// cold, with no phantom hit from its restored entries and its new events
// indexed; the other source recovers everything.
func TestDowntimeLongerThanReplayBufferResumesCold(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	p := startConductor(t, dir)
	short, long := newEngine(t, "e1", 3), newEngine(t, "e2", 100000)
	engines := []*engine{short, long}
	m := registerAll(t, p, engines)
	storeAll(t, engines, m, 1, 10)
	checkAll(t, p, m, engines, 10, "before the restart")
	p.stop()

	// While down: both remove prompts 1-5 and store 10-19; the short
	// buffer forgets most of it.
	for i := 1; i <= 5; i++ {
		for _, e := range engines {
			e.send(removedEvent(t, prompt(engineIndex(e.name), i)))
			m[e.name][i] = false
		}
	}
	storeAll(t, engines, m, 10, 20)
	p2 := startConductor(t, dir)
	// Until a source's first live message arrives (a SUB joins
	// asynchronously, so the first ones may be lost) it has not learnt of
	// the gap and /readyz says so; publish until both have settled.
	eventtest.Eventually(t, "both sources settled", func() bool {
		for _, e := range engines {
			e.send(storedEvent(t, prompt(engineIndex(e.name), 20)))
			m[e.name][20] = true
		}
		status, _ := p2.do("GET", "/readyz", nil)
		return status == 200
	})
	// The cold source holds exactly what it published since the restart;
	// everything it held before is gone (no phantom hits).
	cold := model{"e1": {20: true}, "e2": m["e2"]}
	checkAll(t, p2, cold, engines, 21, "after the restart")
	if got := p2.metric(`conductor_restore_sources{outcome="cold"}`); got != 1 {
		t.Errorf("cold resumes %v", got)
	}
	if got := p2.metric(`conductor_restore_sources{outcome="replay"}`); got != 1 {
		t.Errorf("replayed %v", got)
	}
	if got := p2.metric("conductor_stale_sources"); got != 0 {
		t.Errorf("stale sources %v", got)
	}
}

// Publishers that never come back: after --catch-up-timeout nothing has
// confirmed their restored entries, so they are dropped (answers 0, never
// the 64 tokens of an engine that is gone), the sources count as lagging
// and stay registered, and /readyz reports ready.
func TestDeadPublishersRestoredEntriesDropAtCatchUpTimeout(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	p := startConductor(t, dir, "--snapshot-interval", "0")
	engines := []*engine{newEngine(t, "e1", 1000), newEngine(t, "e2", 1000)}
	m := registerAll(t, p, engines)
	storeAll(t, engines, m, 1, 5)
	checkAll(t, p, m, engines, 5, "before the restart")
	p.stop()
	for _, e := range engines {
		e.die()
	}

	p2 := startConductor(t, dir, "--snapshot-interval", "0", "--catch-up-timeout", "2s")
	eventtest.Eventually(t, "ready after the catch-up timeout", func() bool {
		status, _ := p2.do("GET", "/readyz", nil)
		return status == 200
	})
	checkAll(t, p2, model{"e1": {}, "e2": {}}, engines, 5, "after the catch-up timeout")
	eventtest.Eventually(t, "both counted lagging", func() bool {
		return p2.metric(`conductor_restore_sources{outcome="lagging"}`) == 2
	})
	if got := p2.metric(`conductor_restore_sources{outcome="restored"}`); got != 2 {
		t.Errorf("restored %v", got)
	}
	for _, o := range []string{"in_order", "replay", "cold", "restarted"} {
		if got := p2.metric(`conductor_restore_sources{outcome="` + o + `"}`); got != 0 {
			t.Errorf("%s %v", o, got)
		}
	}
	if _, svcs := p2.do("GET", "/services", nil); !strings.Contains(fmt.Sprint(svcs), "e1") || !strings.Contains(fmt.Sprint(svcs), "e2") {
		t.Errorf("the sources are no longer registered: %v", svcs)
	}
	if !strings.Contains(p2.logText(), "not confirmed by its publisher by the catch-up timeout") {
		t.Error("no warning names the dropped restored entries")
	}
}

// A second process on the same directory refuses to start, naming the
// directory and the holder's pid.
func TestSecondProcessOnSameStateDirRefused(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	p := startConductor(t, dir)
	_, err := tryStart(t, dir)
	if err == nil {
		t.Fatal("a second conductor started on the same state directory")
	}
	for _, want := range []string{dir, "pid " + strconv.Itoa(p.cmd.Process.Pid)} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not name %q", err, want)
		}
	}
}

// A damaged snapshot: ERROR naming the file, moved aside, empty index,
// registrations restored.
func TestCorruptSnapshotStartsEmptyWithRegistrations(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	p := startConductor(t, dir)
	e := newEngine(t, "e1", 1000)
	m := model{}
	e.register(p)
	probe(t, p, e, m, 0)
	p.stop()
	file := filepath.Join(dir, "index.snapshot")
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)-1] ^= 0xff
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	p2 := startConductor(t, dir)
	if !strings.Contains(p2.logText(), `"level":"error"`) || !strings.Contains(p2.logText(), file) {
		t.Errorf("no ERROR naming %s", file)
	}
	if aside, _ := filepath.Glob(file + ".corrupt-*"); len(aside) != 1 {
		t.Errorf("moved aside: %v", aside)
	}
	_, svcs := p2.do("GET", "/services", nil)
	if n, _ := msgpackInt(svcs.(map[string]any)["count"]); n != 1 {
		t.Errorf("services after a corrupt snapshot: %v", svcs)
	}
	checkAll(t, p2, model{}, []*engine{e}, 1, "empty index")
}

// A recorded registration that conflicts with the config file loses to the
// file, with a warning naming both; one that agrees with it is not a
// conflict.
func TestRecordedRegistrationLosesToConfigFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	decode := func(instance, endpoint string) registry.Service { return decodeService(t, instance, endpoint) }
	d, err := statedir.Open(dir, statedir.Options{})
	if err != nil {
		t.Fatal(err)
	}
	recorded := []registry.Service{decode("a", "tcp://127.0.0.1:1001"), decode("b", "tcp://127.0.0.1:1002")}
	if err := regstore.New(d).Save(recorded); err != nil {
		t.Fatal(err)
	}
	d.Close()
	var log eventtest.LogBuffer
	cfg := &config.Config{Addr: "127.0.0.1", Path: "/etc/conductor.json", StateDir: dir, SnapshotInterval: time.Hour, CatchUpTimeout: time.Second,
		Static: []config.Static{{Name: "file-a", Service: decode("a", "tcp://127.0.0.1:2001")}}}
	a, err := newApp(cfg, zerolog.New(&log))
	if err != nil {
		t.Fatal(err)
	}
	defer a.close()
	got := map[registry.ServiceKey]string{}
	for _, s := range a.reg.Services() {
		got[s.Key()] = s.Endpoint
	}
	want := map[registry.ServiceKey]string{"a|default|0": "tcp://127.0.0.1:2001", "b|default|0": "tcp://127.0.0.1:1002"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("services (-want +got):\n%s", diff)
	}
	var warned bool
	for _, line := range strings.Split(log.String(), "\n") {
		if strings.Contains(line, `"level":"warn"`) && strings.Contains(line, "a|default|0") &&
			strings.Contains(line, "tcp://127.0.0.1:1001") && strings.Contains(line, "/etc/conductor.json") {
			warned = true
		}
	}
	if !warned {
		t.Errorf("no warning naming the recorded registration and the file:\n%s", log.String())
	}
}

// master is a fake Mooncake master publisher (no replay: the master has
// none).
type master struct {
	t        *testing.T
	pub      *zmq.Socket
	endpoint string
	seq      uint64
	id       int
}

// newMaster is a Mooncake master's publisher. It is an XPUB, which hands
// the test every subscription as it arrives (awaitSubscription): a message
// sent before a restarted conductor's SUB has joined would be dropped, and
// the test could not tell a lost message from a resume that went wrong.
func newMaster(t *testing.T) *master {
	t.Helper()
	pub, err := zmq.NewSocket(zmq.XPUB)
	if err != nil {
		t.Fatal(err)
	}
	_ = pub.SetLinger(0)
	// Every subscription, not only a topic's first: a new conductor may
	// subscribe before the stopped one's unsubscription is processed.
	if err := pub.SetXpubVerbose(1); err != nil {
		t.Fatal(err)
	}
	if err := pub.SetRcvtimeo(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := pub.Bind("tcp://127.0.0.1:*"); err != nil {
		t.Fatal(err)
	}
	ep, _ := pub.GetLastEndpoint()
	t.Cleanup(func() { pub.Close() })
	return &master{t: t, pub: pub, endpoint: ep}
}

// objects are the Mooncake object keys of a prompt's blocks, as vLLM's
// store connector names them (the block's full digest last).
func objects(t *testing.T, tokens []int32) []string {
	var out []string
	vllmChain(t, tokens, func(_ uint64, d [32]byte) {
		out = append(out, fmt.Sprintf("dep@deepseek@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@%x", d[:]))
	})
	return out
}

// send publishes one batch of stored or removed events for keys in cpu.
// forgetSubscriptions drops the subscription messages received so far, so
// that awaitSubscription waits for a conductor started after this call.
func (m *master) forgetSubscriptions() {
	for {
		if _, err := m.pub.RecvBytes(zmq.DONTWAIT); err != nil {
			return
		}
	}
}

// awaitSubscription waits for a SUB to subscribe (a frame starting with 1;
// 0 is an unsubscription): messages sent from then on reach it.
func (m *master) awaitSubscription() {
	m.t.Helper()
	for {
		b, err := m.pub.RecvBytes(0)
		if err != nil {
			m.t.Fatalf("no conductor subscribed to the master: %v", err)
		}
		if len(b) > 0 && b[0] == 1 {
			return
		}
	}
}

func (m *master) send(kind string, keys []string) {
	m.t.Helper()
	typ := map[string]string{"stored": "BlockStored", "removed": "BlockRemoved"}[kind]
	var evs []any
	for _, k := range keys {
		m.id++
		evs = append(evs, map[string]any{
			"event_id": m.id, "timestamp": 1789095808500, "event_type": kind, "type": typ, "model_name": "deepseek",
			"block_size": 16, "additional_salt": nil, "lora_name": nil, "tenant_id": "default", "backend_id": "pool",
			"medium": "cpu", "dp_rank": 0, "group_id": nil, "object_key": k, "seq_hashes": []any{}, "block_hashes": []any{},
			"base_block_idx": nil, "parent_hash": nil, "token_ids": nil, "parent_block_hash": nil,
		})
	}
	payload, err := msgpack.Marshal([]any{uint64(1789095808500), evs, 0})
	if err != nil {
		m.t.Fatal(err)
	}
	m.seq++
	if _, err := m.pub.SendMessage("", seqBytes(m.seq), payload); err != nil {
		m.t.Fatal(err)
	}
}

func cpuShare(answer any, instance string) int64 { return tierCount(answer, instance, "cpu_share") }

// A Mooncake source keeps its restored bindings when nothing was missed,
// and resumes cold (no phantom hit, its new events indexed) when its
// stream moved on while the conductor was down: the master has no replay.
func TestMooncakeSourceAcrossRestarts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	p := startConductor(t, dir)
	e := newEngine(t, "e1", 1000)
	m := newMaster(t)
	e.register(p)
	reg := vllmRegistration("master", m.endpoint)
	reg["type"] = "Mooncake"
	if status, out := p.do("POST", "/register", reg); status != 200 {
		t.Fatalf("register master: %d %v", status, out)
	}
	old, fresh := prompt(7, 1), prompt(7, 2)
	query := func(p *proc, tk []int32) int64 {
		_, a := p.do("POST", "/query", map[string]any{"model": "deepseek", "block_size": 16, "token_ids": tk})
		return cpuShare(a, "e1")
	}
	// One message, sent once the conductor has subscribed: when it is
	// visible, everything the master sent has been applied, and the
	// snapshot at stop records exactly that position.
	m.awaitSubscription()
	m.send("stored", objects(t, old))
	eventtest.Eventually(t, "the master's objects indexed", func() bool { return query(p, old) == 64 })
	p.stop()

	// Nothing missed: the bindings come back, and the next message is in
	// order.
	m.forgetSubscriptions()
	p2 := startConductor(t, dir)
	if got := query(p2, old); got != 64 {
		t.Errorf("restored shared tier: cpu_share %d, want 64", got)
	}
	m.awaitSubscription()
	m.send("stored", objects(t, fresh)[:1])
	eventtest.Eventually(t, "master settled", func() bool {
		return p2.metric(`conductor_restore_sources{outcome="in_order"}`)+p2.metric(`conductor_restore_sources{outcome="cold"}`) == 1
	})
	if p2.metric(`conductor_restore_sources{outcome="in_order"}`) != 1 {
		t.Fatal("the master's first message after the restart did not resume the source in order")
	}
	if got := query(p2, old); got != 64 {
		t.Errorf("after resuming in order: cpu_share %d, want 64", got)
	}
	p2.stop()

	// Missed messages (the old objects removed) and no replay: cold.
	m.send("removed", objects(t, old))
	p3 := startConductor(t, dir)
	eventtest.Eventually(t, "master resumed cold", func() bool {
		m.send("stored", objects(t, fresh))
		return p3.metric(`conductor_restore_sources{outcome="cold"}`) == 1
	})
	eventtest.Eventually(t, "new objects indexed", func() bool { return query(p3, fresh) == 64 })
	if got := query(p3, old); got != 0 {
		t.Errorf("phantom hit from the cold source's old bindings: cpu_share %d", got)
	}
	if got := p3.metric("conductor_stale_sources"); got != 0 {
		t.Errorf("stale sources %v", got)
	}
}
