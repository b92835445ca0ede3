package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/racebuild"
)

func smallCorpus(t *testing.T, replicas int) *corpus {
	t.Helper()
	c, err := newCorpus(corpusConfig{
		Publishers: 3, BlockSize: 4, PromptTokens: 32, SystemTokens: 8, Groups: 2,
		Blocks: 120, Replicas: replicas, Queries: 400, Mix: mix{Full: 1, Partial: 1, System: 1, Cold: 1},
		Vocab: 50, Seed: 7,
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// bruteExpect is the definition the trie must agree with: for each
// publisher, the longest common whole-block prefix between the query and
// any prompt it stores.
func bruteExpect(c *corpus, q []int32) []int {
	bs := c.cfg.BlockSize
	out := make([]int, c.cfg.Publishers)
	for _, p := range c.prompts {
		n := 0
		for n+bs <= len(q) && n+bs <= len(p.tokens) && equal(q[n:n+bs], p.tokens[n:n+bs]) {
			n += bs
		}
		for _, h := range p.holders {
			out[h] = max(out[h], n)
		}
	}
	return out
}

func equal(a, b []int32) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return len(a) == len(b)
}

func TestCorpusExpectations(t *testing.T) {
	for _, replicas := range []int{1, 2} {
		c := smallCorpus(t, replicas)
		if c.published < 120 {
			t.Fatalf("published %d blocks, want at least 120", c.published)
		}
		for k := range numKinds {
			if c.kinds[k] == 0 {
				t.Fatalf("no %s queries in the pool", k)
			}
		}
		for i, q := range c.queries {
			want := bruteExpect(c, q.tokens)
			for p := range want {
				if q.expect[p] != want[p] {
					t.Fatalf("replicas %d, query %d (%s): publisher %d expects %d, brute force says %d", replicas, i, q.kind, p, q.expect[p], want[p])
				}
			}
			best := 0
			for _, e := range q.expect {
				best = max(best, e)
			}
			switch q.kind {
			case kindFull:
				if best != 32 {
					t.Errorf("full query %d: best match %d, want the whole prompt", i, best)
				}
			case kindPartial:
				// With a 50-token vocabulary a fresh block may, rarely,
				// extend the match; it can never reach the whole prompt
				// unless it rebuilt a stored one.
				if best < 4 {
					t.Errorf("partial query %d: best match %d, want at least one block", i, best)
				}
			case kindSystem:
				if best < 8 {
					t.Errorf("system query %d: best match %d, want at least the system prompt", i, best)
				}
			case kindCold:
				// Cold tokens are fresh; only a chance collision of the
				// first block with a system prompt could match.
			}
		}
	}
}

// TestCorpusLargeVocabulary checks exact structure where chance collisions
// are out of the question: full prompts match their holders entirely and
// their group peers on the system prompt only, cold prompts match nothing.
func TestCorpusLargeVocabulary(t *testing.T) {
	c, err := newCorpus(corpusConfig{
		Publishers: 4, BlockSize: 16, PromptTokens: 256, SystemTokens: 64, Groups: 3,
		Blocks: 2000, Replicas: 1, Queries: 300, Mix: mix{Full: 1, Partial: 1, System: 1, Cold: 1},
		Vocab: 151936, Seed: 3,
	})
	if err != nil {
		t.Fatal(err)
	}
	holdsGroup := func(pub, g int) bool {
		for _, pl := range c.perPub[pub] {
			if c.prompts[pl.prompt].group == g {
				return true
			}
		}
		return false
	}
	for i, q := range c.queries {
		switch q.kind {
		case kindCold:
			for p, e := range q.expect {
				if e != 0 {
					t.Errorf("cold query %d: publisher %d expects %d", i, p, e)
				}
			}
		case kindFull:
			var src *prompt
			for j := range c.prompts {
				if &c.prompts[j].tokens[0] == &q.tokens[0] {
					src = &c.prompts[j]
				}
			}
			if src == nil {
				t.Fatalf("full query %d is not a stored prompt", i)
			}
			for p, e := range q.expect {
				want := 0
				switch {
				case containsInt(src.holders, p):
					want = 256
				case holdsGroup(p, src.group):
					want = 64
				}
				if e != want {
					t.Errorf("full query %d: publisher %d expects %d, want %d", i, p, e, want)
				}
			}
		}
	}
	// Each publisher announces a group's system prompt once: later prompts
	// of the same group start at the first suffix block.
	for p, pls := range c.perPub {
		seen := map[int]bool{}
		for _, pl := range pls {
			g := c.prompts[pl.prompt].group
			want := 0
			if seen[g] {
				want = 4
			}
			if pl.firstNew != want {
				t.Errorf("publisher %d, prompt %d: first new block %d, want %d", p, pl.prompt, pl.firstNew, want)
			}
			seen[g] = true
		}
	}
}

func TestPercentile(t *testing.T) {
	var s []time.Duration
	for i := 1; i <= 1000; i++ {
		s = append(s, time.Duration(i)*time.Millisecond)
	}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{0.5, 500}, {0.99, 990}, {0.999, 999}, {1, 1000}, {0, 1}} {
		if got := percentile(s, c.p); got != c.want*time.Millisecond {
			t.Errorf("p%v = %v, want %vms", c.p, got, int(c.want))
		}
	}
	if got := percentile([]time.Duration{7}, 0.999); got != 7 {
		t.Errorf("single sample: %v", got)
	}
	if got := percentile(nil, 0.5); got != 0 {
		t.Errorf("no samples: %v", got)
	}
	// Nearest rank over 10 samples: p99 and p999 are the maximum.
	ten := []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	if percentile(ten, 0.99) != 10 || percentile(ten, 0.5) != 5 {
		t.Errorf("ten samples: p50 %v p99 %v", percentile(ten, 0.5), percentile(ten, 0.99))
	}
}

// TestProcessClock: another process's CPU-time clock is read to the
// nanosecond, moves with the work it does, and agrees with its ticks in
// /proc/<pid>/stat.
func TestProcessClock(t *testing.T) {
	cmd := exec.Command("sh", "-c", "while :; do :; done")
	if err := cmd.Start(); err != nil {
		t.Skipf("no sh: %v", err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	pid := cmd.Process.Pid
	var prev time.Duration
	for prev < 50*time.Millisecond { // until it has done some work
		d, err := processClock(pid)
		if err != nil {
			t.Fatalf("processClock: %v", err)
		}
		if d < prev {
			t.Fatalf("clock went back: %v after %v", d, prev)
		}
		prev = d
		runtime.Gosched()
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	after, err := processClock(pid)
	if err != nil {
		t.Fatal(err)
	}
	ticks, err := parseStatCPU(b)
	if err != nil {
		t.Fatal(err)
	}
	if ticks < prev-20*time.Millisecond || ticks > after+20*time.Millisecond {
		t.Errorf("stat ticks %v outside the clock's %v..%v by more than two ticks", ticks, prev, after)
	}
}

// TestThreadCPU: the thread clock moves with the calling thread's own
// work and stays well behind the wall clock while the thread sleeps.
func TestThreadCPU(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	start := threadCPU()
	if start < 0 {
		t.Fatal("threadCPU unknown")
	}
	x := uint64(1)
	for threadCPU()-start < 20*time.Millisecond { // until it has done some work
		for i := 0; i < 1000; i++ {
			x = x*6364136223846793005 + 1
		}
	}
	_ = x
	before := threadCPU()
	wall := time.Now()
	time.Sleep(100 * time.Millisecond)
	slept, asleep := time.Since(wall), threadCPU()-before
	if asleep < 0 || asleep > slept/2 {
		t.Errorf("thread clock moved %v while the thread slept %v", asleep, slept)
	}
}

func TestProcParsing(t *testing.T) {
	stat := "4242 (odd) name) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 130 0 0 20 0 9 0 100 0 0\n"
	cpu, err := parseStatCPU([]byte(stat))
	if err != nil || cpu != 3800*time.Millisecond {
		t.Errorf("parseStatCPU = %v, %v; want 3.8s", cpu, err)
	}
	if _, err := parseStatCPU([]byte("4242 (x) S 1")); err == nil {
		t.Error("short stat accepted")
	}
	// minflt is field 10 (1000 here), stime field 15 (130 ticks).
	if f, err := parseStatFaults([]byte(stat)); err != nil || f != (statFaults{minor: 1000, system: 1300 * time.Millisecond}) {
		t.Errorf("parseStatFaults = %+v, %v; want 1000 faults, 1.3s", f, err)
	}
	if _, err := parseStatFaults([]byte("4242 (x) S 1")); err == nil {
		t.Error("short stat accepted for faults")
	}
	status := "Name:\tconductor\nVmPeak:\t  9000 kB\nVmRSS:\t   12345 kB\nRssAnon:\t    4321 kB\nThreads:\t9\n"
	rss, err := parseStatusKB([]byte(status), "VmRSS:")
	if err != nil || rss != 12345*1024 {
		t.Errorf("parseStatusKB(VmRSS) = %v, %v", rss, err)
	}
	anon, err := parseStatusKB([]byte(status), "RssAnon:")
	if err != nil || anon != 4321*1024 {
		t.Errorf("parseStatusKB(RssAnon) = %v, %v", anon, err)
	}
	if _, err := parseStatusKB([]byte(status), "RssFile:"); err == nil {
		t.Error("missing RssFile line not reported")
	}
	if _, err := parseStatusKB([]byte("RssAnon:\t12 MB\n"), "RssAnon:"); err == nil {
		t.Error("odd unit accepted")
	}
	if got, err := procAnonRSS(os.Getpid()); err != nil || got <= 0 {
		t.Errorf("procAnonRSS(self) = %v, %v", got, err)
	}
	// The peak is at least what is resident now.
	rss, err1 := procRSS(os.Getpid())
	peak, err2 := procPeakRSS(os.Getpid())
	if err1 != nil || err2 != nil || peak < rss {
		t.Errorf("procPeakRSS(self) = %v, %v; VmRSS %v, %v", peak, err2, rss, err1)
	}
}

func TestCheckAnswer(t *testing.T) {
	ids := []string{"a", "b"}
	expect := []int{32, 0}
	hits := func(n int64) instanceHits {
		return instanceHits{LongestMatched: n, Device: n, CPULocal: n, CPUShare: n, Disk: n,
			DP: map[string]int64{"0": n}, RankMatches: map[string]tiers{"0": {n, n, n, n}}}
	}
	all := func(presence) func(int) presence { return func(int) presence { return mustMatch } }
	good := &queryResponse{Instances: map[string]instanceHits{"a": hits(32), "b": hits(0)}}
	if err := checkAnswer(good, expect, ids, all(mustMatch)); err != nil {
		t.Errorf("exact answer rejected: %v", err)
	}
	bad := &queryResponse{Instances: map[string]instanceHits{"a": hits(16), "b": hits(0)}}
	if err := checkAnswer(bad, expect, ids, all(mustMatch)); err == nil {
		t.Error("short match accepted")
	}
	dev := hits(32)
	dev.Device = 16
	if err := checkAnswer(&queryResponse{Instances: map[string]instanceHits{"a": dev, "b": hits(0)}}, expect, ids, all(mustMatch)); err == nil {
		t.Error("wrong device count accepted")
	}
	extra := &queryResponse{Instances: map[string]instanceHits{"a": hits(32), "b": hits(0), "c": hits(0)}}
	if err := checkAnswer(extra, expect, ids, all(mustMatch)); err == nil {
		t.Error("unknown instance accepted")
	}
	if err := checkAnswer(&queryResponse{Instances: map[string]instanceHits{"b": hits(0)}}, expect, ids, all(mustMatch)); err == nil {
		t.Error("missing instance accepted")
	}
	// During unregistration of a: absent is fine, a shorter consistent
	// prefix is fine, a longer one is not; once gone it must stay gone.
	vanishing := func(i int) presence { return []presence{mayVanish, mustMatch}[i] }
	gone := func(i int) presence { return []presence{mustBeGone, mustMatch}[i] }
	if err := checkAnswer(&queryResponse{Instances: map[string]instanceHits{"b": hits(0)}}, expect, ids, vanishing); err != nil {
		t.Errorf("vanished instance rejected: %v", err)
	}
	if err := checkAnswer(bad, expect, ids, vanishing); err != nil {
		t.Errorf("partially removed instance rejected: %v", err)
	}
	if err := checkAnswer(&queryResponse{Instances: map[string]instanceHits{"a": hits(48), "b": hits(0)}}, expect, ids, vanishing); err == nil {
		t.Error("longer match during removal accepted")
	}
	if err := checkAnswer(good, expect, ids, gone); err == nil {
		t.Error("unregistered instance accepted")
	}
	if presenceBetween(mustMatch, mayVanish) != mayVanish || presenceBetween(mustMatch, mustMatch) != mustMatch ||
		presenceBetween(mustBeGone, mustBeGone) != mustBeGone || presenceBetween(mayVanish, mustBeGone) != mayVanish {
		t.Error("presenceBetween")
	}
}

// TestStoredPayloadShape decodes what a publisher sends with an
// independent reader: [float ts, [event map], 0] with the vLLM keys, and
// SGLang hashes as signed integers.
func TestStoredPayloadShape(t *testing.T) {
	e := newEncoder()
	parent := uint64(1 << 63)
	b, err := e.storedPayload(engineVLLM, 4, []uint64{1<<63 + 5, 7}, &parent, []int32{1, 2, 3, 4, 5, 6, 7, 8})
	if err != nil {
		t.Fatal(err)
	}
	var env []any
	if err := msgpack.Unmarshal(b, &env); err != nil {
		t.Fatal(err)
	}
	if len(env) != 3 {
		t.Fatalf("envelope has %d elements", len(env))
	}
	if _, ok := env[0].(float64); !ok {
		t.Errorf("timestamp %T", env[0])
	}
	evs := env[1].([]any)
	ev := evs[0].(map[string]any)
	for _, k := range []string{"type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"} {
		if _, ok := ev[k]; !ok {
			t.Errorf("vLLM event lacks %s", k)
		}
	}
	if ev["type"] != "BlockStored" || ev["medium"] != "GPU" || ev["parent_block_hash"] != uint64(1<<63) {
		t.Errorf("vLLM event %v", ev)
	}
	b, err = e.storedPayload(engineSGLang, 4, []uint64{1<<63 + 5}, nil, []int32{1, 2, 3, 4})
	if err != nil {
		t.Fatal(err)
	}
	env = nil
	if err := msgpack.Unmarshal(b, &env); err != nil {
		t.Fatal(err)
	}
	ev = env[1].([]any)[0].(map[string]any)
	if h := ev["block_hashes"].([]any)[0]; h != int64(-1<<63+5) {
		t.Errorf("SGLang hash %v (%T)", h, h)
	}
	if _, ok := ev["lora_name"]; ok {
		t.Error("SGLang event carries lora_name")
	}
}

func TestParseMix(t *testing.T) {
	m, err := parseMix("full=4, cold=1")
	if err != nil || m != (mix{Full: 4, Cold: 1}) {
		t.Errorf("parseMix = %+v, %v", m, err)
	}
	for _, bad := range []string{"full", "warm=1", "full=-1", "full=0,cold=0"} {
		if _, err := parseMix(bad); err == nil {
			t.Errorf("parseMix(%q) accepted", bad)
		}
	}
}

func TestNewAPILoopbackOnly(t *testing.T) {
	for _, ok := range []string{"http://127.0.0.1:13333", "http://localhost:1", "http://[::1]:8080"} {
		if _, err := newAPI(ok, "", 1); err != nil {
			t.Errorf("%s rejected: %v", ok, err)
		}
	}
	for _, bad := range []string{"http://10.0.0.1:13333", "http://example.com:80", "https://127.0.0.1:1", "http://127.0.0.1"} {
		if _, err := newAPI(bad, "", 1); err == nil || !strings.Contains(err.Error(), "base URL") {
			t.Errorf("%s accepted (%v)", bad, err)
		}
	}
}

// TestLoadShort runs the load generator end to end against a spawned server
// (CI's short form): ingestion, one query level, and an unregistration with
// a reclaim window, every answer checked. It asserts completeness and
// correctness, not speed.
func TestLoadShort(t *testing.T) {
	if testing.Short() {
		t.Skip("loadgen: spawns and loads a server for ~10 s")
	}
	o, ctx := spawnedRun(t, "--publishers", "3", "--blocks", "6000",
		"--prompt-tokens", "1024", "--system-tokens", "256", "--groups", "2", "--queries", "64",
		"--concurrency", "2", "--duration", "1s", "--reclaim-window", "500ms",
		// The memos are what this test watches; verified links serve
		// chains the memo then does not learn (TestColdPassAndChainShort
		// watches both).
		"--server-args", "--link-memo-mib=0")
	rep, err := run(ctx, o)
	if rep == nil {
		t.Fatalf("load did not run: %v", err)
	}
	md := logMarkdown(t, rep)
	if err != nil || rep.Failures != 0 {
		t.Fatalf("load failed (%v): %d wrong answers or errors", err, rep.Failures)
	}
	if len(rep.Levels) != 1 || rep.Levels[0].Queries == 0 || rep.Checked == 0 {
		t.Fatalf("no queries measured: %+v", rep.Levels)
	}
	// Every query of the pool was asked once before the level (the
	// verification pass), so the server's memos serve the level wholly and
	// hold about what the pool's prompts take (~15 bytes per token in
	// both together). A memo that keeps storing what it cannot find again
	// shows here: the prefix memo's did, at 98 % of blocks and 42 MiB.
	limit := int64(2 * 64 * 1024 * 16)
	if l := rep.Levels[0]; l.PrefixMemoHitPct < 99 || l.TokenMemoHitPct < 99 || l.MemoBytes <= 0 || l.MemoBytes > limit {
		t.Errorf("memos served %.1f %% of blocks and %.1f %% of token ids and hold %d bytes; want ≥ 99 %% each and at most %d bytes",
			l.PrefixMemoHitPct, l.TokenMemoHitPct, l.MemoBytes, limit)
	}
	rc := rep.Unreg.Reclaim
	if rep.Unreg.Publishers != 3 || rc == nil || rc.Queries == 0 || rc.Seconds < 0.5 {
		t.Fatalf("unregistration or reclaim window not measured: %+v %+v", rep.Unreg, rc)
	}
	if !strings.Contains(md, "while the others' entries are reclaimed") {
		t.Error("the Markdown report lacks the reclaim window")
	}
	for _, bad := range [][]string{{"--reclaim-window", "-1s"}, {"--reclaim-window", "2m"}} {
		if _, err := parseFlags(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// logMarkdown logs a run's Markdown report (either kind) and returns it.
func logMarkdown(t *testing.T, rep interface{ writeMarkdown(io.Writer) }) string {
	t.Helper()
	var md bytes.Buffer
	rep.writeMarkdown(&md)
	t.Log(md.String())
	return md.String()
}

// spawnedRun parses the options of a short run against a spawned server
// (race-built when the tests are: the race build of every server package
// is then already in the build cache, as CI runs go test -race ./..., and
// the soak doubles as a race hunt in the server under churn), quiet, and
// gives it two minutes.
func spawnedRun(t *testing.T, args ...string) (*options, context.Context) {
	t.Helper()
	args = append([]string{"--spawn", "--quiet", "--server-log-level", "WARN"}, args...)
	if racebuild.Enabled {
		args = append(args, "--server-race")
	}
	o, err := parseFlags(args)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return o, ctx
}

// TestPairedCPU: a paired pass charges each kind of query the CPU its
// samples carry, and knows nothing when one sample has none.
func TestPairedCPU(t *testing.T) {
	samples := []sample{
		{cpu: 90 * time.Microsecond}, {cpu: 50 * time.Microsecond, paired: pairedFloor}, {cpu: 56 * time.Microsecond, paired: pairedBody},
		{cpu: 110 * time.Microsecond}, {cpu: 54 * time.Microsecond, paired: pairedFloor}, {cpu: 60 * time.Microsecond, paired: pairedBody},
	}
	by := splitPaired(samples)
	got := []float64{meanCPU(by[pairedOwn]), meanCPU(by[pairedFloor]), meanCPU(by[pairedBody])}
	if diff := cmp.Diff([]float64{100, 52, 58}, got); diff != "" {
		t.Errorf("mean CPU by part (-want +got):\n%s", diff)
	}
	c := &coldResult{ServerCPUPerQueryUS: got[0], PairedFloorUS: got[1]}
	if less := c.lessFloor(); less != 48 {
		t.Errorf("lessFloor %v, want 48", less)
	}
	if m := meanCPU(append(by[pairedOwn], sample{cpu: -1})); m != -1 {
		t.Errorf("mean with an unknown sample %v, want -1", m)
	}
	if m := meanCPU(nil); m != -1 {
		t.Errorf("mean of nothing %v, want -1", m)
	}
	if less := (&coldResult{ServerCPUPerQueryUS: 10, PairedFloorUS: -1}).lessFloor(); less != -1 {
		t.Errorf("lessFloor without a paired floor %v, want -1", less)
	}
}

func TestHitPct(t *testing.T) {
	for _, c := range []struct {
		name                 string
		ha, ma, hb, mb, want float64
	}{
		{"all hits", 100, 50, 400, 50, 100},
		{"a quarter", 0, 0, 25, 75, 25},
		{"no lookups between", 10, 10, 10, 10, -1},
		{"counter missing", -1, 0, 5, 5, -1},
	} {
		if got := hitPct(c.ha, c.ma, c.hb, c.mb); got != c.want {
			t.Errorf("%s: hitPct = %v, want %v", c.name, got, c.want)
		}
	}
	m, err := parsePromText([]byte("conductor_hash_memo_lookups_total{result=\"hit\"} 7\nconductor_hash_memo_lookups_total{result=\"miss\"} 3\n"))
	if err != nil {
		t.Fatal(err)
	}
	hit, miss := map[string]string{"result": "hit"}, map[string]string{"result": "miss"}
	if got := hitPct(0, 0, m.value("conductor_hash_memo_lookups_total", hit), m.value("conductor_hash_memo_lookups_total", miss)); got != 70 {
		t.Errorf("parsed counters give %v %%, want 70", got)
	}
}

// TestSteadyIngestShort: with --steady-ingest the publishers store new
// prompts throughout the level, every pool answer is still exact, the
// report counts what was stored and gives each cache's hit rate, and the
// server's peak RSS is reported.
func TestSteadyIngestShort(t *testing.T) {
	if testing.Short() {
		t.Skip("loadgen: spawns and loads a server for ~10 s")
	}
	o, ctx := spawnedRun(t, "--publishers", "2", "--blocks", "4000",
		"--prompt-tokens", "1024", "--system-tokens", "256", "--groups", "2", "--queries", "32",
		"--mix", "full=1", "--concurrency", "2", "--duration", "1s", "--steady-ingest", "20")
	rep, err := run(ctx, o)
	if rep == nil {
		t.Fatalf("load did not run: %v", err)
	}
	md := logMarkdown(t, rep)
	if err != nil || rep.Failures != 0 {
		t.Fatalf("load failed (%v): %d wrong answers or errors", err, rep.Failures)
	}
	if rep.SteadyIngest == nil || rep.SteadyIngest.Blocks < 64 || !strings.Contains(md, "steady ingest during the levels") {
		t.Fatalf("steady ingest not run or not reported: %+v", rep.SteadyIngest)
	}
	if l := rep.Levels[0]; l.Queries == 0 || l.PrefixMemoHitPct < 0 || l.TokenMemoHitPct < 0 {
		t.Fatalf("level without queries or hit rates: %+v", l)
	}
	// The kernel's RSS counters lag by up to a few pages per CPU, so the
	// peak is compared with a read taken earlier within 1 MiB.
	if p := rep.PeakRSS; p.AfterIngest <= 0 || p.End < p.AfterIngest || p.End < rep.RSS.AfterLoad-1<<20 {
		t.Fatalf("peak RSS %+v against RSS %+v", p, rep.RSS)
	}
}

// TestEngineProfiles: every publisher kind registers a profile the server
// accepts, and the vLLM kinds name the algorithm and root they hash with.
func TestEngineProfiles(t *testing.T) {
	for _, c := range []struct {
		eng       engine
		alg, seed string
	}{
		{engineVLLM, "sha256_cbor", "0"},
		{engineVLLMDefaults, "sha256", "vllm-none-hash"},
		{engineVLLMXXHash, "xxhash", "0"},
	} {
		if _, err := hashing.Resolve(c.eng.hashSpec()); err != nil {
			t.Fatalf("%s: %v", c.eng, err)
		}
		hp := c.eng.registration("tcp://127.0.0.1:1", "m", "i", 16)["hash_profile"].(map[string]any)
		if hp["algorithm"] != c.alg || hp["python_hash_seed"] != c.seed {
			t.Errorf("%s registers %v, want %s/%s", c.eng, hp, c.alg, c.seed)
		}
	}
}
