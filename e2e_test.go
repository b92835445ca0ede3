package main

import (
	"encoding/binary"
	"io"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"
	"github.com/vmihailenco/msgpack/v5"
	"go.uber.org/goleak"

	"github.com/mooncake-conductor-go/conductor/codec"
	"github.com/mooncake-conductor-go/conductor/internal/config"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
	"github.com/mooncake-conductor-go/conductor/registry"
)

// These tests run the wired service as main does, with real ZMQ publishers
// on loopback, and talk to it over HTTP only.

type e2e struct {
	t    *testing.T
	app  *app
	base string
	c    fasthttp.Client
	done chan error
}

func startApp(t *testing.T) *e2e {
	t.Helper()
	return startAppWith(t, func(*config.Config) {})
}

// startAppWith starts the app with the defaults Load gives, changed by
// adjust.
func startAppWith(t *testing.T, adjust func(*config.Config)) *e2e {
	t.Helper()
	cfg := config.Defaults()
	cfg.Addr, cfg.Port = "127.0.0.1", 0
	adjust(cfg)
	a, err := newApp(cfg, zerolog.New(io.Discard))
	if err != nil {
		t.Fatal(err)
	}
	e := &e2e{t: t, app: a, base: "http://" + a.ln.Addr().String(), done: make(chan error, 1)}
	go func() { e.done <- a.serve() }()
	t.Cleanup(func() {
		a.close()
		<-e.done
	})
	return e
}

func (e *e2e) post(path string, body any) (int, map[string]any) {
	e.t.Helper()
	b, err := msgpack.Marshal(body)
	if err != nil {
		e.t.Fatal(err)
	}
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(e.base + path)
	req.Header.SetMethod("POST")
	req.Header.SetContentType("application/msgpack")
	req.SetBody(b)
	if err := e.c.DoTimeout(req, resp, 10*time.Second); err != nil {
		e.t.Fatal(err)
	}
	var out map[string]any
	if err := msgpack.Unmarshal(resp.Body(), &out); err != nil {
		e.t.Fatalf("%s: %v", path, err)
	}
	return resp.StatusCode(), out
}

func (e *e2e) get(path string) map[string]any {
	e.t.Helper()
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(e.base + path)
	// A MessagePack client says so: the health routes answer JSON to a
	// client that names neither encoding.
	req.Header.Set("Accept", "application/msgpack")
	err := e.c.DoTimeout(req, resp, 10*time.Second)
	if err != nil || resp.StatusCode() != 200 {
		e.t.Fatalf("GET %s: %d %v", path, resp.StatusCode(), err)
	}
	var out map[string]any
	if err := msgpack.Unmarshal(resp.Body(), &out); err != nil {
		e.t.Fatal(err)
	}
	return out
}

// publisher is a real ZMQ PUB socket speaking the engines' three-frame
// messages.
type publisher struct {
	t        *testing.T
	sock     *zmq.Socket
	endpoint string
	seq      uint64
}

func newPublisher(t *testing.T) *publisher {
	t.Helper()
	s, err := zmq.NewSocket(zmq.PUB)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Bind("tcp://127.0.0.1:*"); err != nil {
		t.Fatal(err)
	}
	ep, err := s.GetLastEndpoint()
	if err != nil {
		t.Fatal(err)
	}
	p := &publisher{t: t, sock: s, endpoint: ep}
	t.Cleanup(func() { s.SetLinger(0); s.Close() })
	return p
}

func (p *publisher) send(dpRank int, events ...map[string]any) {
	p.t.Helper()
	p.sendBatch(dpRank, events)
}

// sendBatch publishes one batch of events (maps, or arrays for the older
// dialect) with the next sequence number.
func (p *publisher) sendBatch(dpRank int, events any) {
	p.t.Helper()
	payload, err := msgpack.Marshal([]any{float64(time.Now().UnixNano()) / 1e9, events, dpRank})
	if err != nil {
		p.t.Fatal(err)
	}
	p.seq++
	var seq [8]byte
	binary.BigEndian.PutUint64(seq[:], p.seq)
	if _, err := p.sock.SendMessage([]byte("kv"), seq[:], payload); err != nil {
		p.t.Fatal(err)
	}
}

// vllmChain walks a prompt's blocks as the e2e engines hash them (vllm_v1,
// sha256_cbor, seed "0", block size 16), calling each with the block's key
// and full digest.
func vllmChain(t *testing.T, tokens []int32, each func(key uint64, digest [32]byte)) {
	t.Helper()
	prof := eventtest.VLLMProfile(t)
	ch := hashing.AcquireChain()
	defer hashing.ReleaseChain(ch)
	ch.Reset(&prof, 16, tokens, "", "")
	for {
		k, _, ok := ch.Next()
		if !ok {
			return
		}
		each(k, ch.Digest())
	}
}

