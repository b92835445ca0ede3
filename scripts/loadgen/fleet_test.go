package main

import (
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestFleetSlotsVersion: message m replaces slot (m-1) mod n by round
// (m-1)/n + 1, so a slot's round after a messages counts the messages
// that reached it.
func TestFleetSlotsVersion(t *testing.T) {
	s := fleetSlots{n: 3}
	tests := []struct {
		applied int64
		want    []int // per slot
	}{
		{0, []int{0, 0, 0}},
		{1, []int{1, 0, 0}},
		{2, []int{1, 1, 0}},
		{3, []int{1, 1, 1}},
		{4, []int{2, 1, 1}},
		{8, []int{3, 3, 2}},
	}
	for _, tc := range tests {
		var got []int
		for j := range s.n {
			got = append(got, s.version(tc.applied, j))
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("after %d messages: rounds %v, want %v", tc.applied, got, tc.want)
		}
	}
	// message is version's inverse: the slot reaches round r with it,
	// not before.
	for j := range s.n {
		for r := 1; r <= 4; r++ {
			m := s.message(j, r)
			if s.version(m, j) != r || s.version(m-1, j) != r-1 {
				t.Errorf("slot %d round %d: message %d gives round %d, the one before %d", j, r, m, s.version(m, j), s.version(m-1, j))
			}
		}
	}
}

// TestFleetBounds: exact where the slot did not move during the query, a
// range between the system prompt and the whole prompt where the asked
// round was held at one end of the span, never more than the system
// prompt where it was held at neither.
func TestFleetBounds(t *testing.T) {
	const sys, full = 64, 512
	s := fleetSlots{n: 4}
	// Slot 1's round r arrives with message s.message(1, r): 2, 6, 10.
	tests := []struct {
		name          string
		r             int
		applied, sent int64
		lo, hi        int
	}{
		{"round held, nothing in flight", 1, 2, 2, full, full},
		{"round held, other slots' messages in flight", 1, 2, 5, full, full},
		{"round not yet sent", 2, 2, 5, sys, sys},
		{"round replaced before the query", 0, 2, 5, sys, sys},
		{"round arriving during the query", 1, 1, 2, sys, full},
		{"round leaving during the query", 1, 5, 6, sys, full},
		{"round arriving and leaving during the query", 1, 0, 6, sys, full},
		{"several rounds later, stable", 1, 10, 12, sys, sys},
		{"corpus prompt, nothing sent", 0, 0, 0, full, full},
		{"corpus prompt, its replacement in flight", 0, 0, 2, sys, full},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lo, hi := s.bounds(1, tc.r, tc.applied, tc.sent, sys, full)
			if lo != tc.lo || hi != tc.hi {
				t.Errorf("bounds(slot 1, round %d, applied %d, sent %d) = %d..%d, want %d..%d", tc.r, tc.applied, tc.sent, lo, hi, tc.lo, tc.hi)
			}
		})
	}
}

func TestJudge(t *testing.T) {
	const bs = 16
	tests := []struct {
		got    int64
		lo, hi int
		want   fleetVerdict
	}{
		{512 * bs, 512, 512, verdictExact},
		{0, 0, 0, verdictExact},
		{64 * bs, 64, 512, verdictRange},
		{300 * bs, 64, 512, verdictRange},
		{512 * bs, 64, 512, verdictRange},
		{512*bs + 1, 64, 512, verdictAbove},
		{64 * bs, 0, 0, verdictAbove},
		{63 * bs, 64, 512, verdictBelow},
		{0, 64, 64, verdictBelow},
	}
	for _, tc := range tests {
		if v := judge(tc.got, tc.lo, tc.hi, bs); v != tc.want {
			t.Errorf("judge(%d, %d..%d) = %d, want %d", tc.got, tc.lo, tc.hi, v, tc.want)
		}
	}
}

