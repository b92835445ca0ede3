package main

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/mooncake-conductor-go/conductor/internal/hashing"
)

// testSoakRun is a soak without server or sockets, enough to plan steps
// and build queries.
func testSoakRun(t *testing.T, eng engine) *soakRun {
	t.Helper()
	sh, err := newSoakShape(4, 32, 8, 3, 151936, 11)
	if err != nil {
		t.Fatal(err)
	}
	prof, err := hashing.Resolve(eng.hashSpec())
	if err != nil {
		t.Fatal(err)
	}
	o := &options{engine: eng, model: "m"}
	o.corpus.Seed = 11
	return &soakRun{o: o, cfg: soakConfig{window: 3, clearEvery: 7}, shape: sh, prof: prof}
}

func testSoakPublisher(r *soakRun, idx int) *soakPublisher {
	return &soakPublisher{
		r: r, idx: idx, model: newPubModel(r.shape.groups), keys: map[contentKey][]uint64{},
		enc: newEncoder(), chain: hashing.AcquireChain(),
	}
}

// fakeOwner applies a publisher's events to a set of block keys, as the
// index does for one engine owner. Events apply one block at a time, with
// check called after each: the index applies them so too, and a query may
// run between any two.
type fakeOwner map[uint64]bool

func (f fakeOwner) apply(t *testing.T, events []any, check func()) {
	set := func(k uint64, held bool) {
		if held {
			f[k] = true
		} else {
			delete(f, k)
		}
		check()
	}
	for _, ev := range events {
		switch e := ev.(type) {
		case vllmStored:
			for _, k := range e.BlockHashes {
				set(k, true)
			}
		case sglangStored:
			for _, k := range e.BlockHashes {
				set(uint64(k), true)
			}
		case vllmRemoved:
			for _, k := range e.BlockHashes {
				set(k, false)
			}
		case sglangRemoved:
			for _, k := range e.BlockHashes {
				set(uint64(k), false)
			}
		case cleared:
			clear(f)
			check()
		default:
			t.Fatalf("unexpected event %T", ev)
		}
	}
}

// probe is a query with its chain keys computed once.
type probe struct {
	q    soakQuery
	keys []uint64
}

// stepProbes are the queries whose answers a step can change: each prompt
// held before or after it in full, and each group's system prompt followed
// by tokens nobody stores.
func stepProbes(r *soakRun, ch *hashing.Chain, prev *heldState, versions []*heldState) []probe {
	sh := r.shape
	var out []probe
	seen := map[contentKey]bool{}
	for _, st := range append([]*heldState{prev}, versions...) {
		for _, c := range st.contents {
			if !seen[c] {
				seen[c] = true
				q := soakQuery{kind: kindFull, source: c, group: sh.group(c), keep: sh.blocks}
				out = append(out, probe{q, chainKeys(ch, &r.prof, sh.bs, sh.tokens(c))})
			}
		}
	}
	for g := range sh.groups {
		toks := make([]int32, sh.blocks*sh.bs)
		for i := range toks {
			toks[i] = sh.vocab + 1000
		}
		copy(toks, sh.systems[g])
		q := soakQuery{kind: kindSystem, group: g, keep: sh.sysBlocks}
		out = append(out, probe{q, chainKeys(ch, &r.prof, sh.bs, toks)})
	}
	return out
}

func (f fakeOwner) matchKeys(keys []uint64) int {
	n := 0
	for _, k := range keys {
		if !f[k] {
			break
		}
		n++
	}
	return n
}

// match walks tokens' chain while the owner holds each block, as /query
// does, and returns the matched blocks.
func (f fakeOwner) match(r *soakRun, ch *hashing.Chain, tokens []int32) int {
	n := 0
	for _, k := range chainKeys(ch, &r.prof, r.shape.bs, tokens) {
		if !f[k] {
			break
		}
		n++
	}
	return n
}