// vllmKeys are the block keys of a prompt.
func vllmKeys(t *testing.T, tokens []int32) []uint64 {
	t.Helper()
	var keys []uint64
	vllmChain(t, tokens, func(k uint64, _ [32]byte) { keys = append(keys, k) })
	return keys
}

func vllmRegistration(instance, endpoint string) map[string]any {
	return map[string]any{
		"endpoint": endpoint, "type": "vLLM", "modelname": "deepseek", "instance_id": instance,
		"block_size": 16, "dp_rank": 0,
		"hash_profile": map[string]any{"strategy": "vllm_v1", "algorithm": "sha256_cbor", "python_hash_seed": "0", "index_projection": "low64_be"},
	}
}

func (e *e2e) deviceHits(instance string, tokens []int32) int64 {
	e.t.Helper()
	status, out := e.post("/query", map[string]any{"model": "deepseek", "block_size": 16, "token_ids": tokens, "instance_id": instance})
	if status != 200 {
		e.t.Fatalf("query: %d %v", status, out)
	}
	insts := out["instances"].(map[string]any)
	in, ok := insts[instance].(map[string]any)
	if !ok {
		e.t.Fatalf("instance %s missing from %v", instance, out)
	}
	v, _ := msgpackInt(in["device"])
	return v
}

func msgpackInt(v any) (int64, bool) {
	switch n := v.(type) {
	case int8:
		return int64(n), true
	case int16:
		return int64(n), true
	case int32:
		return int64(n), true
	case int64:
		return n, true
	case uint8:
		return int64(n), true
	case uint16:
		return int64(n), true
	case uint32:
		return int64(n), true
	case uint64:
		return int64(n), true
	}
	return 0, false
}

// fasthttpGlobals are fasthttp's process-wide housekeeping goroutines (the
// Date header ticker, the test client's cleaners, and the worker pool's
// cleaner, which exits on its next 10 s tick after Shutdown). They are not
// ours to stop; everything else must be gone after unregistration and
// shutdown.
var fasthttpGlobals = []goleak.Option{
	goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
	goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
	goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*Client).mCleaner"),
	goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*HostClient).connsCleaner"),
	goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*TCPDialer).tcpAddrsClean"),
}