// TestFleetCheck: the publisher whose slot was asked is held to its
// bounds, every other one exactly to the group's system prompt (or to
// nothing); an answer above the model is a failure, one below is counted.
func TestFleetCheck(t *testing.T) {
	const bs, sys, full = 16, 4, 32
	hit := func(n int64) instanceHits {
		return instanceHits{LongestMatched: n, Device: n, CPULocal: n, CPUShare: n, Disk: n,
			DP: map[string]int64{"0": n}, RankMatches: map[string]tiers{"0": {n, n, n, n}}}
	}
	ids := []string{"e0", "e1", "e2"}
	tests := []struct {
		name          string
		q             fleetQuery
		applied, sent int64
		answer        map[string]instanceHits
		want          [5]int64 // exact, range, above, below, failures
	}{
		{"stable, all exact", fleetQuery{0, 1, 1}, 2, 2,
			map[string]instanceHits{"e0": hit(full * bs), "e1": hit(sys * bs), "e2": hit(0)}, [5]int64{3, 0, 0, 0, 0}},
		{"in flight, part-way", fleetQuery{0, 1, 1}, 1, 2,
			map[string]instanceHits{"e0": hit(10 * bs), "e1": hit(sys * bs), "e2": hit(0)}, [5]int64{2, 1, 0, 0, 0}},
		{"old prompt still whole after its replacement was applied", fleetQuery{0, 1, 0}, 2, 2,
			map[string]instanceHits{"e0": hit(full * bs), "e1": hit(sys * bs), "e2": hit(0)}, [5]int64{2, 0, 1, 0, 1}},
		{"another publisher claims the private blocks", fleetQuery{0, 1, 1}, 2, 2,
			map[string]instanceHits{"e0": hit(full * bs), "e1": hit(full * bs), "e2": hit(0)}, [5]int64{2, 0, 1, 0, 1}},
		{"system prompt lost", fleetQuery{0, 1, 1}, 2, 2,
			map[string]instanceHits{"e0": hit(full * bs), "e1": hit(0), "e2": hit(0)}, [5]int64{2, 0, 0, 1, 0}},
		{"a publisher missing", fleetQuery{0, 1, 1}, 2, 2,
			map[string]instanceHits{"e0": hit(full * bs), "e1": hit(sys * bs)}, [5]int64{2, 0, 0, 0, 1}},
		{"inconsistent tiers", fleetQuery{0, 1, 1}, 2, 2,
			map[string]instanceHits{"e0": {LongestMatched: full * bs, Device: sys * bs}, "e1": hit(sys * bs), "e2": hit(0)}, [5]int64{2, 0, 0, 0, 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := &fleetRun{c: &corpus{cfg: corpusConfig{BlockSize: bs}}, ids: ids, fails: &failures{},
				slots:      []fleetSlots{{n: 2, group: []int{0, 1}}, {n: 1, group: []int{1}}, {n: 1, group: []int{0}}},
				holdsGroup: [][]bool{{true, true}, {false, true}, {true, false}},
				sysBlocks:  sys, blocks: full,
				applied: make([]atomic.Int64, 3),
			}
			r.check(&queryResponse{Instances: tc.answer}, tc.q, tc.applied, tc.sent)
			got := [5]int64{r.exact.Load(), r.ranged.Load(), r.above.Load(), r.below.Load(), r.fails.count.Load()}
			if got != tc.want {
				t.Errorf("exact, range, above, below, failures = %v, want %v (%v)", got, tc.want, r.fails.first)
			}
		})
	}
}

// TestFleetCheckMarksApplied: a whole prompt in an answer shows its message,
// and every earlier one of that publisher, applied.
func TestFleetCheckMarksApplied(t *testing.T) {
	const bs, sys, full = 16, 4, 32
	n := int64(full * bs)
	r := &fleetRun{c: &corpus{cfg: corpusConfig{BlockSize: bs}}, ids: []string{"e0"}, fails: &failures{},
		slots: []fleetSlots{{n: 3, group: []int{0, 0, 0}}}, holdsGroup: [][]bool{{true}},
		sysBlocks: sys, blocks: full, applied: make([]atomic.Int64, 1),
	}
	ans := &queryResponse{Instances: map[string]instanceHits{"e0": {LongestMatched: n, Device: n, CPULocal: n, CPUShare: n, Disk: n,
		DP: map[string]int64{"0": n}, RankMatches: map[string]tiers{"0": {n, n, n, n}}}}}
	r.check(ans, fleetQuery{0, 1, 2}, 0, 5) // slot 1, round 2: message 5
	if got := r.applied[0].Load(); got != 5 || r.fails.count.Load() != 0 {
		t.Fatalf("applied %d after an answer showing message 5 (failures %v)", got, r.fails.first)
	}
	r.check(ans, fleetQuery{0, 0, 1}, 0, 5) // message 1: applied never goes back
	if got := r.applied[0].Load(); got != 5 {
		t.Fatalf("applied went back to %d", got)
	}
}