// TestSoakModelMatchesEvents replays publishers' planned batches into fake
// owners and checks, for queries of every kind, that the model's match
// equals both the chain walk over the blocks the events left (so the events
// say what the model thinks: evictions, shared system prompts, clears) and
// the benchmark's brute-force trie over the held prompts' tokens (so the
// structural match rule is right).
func TestSoakModelMatchesEvents(t *testing.T) {
	for _, eng := range []engine{engineVLLM, engineSGLang} {
		r := testSoakRun(t, eng)
		sh := r.shape
		pubs := []*soakPublisher{testSoakPublisher(r, 0), testSoakPublisher(r, 1)}
		r.pubs = pubs
		owners := []fakeOwner{{}, {}}
		ch := hashing.AcquireChain()
		rng := rand.New(rand.NewPCG(1, 2))
		checked := map[queryKind]int{}
		for step := 1; step <= 60; step++ {
			for i, p := range pubs {
				prev := p.model.current()
				pl, err := p.plan(step)
				if err != nil {
					t.Fatal(err)
				}
				// Between two versions the server passes through
				// block-level states the checker must also accept: every
				// one must lie within the bounds of the step's versions.
				probes := stepProbes(r, ch, prev, pl.versions)
				states := append([]*heldState{prev}, pl.versions...)
				owners[i].apply(t, pl.events, func() {
					for _, q := range probes {
						got := owners[i].matchKeys(q.keys)
						lo, hi := q.q.keep, 0
						for _, st := range states {
							n := st.match(&q.q, sh.sysBlocks)
							lo, hi = min(lo, n), max(hi, n)
						}
						if got < lo || got > hi {
							t.Fatalf("%s step %d, publisher %d, mid-batch: %s query (source %#x) matches %d blocks, versions allow %d..%d",
								eng, step, i, q.q.kind, uint64(q.q.source), got, lo, hi)
						}
					}
				})
				p.model.push(pl.versions...)
				p.model.markApplied()
				if got := owners[i].match(r, ch, pl.tokens); got != sh.blocks {
					t.Fatalf("%s step %d: stored prompt matches %d blocks", eng, step, got)
				}
			}
			for range 40 {
				pub := rng.IntN(len(pubs))
				q, toks := r.buildQuery(rng, pub, step)
				checked[q.kind]++
				for i, p := range pubs {
					st := p.model.current()
					want := st.match(&q, sh.sysBlocks)
					if got := owners[i].match(r, ch, toks); got != want {
						t.Fatalf("%s step %d, %s query (source %#x keep %d): publisher %d holds %d blocks, model says %d (state %+v)",
							eng, step, q.kind, uint64(q.source), q.keep, i, got, want, *st)
					}
					tr := newTrie(sh.bs, 1)
					for _, c := range st.contents {
						tr.insert(sh.tokens(c), 0)
					}
					if got := tr.expect(toks)[0] / sh.bs; got != want {
						t.Fatalf("%s step %d, %s query: trie says %d blocks, model %d", eng, step, q.kind, got, want)
					}
				}
			}
		}
		for k := range numKinds {
			if checked[k] == 0 {
				t.Errorf("%s: no %s queries checked", eng, k)
			}
		}
		if pubs[0].clears == 0 || pubs[0].removed == 0 {
			t.Errorf("%s: the plan never cleared (%d) or evicted (%d)", eng, pubs[0].clears, pubs[0].removed)
		}
	}
}

// TestSoakExpect checks the bounds a query gets from the versions that may
// have been applied while it was in flight, and presence across phases.
func TestSoakExpect(t *testing.T) {
	const sys = 2
	a, b := privateContent(0, 1), privateContent(0, 2)
	st := func(cs ...contentKey) *heldState {
		h := emptyState(1)
		for _, c := range cs {
			h.contents = append(h.contents, c)
			h.sysRef[0]++
		}
		return h
	}
	full := func(c contentKey) *soakQuery { return &soakQuery{kind: kindFull, source: c, keep: 8} }
	m := newPubModel(1)
	m.setPhase(phaseLive)
	m.push(st(a))
	m.markApplied()

	// Stable: exact.
	mk := m.mark()
	if e := m.expect(mk, full(a), sys); e != (expectation{pres: mustMatch, lo: 8, hi: 8}) {
		t.Errorf("stable: %+v", e)
	}
	// Sent, not yet confirmed: a query sent now may see either version.
	m.push(st(b))
	mk = m.mark()
	if e := m.expect(mk, full(a), sys); e != (expectation{pres: mustMatch, lo: sys, hi: 8}) {
		t.Errorf("in flight: %+v", e)
	}
	// A clear then a store: the empty state in between lowers the bound
	// to zero even for the system prompt both ends share.
	m.markApplied()
	mk = m.mark()
	m.push(emptyState(1), st(a))
	if e := m.expect(mk, &soakQuery{kind: kindSystem, keep: sys}, sys); e != (expectation{pres: mustMatch, lo: 0, hi: sys}) {
		t.Errorf("across a clear: %+v", e)
	}
	m.markApplied()
	// Unregistration overlapping the query: may vanish.
	mk = m.mark()
	m.setPhase(phaseLeaving)
	m.setPhase(phaseGone)
	if e := m.expect(mk, full(a), sys); e.pres != mayVanish || e.hi != 8 {
		t.Errorf("overlapping unregistration: %+v", e)
	}
	// Restarted in place: the old entries stay possible until applied.
	m.setPhase(phaseLive)
	mk = m.mark()
	m.setPhase(phaseReplacing)
	m.push(emptyState(1))
	if e := m.expect(mk, full(a), sys); e.pres != mayVanish || e.hi != 8 {
		t.Errorf("replacing: %+v", e)
	}
	m.markApplied()
	m.setPhase(phaseLeaving)
	m.setPhase(phaseGone)
	// Gone for the whole query: must be absent.
	mk = m.mark()
	if e := m.expect(mk, full(a), sys); e.pres != mustBeGone {
		t.Errorf("gone: %+v", e)
	}
	// A query outliving the history is unchecked, not guessed.
	m.setPhase(phaseLive)
	mk = m.mark()
	for range historySize {
		m.push(st(b))
	}
	if e := m.expect(mk, full(a), sys); !e.unchecked {
		t.Errorf("history overrun: %+v", e)
	}
}