func TestEndToEndVLLM(t *testing.T) {
	// Registered first, so it runs after the app's own cleanup.
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		goleak.VerifyNone(t, append([]goleak.Option{ignore}, fasthttpGlobals...)...)
	})
	e := startApp(t)
	pub := newPublisher(t)
	if status, out := e.post("/register", vllmRegistration("p0", pub.endpoint)); status != 200 {
		t.Fatalf("register: %d %v", status, out)
	}
	tokens := make([]int32, 40)
	for i := range tokens {
		tokens[i] = int32(1000 + i)
	}
	keys := vllmKeys(t, tokens)
	if len(keys) != 2 {
		t.Fatalf("%d keys", len(keys))
	}
	stored := map[string]any{"type": "BlockStored", "block_hashes": keys, "parent_block_hash": nil, "token_ids": tokens[:32],
		"block_size": 16, "lora_id": nil, "medium": "GPU", "lora_name": nil}

	// Until the subscription is up, published messages are lost; the
	// first one that arrives is the sequence baseline.
	eventtest.Eventually(t, "BlockStored to reach /query", func() bool {
		pub.send(0, stored)
		return e.deviceHits("p0", tokens) == 32
	})

	pub.send(0, map[string]any{"type": "BlockRemoved", "block_hashes": keys[1:], "medium": "GPU"})
	eventtest.Eventually(t, "BlockRemoved", func() bool { return e.deviceHits("p0", tokens) == 16 })

	pub.send(0, map[string]any{"type": "AllBlocksCleared"})
	eventtest.Eventually(t, "AllBlocksCleared", func() bool { return e.deviceHits("p0", tokens) == 0 })

	// A gap without a replay endpoint makes the source stale: entries are
	// retracted and later messages ignored, while the service stays listed.
	pub.send(0, stored)
	eventtest.Eventually(t, "re-store", func() bool { return e.deviceHits("p0", tokens) == 32 })
	pub.seq += 5
	pub.send(0, stored)
	eventtest.Eventually(t, "stale retraction", func() bool { return e.deviceHits("p0", tokens) == 0 })
	// The next message must be received and dropped as stale, the
	// counter's increment being the sign it was handled, and change
	// nothing. Under --stale-recovery auto (the default) a message that
	// arrives after the 2 s hold-off is a new baseline instead; should a
	// busy machine delay it that long, the source is made stale again and
	// the step repeated.
	const droppedStale = `conductor_messages_dropped_total{reason="stale",source_type="vLLM"}`
	const recovered = `conductor_stale_recoveries_total{service="p0|default|0",type="vLLM"}`
	for attempt := 1; ; attempt++ {
		text := e.scrape()
		dropped, recoveries := metricValue(text, droppedStale), metricValue(text, recovered)
		if dropped < 0 || recoveries < 0 {
			t.Fatalf("no %s or %s series", droppedStale, recovered)
		}
		pub.send(0, stored)
		var nowDropped, nowRecovered float64
		eventtest.Eventually(t, "the stale source to handle the message", func() bool {
			text := e.scrape()
			nowDropped, nowRecovered = metricValue(text, droppedStale), metricValue(text, recovered)
			return nowDropped > dropped || nowRecovered > recoveries
		})
		if nowDropped > dropped {
			if got := e.deviceHits("p0", tokens); got != 0 {
				t.Errorf("stale source applied a later message: device=%d", got)
			}
			break
		}
		if attempt == 5 {
			t.Fatalf("%d messages to the stale source arrived after its hold-off", attempt)
		}
		eventtest.Eventually(t, "the recovered baseline", func() bool { return e.deviceHits("p0", tokens) == 32 })
		pub.seq += 5
		pub.send(0, stored)
		eventtest.Eventually(t, "stale retraction", func() bool { return e.deviceHits("p0", tokens) == 0 })
	}
	if svcs := e.get("/services"); svcs["count"] != int8(1) {
		t.Errorf("stale service not listed: %v", svcs)
	}

	// An identical registration restarts a stale source.
	if status, out := e.post("/register", vllmRegistration("p0", pub.endpoint)); status != 200 {
		t.Fatalf("re-register: %d %v", status, out)
	}
	eventtest.Eventually(t, "restarted source", func() bool {
		pub.send(0, stored)
		return e.deviceHits("p0", tokens) == 32
	})

	if status, out := e.post("/unregister", map[string]any{"instance_id": "p0", "dp_rank": 0}); status != 200 {
		t.Fatalf("unregister: %d %v", status, out)
	}
	if gv := e.get("/global_view"); gv["context_count"] != int8(0) {
		t.Errorf("global_view after unregister: %v", gv)
	}
}

func TestDefaultRunAnswersServices(t *testing.T) {
	e := startApp(t)
	got := e.get("/services")
	if len(got) != 2 || got["count"] != int8(0) || len(got["services"].([]any)) != 0 {
		t.Errorf("GET /services = %v, want {count: 0, services: []}", got)
	}
}

func (e *e2e) scrape() string {
	e.t.Helper()
	status, body, err := e.c.GetTimeout(nil, e.base+"/metrics", 10*time.Second)
	if err != nil || status != 200 {
		e.t.Fatalf("GET /metrics: %d %v", status, err)
	}
	return string(body)
}

// metricValue returns the value of the sample whose line starts with
// series (name and labels exactly as exposed), or -1.
func metricValue(text, series string) float64 {
	for _, line := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			v, err := strconv.ParseFloat(rest, 64)
			if err == nil {
				return v
			}
		}
	}
	return -1
}

// metricSum adds up every series whose line starts with prefix (a family
// name and the opening brace selects all its label sets).
func metricSum(text, prefix string) float64 {
	var sum float64
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		if i := strings.LastIndexByte(line, ' '); i > 0 {
			if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
				sum += v
			}
		}
	}
	return sum
}