func TestPresetFleet(t *testing.T) {
	o, err := parseFlags([]string{"--preset", "fleet"})
	if err != nil {
		t.Fatal(err)
	}
	got := corpusConfig{Publishers: o.corpus.Publishers, Prompts: o.corpus.Prompts, PromptTokens: o.corpus.PromptTokens,
		SystemTokens: o.corpus.SystemTokens, Groups: o.corpus.Groups, BlockSize: o.corpus.BlockSize, Replicas: o.corpus.Replicas}
	want := corpusConfig{Publishers: 4, Prompts: 1000, PromptTokens: 8192, SystemTokens: 1024, Groups: 16, BlockSize: 16, Replicas: 1}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("preset corpus (-want +got):\n%s", d)
	}
	if o.fleet.rounds != 4 || o.fleet.rate != 0 || !slices.Equal(o.levels, []int{1, 8}) || !o.binTokens || o.coldPass {
		t.Errorf("preset options: rounds %d, rate %g, levels %v, bin %v, cold %v", o.fleet.rounds, o.fleet.rate, o.levels, o.binTokens, o.coldPass)
	}
	o, err = parseFlags([]string{"--preset", "fleet", "--fleet-rounds", "2", "--fleet-rate", "500000", "--spawn", "--server-memory-mib", "256"})
	if err != nil {
		t.Fatal(err)
	}
	if o.fleet.rounds != 2 || o.fleet.rate != 500000 || !slices.Contains(o.serverOptions().env, "GOMEMLIMIT=256MiB") {
		t.Errorf("overrides: rounds %d, rate %g, server env %v", o.fleet.rounds, o.fleet.rate, o.serverOptions().env)
	}
	for _, args := range [][]string{
		{"--preset", "fleet", "--fleet-rate", "-1"},
		{"--preset", "fleet", "--fleet-rounds", "-1"},
		{"--preset", "fleet", "--publishers", "4", "--replicas", "2"},
		{"--preset", "fleet", "--cold-pass"},
		{"--preset", "fleet", "--steady-ingest", "4"},
		{"--preset", "fleet", "--server-memory-mib", "256"}, // without --spawn
	} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("%q: accepted", args)
		}
	}
}

// TestFleetShort runs the fleet phase on a small index: every round's
// replacements applied and verified, the prefix count back at the
// corpus's, and every answer within the model.
func TestFleetShort(t *testing.T) {
	if testing.Short() {
		t.Skip("loadgen: spawns and loads a server for a few seconds")
	}
	o, ctx := spawnedRun(t, "--publishers", "2", "--prompts", "24", "--prompt-tokens", "512", "--system-tokens", "128",
		"--groups", "3", "--queries", "24", "--mix", "full=1", "--token-encoding", "bin", "--concurrency", "1,2", "--duration", "1s",
		"--fleet-rounds", "2")
	rep, err := run(ctx, o)
	if rep == nil {
		t.Fatalf("load did not run: %v", err)
	}
	md := logMarkdown(t, rep)
	if err != nil || rep.Failures != 0 {
		t.Fatalf("load failed (%v): %d wrong answers or errors", err, rep.Failures)
	}
	f := rep.Fleet
	if f == nil || len(f.Rounds) != 4 {
		t.Fatalf("fleet rounds: %+v, want 2 quiet and 2 with queries", f)
	}
	for i, rd := range f.Rounds {
		wantConc := []int{0, 0, 1, 2}[i]
		if rd.Round != i+1 || rd.Concurrency != wantConc || rd.Messages != 24 || rd.BlockOps != 24*2*(32-8) || rd.RSSEnd <= 0 {
			t.Errorf("round %d: %+v", i+1, rd)
		}
		if wantConc > 0 && rd.Queries == 0 {
			t.Errorf("round %d ran no queries", i+1)
		}
	}
	if f.Answers == 0 || f.Exact == 0 || f.Above != 0 || f.Below != 0 || f.SettledRSS <= 0 || f.PeakRSS <= 0 {
		t.Errorf("fleet result: %+v", f)
	}
	if !strings.Contains(md, "Fleet at capacity") {
		t.Error("the Markdown report lacks the fleet section")
	}
}