func hitsOf(n int64) instanceHits {
	return instanceHits{LongestMatched: n, Device: n, CPULocal: n, CPUShare: n, Disk: n,
		DP: map[string]int64{"0": n}, RankMatches: map[string]tiers{"0": {n, n, n, n}}}
}

func TestCheckSoakAnswer(t *testing.T) {
	ids := []string{"e0", "e1"}
	exact := []expectation{{pres: mustMatch, lo: 2, hi: 2}, {pres: mustMatch}}
	answer := func(kv ...any) *queryResponse {
		r := &queryResponse{Instances: map[string]instanceHits{}}
		for i := 0; i < len(kv); i += 2 {
			r.Instances[kv[i].(string)] = kv[i+1].(instanceHits)
		}
		return r
	}
	never := func(string) bool { return false }
	ok := func(r *queryResponse, exp []expectation, gone func(string) bool) error {
		return checkSoakAnswer(r, ids, exp, 16, "t-", gone)
	}
	if err := ok(answer("e0", hitsOf(32), "e1", hitsOf(0)), exact, never); err != nil {
		t.Errorf("exact answer rejected: %v", err)
	}
	bad := []struct {
		name string
		r    *queryResponse
		exp  []expectation
		gone func(string) bool
	}{
		{"short", answer("e0", hitsOf(16), "e1", hitsOf(0)), exact, never},
		{"long", answer("e0", hitsOf(48), "e1", hitsOf(0)), exact, never},
		{"missing", answer("e0", hitsOf(32)), exact, never},
		{"unknown instance", answer("e0", hitsOf(32), "e1", hitsOf(0), "x", hitsOf(0)), exact, never},
		{"transient with a match", answer("e0", hitsOf(32), "e1", hitsOf(0), "t-1", hitsOf(16)), exact, never},
		{"transient after unregistration", answer("e0", hitsOf(32), "e1", hitsOf(0), "t-1", hitsOf(0)), exact, func(string) bool { return true }},
		{"above the in-flight range", answer("e0", hitsOf(64), "e1", hitsOf(0)), []expectation{{pres: mustMatch, lo: 1, hi: 3}, {pres: mustMatch}}, never},
		{"below the in-flight range", answer("e0", hitsOf(0), "e1", hitsOf(0)), []expectation{{pres: mustMatch, lo: 1, hi: 3}, {pres: mustMatch}}, never},
		{"present after unregistration", answer("e0", hitsOf(32), "e1", hitsOf(0)), []expectation{{pres: mustBeGone}, {pres: mustMatch}}, never},
		{"vanishing but longer", answer("e0", hitsOf(64), "e1", hitsOf(0)), []expectation{{pres: mayVanish, hi: 2}, {pres: mustMatch}}, never},
	}
	inconsistent := hitsOf(32)
	inconsistent.Disk = 16
	bad = append(bad, struct {
		name string
		r    *queryResponse
		exp  []expectation
		gone func(string) bool
	}{"tiers disagree", answer("e0", inconsistent, "e1", hitsOf(0)), exact, never})
	for _, c := range bad {
		if err := ok(c.r, c.exp, c.gone); err == nil {
			t.Errorf("%s: accepted", c.name)
		}
	}
	good := []struct {
		name string
		r    *queryResponse
		exp  []expectation
	}{
		{"transient with nothing", answer("e0", hitsOf(32), "e1", hitsOf(0), "t-7", hitsOf(0)), exact},
		{"within the in-flight range", answer("e0", hitsOf(32), "e1", hitsOf(0)), []expectation{{pres: mustMatch, lo: 1, hi: 3}, {pres: mustMatch}}},
		{"vanished", answer("e1", hitsOf(0)), []expectation{{pres: mayVanish, hi: 2}, {pres: mustMatch}}},
		{"vanishing, partly retracted", answer("e0", hitsOf(16), "e1", hitsOf(0)), []expectation{{pres: mayVanish, lo: 2, hi: 2}, {pres: mustMatch}}},
	}
	for _, c := range good {
		if err := ok(c.r, c.exp, never); err != nil {
			t.Errorf("%s: rejected: %v", c.name, err)
		}
	}
}