func TestMetricsMove(t *testing.T) {
	e := startApp(t)
	before := e.scrape()
	for _, name := range []string{"conductor_contexts", "conductor_stale_sources", "go_goroutines", "process_resident_memory_bytes"} {
		if metricValue(before, name) < 0 {
			t.Errorf("%s missing from the first scrape", name)
		}
	}
	pub := newPublisher(t)
	if status, out := e.post("/register", vllmRegistration("m0", pub.endpoint)); status != 200 {
		t.Fatalf("register: %d %v", status, out)
	}
	tokens := make([]int32, 32)
	for i := range tokens {
		tokens[i] = int32(7 + i)
	}
	keys := vllmKeys(t, tokens)
	eventtest.Eventually(t, "BlockStored", func() bool {
		pub.send(0, map[string]any{"type": "BlockStored", "block_hashes": keys, "parent_block_hash": nil, "token_ids": tokens,
			"block_size": 16, "lora_id": nil, "medium": "gpu", "lora_name": nil})
		return e.deviceHits("m0", tokens) == 32
	})
	pub.send(0, map[string]any{"type": "BlockStored", "block_hashes": []any{"not a hash"}, "parent_block_hash": nil, "token_ids": nil,
		"block_size": 16, "lora_id": nil, "medium": "gpu", "lora_name": nil})
	// Every family's series exist from start-up at zero, so wait for the
	// malformed message itself to be rejected. The loop above may have
	// sent BlockStored more than once; the subscriber takes one source's
	// messages in order, so once the malformed one (sent last) is
	// rejected, every copy before it has been applied and the index stands
	// still for the memo checks below.
	eventtest.Eventually(t, "rejection counted", func() bool {
		return metricSum(e.scrape(), "conductor_events_rejected_total{") >= 1
	})
	// Two more queries of the stored prompt: they reuse both digests
	// (checked below) instead of hashing them.
	for i := 0; i < 2; i++ {
		if got := e.deviceHits("m0", tokens); got != 32 {
			t.Fatalf("device %d", got)
		}
	}
	after := e.scrape()
	checks := []struct {
		series string
		min    float64
	}{
		{`conductor_http_requests_total{endpoint="/register",status="200"}`, 1},
		{`conductor_http_requests_total{endpoint="/query",status="200"}`, 1},
		{`conductor_query_duration_seconds_count`, 1},
		{`conductor_contexts`, 1},
		{`conductor_index_blocks{block_size="16",lora="",model="deepseek",tenant="default",tier="device"}`, 2},
		{`conductor_events_applied_total{reason="",source_type="vLLM"}`, 1},
		{`conductor_messages_received_total{reason="",source_type="vLLM"}`, 2},
		{`conductor_subscriber_state{service="m0|default|0",state="live",type="vLLM"}`, 1},
		{`conductor_services{type="vLLM"}`, 1},
	}
	for _, c := range checks {
		if got := metricValue(after, c.series); got < c.min {
			t.Errorf("%s = %v, want >= %v", c.series, got, c.min)
		}
	}
	// The same prompt was queried more than once, so later queries took
	// its two digests without hashing: from the prefix memo when a query
	// ran before the event arrived and taught it, else from the verified
	// links the event recorded (a chain links serve is not taught to the
	// memo), so the two count together.
	reused := metricValue(after, `conductor_hash_memo_lookups_total{result="hit"}`) + metricValue(after, `conductor_link_memo_hits_total`)
	if reused < 2 {
		t.Errorf("digests reused from the memo or the links: %v, want >= 2", reused)
	}
	if got := metricValue(after, `conductor_hash_memo_bytes`) + metricValue(after, `conductor_link_memo_bytes`); got <= 0 {
		t.Errorf("conductor_hash_memo_bytes + conductor_link_memo_bytes = %v with digests remembered", got)
	}
	if metricValue(before, `conductor_http_requests_total{endpoint="/query",status="200"}`) >= 0 {
		t.Error("query counter existed before any query")
	}
	// A prompt long enough for the token memo (256 ids or more), sent
	// twice: the second copies its ids instead of decoding them.
	long := append(append([]int32(nil), tokens...), make([]int32, 480)...)
	for i := 0; i < 2; i++ {
		if got := e.deviceHits("m0", long); got != 32 {
			t.Fatalf("long prompt: device %d", got)
		}
	}
	after = e.scrape()
	if got := metricValue(after, `conductor_token_memo_tokens_total{result="hit"}`); got < float64(len(long)) {
		t.Errorf("token memo hits %v after a repeated %d-token prompt", got, len(long))
	}
	// The last context going empties the memos, so their budgets do not
	// stay resident in an idle service.
	for _, m := range []string{"conductor_token_memo_bytes"} {
		if got := metricValue(after, m); got <= 0 {
			t.Errorf("%s = %v with entries remembered", m, got)
		}
	}
	memories := []string{"conductor_hash_memo_bytes", "conductor_link_memo_bytes", "conductor_token_memo_bytes"}
	if status, out := e.post("/unregister", map[string]any{"instance_id": "m0", "tenant_id": "default", "dp_rank": 0}); status != 200 {
		t.Fatalf("unregister: %d %v", status, out)
	}
	idle := e.scrape()
	for _, m := range memories {
		if got := metricValue(idle, m); got != 0 {
			t.Errorf("%s = %v after the last context went, want 0", m, got)
		}
	}
}

func TestHealthAndReadiness(t *testing.T) {
	e := startApp(t)
	if got := e.get("/healthz"); got["status"] != "ok" {
		t.Errorf("/healthz = %v", got)
	}
	if got := e.get("/readyz"); got["status"] != "ready" || got["stale_sources"] != int8(0) {
		t.Errorf("/readyz = %v", got)
	}
}