// passingReport is a soak report every assertion accepts.
func passingReport() *soakReport {
	return &soakReport{
		Churned: 2, MaxTransients: 2, RSSTolerance: 0.2, GoroutineSlack: 10,
		Ops: 100, Queries: 1000, Exact: 900, Tolerant: 100, RestartsNewPort: 3, RestartsSamePort: 2, RestartsInPlace: 2, Transients: 4,
		RestartsDetected: 2,
		Warmup:           soakLevel{RSS: 100 << 20, Goroutines: 30, FDs: 50}, Final: soakLevel{RSS: 110 << 20, Goroutines: 35, FDs: 50},
		PeakRSS: 115 << 20,
	}
}

// TestSoakVerdicts feeds the assertions bad figures, one at a time, and
// checks that each makes the soak fail; the soak can fail, and for the
// right reason.
func TestSoakVerdicts(t *testing.T) {
	rep := passingReport()
	rep.Verdicts = rep.evaluate()
	if !rep.passed() {
		t.Fatalf("good report fails: %+v", rep.Verdicts)
	}
	cases := map[string]func(r *soakReport){
		"RSS":               func(r *soakReport) { r.Final.RSS = 121 << 20 },
		"RSS unknown":       func(r *soakReport) { r.Final.RSS = -1 },
		"goroutines":        func(r *soakReport) { r.Final.Goroutines = 41 },
		"fds":               func(r *soakReport) { r.Final.FDs = 61 },
		"wrong answers":     func(r *soakReport) { r.Wrong = 1 },
		"5xx":               func(r *soakReport) { r.FiveXX = 1 },
		"5xx (server)":      func(r *soakReport) { r.ServerFiveXX = 2 },
		"transport errors":  func(r *soakReport) { r.TransportOutside = 1 },
		"stale at the end":  func(r *soakReport) { r.FinalStale = 1 },
		"unexpected stale":  func(r *soakReport) { r.StaleTransitions = 1 },
		"stale regression":  func(r *soakReport) { r.StaleTransitions, r.StaleRegressions = 1, 1 },
		"restart missed":    func(r *soakReport) { r.RestartsDetected = 1 },
		"context left":      func(r *soakReport) { r.TeardownLeft = 1 },
		"control errors":    func(r *soakReport) { r.ControlErrors = 1 },
		"error statuses":    func(r *soakReport) { r.OtherStatus = 1 },
		"no queries":        func(r *soakReport) { r.Queries = 0 },
		"no restarts":       func(r *soakReport) { r.RestartsNewPort, r.RestartsSamePort, r.RestartsInPlace = 0, 0, 0 },
		"no transients":     func(r *soakReport) { r.Transients = 0 },
		"aborted":           func(r *soakReport) { r.Aborted = "publisher lost a batch" },
		"unknown goroutine": func(r *soakReport) { r.Warmup.Goroutines = -1 },
	}
	for name, mutate := range cases {
		r := passingReport()
		mutate(r)
		r.Verdicts = r.evaluate()
		if r.passed() {
			t.Errorf("%s: injected failure passes", name)
		}
		var md bytes.Buffer
		r.writeMarkdown(&md)
		if !strings.Contains(md.String(), "**FAIL**") {
			t.Errorf("%s: summary shows no failure:\n%s", name, md.String())
		}
	}
	// Tolerated: transport errors during unregistrations, a lower RSS.
	r := passingReport()
	r.TransportInside, r.Final.RSS = 3, 50<<20
	r.Verdicts = r.evaluate()
	if !r.passed() {
		t.Errorf("tolerated figures fail: %+v", r.Verdicts)
	}
}

func TestRSSLevels(t *testing.T) {
	var s []soakSample
	for i, v := range []int64{50, 60, 100, 90, 110, 100, 105, 130, 120, 125, 118, 122} {
		s = append(s, soakSample{At: time.Duration(i) * time.Second, RSS: v})
	}
	warm, final, peak := rssLevels(s, 2*time.Second)
	// 10 samples after warm-up: medians of the first and last 2.
	if warm != 100 || final != 122 || peak != 130 {
		t.Errorf("rssLevels = %d, %d, %d", warm, final, peak)
	}
	if w, f, p := rssLevels(s, time.Hour); w != -1 || f != -1 || p != -1 {
		t.Errorf("no samples: %d %d %d", w, f, p)
	}
}

func TestParsePromText(t *testing.T) {
	text := `# HELP go_goroutines Number of goroutines.
# TYPE go_goroutines gauge
go_goroutines 42
conductor_http_requests_total{endpoint="/query",status="200"} 1000
conductor_http_requests_total{endpoint="/odd\"path",status="503"} 2
conductor_stale_sources 0
process_resident_memory_bytes 1.2345e+07 1700000000
`
	m, err := parsePromText([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	if m.value("go_goroutines", nil) != 42 || m.value("process_resident_memory_bytes", nil) != 12345000 {
		t.Errorf("values: %v", m)
	}
	if v := m.value("conductor_http_requests_total", map[string]string{"endpoint": `/odd"path`}); v != 2 {
		t.Errorf("escaped label: %v", v)
	}
	if v := m.value("missing", nil); v != -1 {
		t.Errorf("missing metric: %v", v)
	}
	for _, bad := range []string{"x{a=\"1\" 2", "x{a=1} 2", "x", "x abc"} {
		if _, err := parsePromText([]byte(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestWindowLog(t *testing.T) {
	var w windowLog
	t0 := time.Now()
	i := w.open()
	mid := time.Now()
	w.close(i)
	t1 := time.Now()
	if !w.overlaps(t0.Add(-time.Second), mid) || !w.overlaps(mid, t1.Add(time.Second)) {
		t.Error("overlap missed")
	}
	if w.overlaps(t1.Add(time.Millisecond), t1.Add(time.Second)) {
		t.Error("later query counted as overlapping")
	}
	w.open() // still open: overlaps anything after its start
	if !w.overlaps(time.Now().Add(time.Hour), time.Now().Add(2*time.Hour)) {
		t.Error("open window not overlapping")
	}
}

func TestSoakFlags(t *testing.T) {
	o, err := parseFlags([]string{"--soak", "30s", "--soak-churned", "2"})
	if err != nil {
		t.Fatal(err)
	}
	if o.soak.duration != 30*time.Second || o.soak.sampleInterval != 500*time.Millisecond {
		t.Errorf("soak config %+v", o.soak)
	}
	for _, bad := range [][]string{
		{"--soak", "30s", "--soak-churned", "6"},
		{"--soak", "30s", "--soak-warmup", "0"},
		{"--soak", "-1s"},
	} {
		if _, err := parseFlags(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestSoakShort is the soak's short form, which CI runs: it builds the
// server, spawns it and soaks it for a few seconds with every worker and
// every assertion of the long form.
func TestSoakShort(t *testing.T) {
	if testing.Short() {
		t.Skip("soak: spawns and loads a server for ~15 s")
	}
	// A 30 % warm-up: at CI's rates a few seconds pass before the index
	// and the memo reach their working size.
	o, ctx := spawnedRun(t, "--soak", "8s", "--soak-warmup", "0.3",
		"--soak-query-concurrency", "2", "--soak-op-interval", "25ms", "--soak-churn-interval", "200ms", "--soak-memo-mib", "1")
	rep, err := runSoak(ctx, o)
	if rep == nil {
		t.Fatalf("soak did not run: %v", err)
	}
	logMarkdown(t, rep)
	if err != nil || !rep.passed() {
		t.Fatalf("soak failed (%v)", err)
	}
}