// rawQuery posts one /query and returns the status or the transport error.
func (e *e2e) rawQuery(tokens []int32) (int, error) {
	b, err := msgpack.Marshal(map[string]any{"model": "deepseek", "block_size": 16, "token_ids": tokens})
	if err != nil {
		return 0, err
	}
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(e.base + "/query")
	req.Header.SetMethod("POST")
	req.Header.SetContentType("application/msgpack")
	req.SetBody(b)
	if err := e.c.DoTimeout(req, resp, 5*time.Second); err != nil {
		return 0, err
	}
	return resp.StatusCode(), nil
}

// TestReadinessFollowsStaticRegistrations: /readyz is 503 while a static
// registration's publisher is not up, and 200 once its SUB has connected.
func TestReadinessFollowsStaticRegistrations(t *testing.T) {
	ep := "ipc://" + t.TempDir() + "/pub.sock"
	svc := decodeService(t, "static-0", ep)
	cfg := &config.Config{Addr: "127.0.0.1", Port: 0, Static: []config.Static{{Name: "static-0", Service: svc}}}
	a, err := newApp(cfg, zerolog.New(io.Discard))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.serve() }()
	t.Cleanup(func() { a.close(); <-done })
	ex := &e2e{t: t, app: a, base: "http://" + a.ln.Addr().String()}

	readyz := func() int {
		status, _, err := ex.c.GetTimeout(nil, ex.base+"/readyz", 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return status
	}
	if got := readyz(); got != 503 {
		t.Fatalf("/readyz before the publisher exists: %d, want 503", got)
	}
	pub, err := zmq.NewSocket(zmq.PUB)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	_ = pub.SetLinger(0)
	if err := pub.Bind(ep); err != nil {
		t.Fatal(err)
	}
	eventtest.Eventually(t, "readiness after the publisher binds", func() bool { return readyz() == 200 })
}

// TestNewAppFailureLeavesNothingRunning: when a listener's address is
// taken after a static registration has started its subscriber, newApp
// fails with the listen error and stops everything it started: the
// subscriber, the index's reaper, the memory return the dropped context
// requested, the listeners opened before, and the state directory's lock
// (a second start on it succeeds).
func TestNewAppFailureLeavesNothingRunning(t *testing.T) {
	for _, tc := range []struct {
		name string
		take func(cfg *config.Config, taken string)
		want string
	}{
		{"HTTP port", func(cfg *config.Config, taken string) {
			_, port, _ := net.SplitHostPort(taken)
			cfg.Port, _ = strconv.Atoi(port)
		}, "listen on"},
		{"gRPC address", func(cfg *config.Config, taken string) { cfg.GRPCAddr = taken }, "listen on"},
		{"pprof address", func(cfg *config.Config, taken string) { cfg.PprofAddr = taken }, "address already in use"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ignore := goleak.IgnoreCurrent()
			taken, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer taken.Close()
			svc := decodeService(t, "static-0", "ipc://"+t.TempDir()+"/pub.sock")
			cfg := config.Defaults()
			cfg.Addr, cfg.Port, cfg.StateDir = "127.0.0.1", 0, filepath.Join(t.TempDir(), "state")
			cfg.Static = []config.Static{{Name: "static-0", Service: svc}}
			tc.take(cfg, taken.Addr().String())
			if a, err := newApp(cfg, zerolog.New(io.Discard)); err == nil {
				a.close()
				t.Fatal("newApp listened on a taken address")
			} else if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("newApp: %v, want %q", err, tc.want)
			}
			goleak.VerifyNone(t, append(fasthttpGlobals, ignore)...)
			cfg.Port, cfg.GRPCAddr, cfg.PprofAddr = 0, "", ""
			a, err := newApp(cfg, zerolog.New(io.Discard))
			if err != nil {
				t.Fatalf("a start on the same state directory after the failure: %v", err)
			}
			a.close()
		})
	}
}

// decodeService is a vLLM registration of instance at endpoint as the config
// file's would be: through the /register decoder and the registration rules.
func decodeService(t *testing.T, instance, endpoint string) registry.Service {
	t.Helper()
	body, err := msgpack.Marshal(vllmRegistration(instance, endpoint))
	if err != nil {
		t.Fatal(err)
	}
	reg, e := codec.DecodeRegister(body, codec.DefaultLimits())
	if e != nil {
		t.Fatal(e)
	}
	svc, err := registry.NewService(reg)
	if err != nil {
		t.Fatal(err)
	}
	return svc
}
