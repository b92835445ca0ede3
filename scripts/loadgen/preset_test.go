package main

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestPresetRouter8k(t *testing.T) {
	o, err := parseFlags([]string{"--preset", "router-8k"})
	if err != nil {
		t.Fatal(err)
	}
	got := corpusConfig{Publishers: o.corpus.Publishers, Prompts: o.corpus.Prompts, PromptTokens: o.corpus.PromptTokens,
		SystemTokens: o.corpus.SystemTokens, Groups: o.corpus.Groups, BlockSize: o.corpus.BlockSize, Queries: o.corpus.Queries,
		Mix: o.corpus.Mix}
	want := corpusConfig{Publishers: 4, Prompts: 1000, PromptTokens: 8192, SystemTokens: 1024, Groups: 16, BlockSize: 16,
		Queries: 1000, Mix: mix{Full: 1}}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("preset corpus (-want +got):\n%s", d)
	}
	if !o.binTokens || !o.coldPass || !o.chainBaseline || o.engine != engineVLLM || !slices.Equal(o.levels, []int{1, 8}) || o.preset != "router-8k" {
		t.Errorf("preset options: bin %v, cold %v, chain %v, engine %s, levels %v, name %q", o.binTokens, o.coldPass, o.chainBaseline, o.engine, o.levels, o.preset)
	}

	// Flags on the command line win, wherever they stand.
	for _, args := range [][]string{
		{"--publishers", "2", "--preset", "router-8k", "--concurrency", "1"},
		{"--preset=router-8k", "--publishers", "2", "--concurrency", "1"},
	} {
		o, err := parseFlags(args)
		if err != nil {
			t.Fatalf("%q: %v", args, err)
		}
		if o.corpus.Publishers != 2 || !slices.Equal(o.levels, []int{1}) || o.corpus.Prompts != 1000 {
			t.Errorf("%q: publishers %d, levels %v, prompts %d; want 2, [1], 1000", args, o.corpus.Publishers, o.levels, o.corpus.Prompts)
		}
	}
	for _, bad := range [][]string{{"--preset", "nope"}, {"--preset"}, {"--preset", "router-8k", "--restart"}, {"--prompts", "-1"}} {
		if _, err := parseFlags(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestPresetSteady: steady-8k is router-8k's index asked warm under
// continuous ingest.
func TestPresetSteady(t *testing.T) {
	o, err := parseFlags([]string{"--preset", "steady-8k"})
	if err != nil {
		t.Fatal(err)
	}
	want := corpusConfig{Publishers: 4, Prompts: 1000, PromptTokens: 8192, SystemTokens: 1024, Groups: 16, BlockSize: 16, Queries: 1000, Mix: mix{Full: 1}}
	got := corpusConfig{Publishers: o.corpus.Publishers, Prompts: o.corpus.Prompts, PromptTokens: o.corpus.PromptTokens,
		SystemTokens: o.corpus.SystemTokens, Groups: o.corpus.Groups, BlockSize: o.corpus.BlockSize, Queries: o.corpus.Queries,
		Mix: o.corpus.Mix}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("corpus (-want +got):\n%s", d)
	}
	if o.steadyIngest != 4 || o.coldPass || !slices.Equal(o.levels, []int{1, 8}) {
		t.Errorf("options: steady %v, cold %v, levels %v", o.steadyIngest, o.coldPass, o.levels)
	}
}

// TestPresetsCold: the cold presets are the workloads issue 28 names.
func TestPresetsCold(t *testing.T) {
	for _, tc := range []struct {
		name string
		want corpusConfig
	}{
		{"cold-8k", corpusConfig{Publishers: 4, Prompts: 1000, PromptTokens: 8192, SystemTokens: 1024, Groups: 16, BlockSize: 16, Queries: 1000, Mix: mix{Full: 1}}},
		{"cold-64k", corpusConfig{Publishers: 4, Prompts: 96, PromptTokens: 65536, SystemTokens: 4096, Groups: 4, BlockSize: 16, Queries: 96, Mix: mix{Full: 1}}},
	} {
		o, err := parseFlags([]string{"--preset", tc.name})
		if err != nil {
			t.Fatal(err)
		}
		got := corpusConfig{Publishers: o.corpus.Publishers, Prompts: o.corpus.Prompts, PromptTokens: o.corpus.PromptTokens,
			SystemTokens: o.corpus.SystemTokens, Groups: o.corpus.Groups, BlockSize: o.corpus.BlockSize, Queries: o.corpus.Queries,
			Mix: o.corpus.Mix}
		if d := cmp.Diff(tc.want, got); d != "" {
			t.Errorf("%s corpus (-want +got):\n%s", tc.name, d)
		}
		if !o.binTokens || !o.coldPass || !o.chainBaseline || !o.floor || !slices.Equal(o.levels, []int{1}) {
			t.Errorf("%s options: bin %v, cold %v, chain %v, floor %v, levels %v", tc.name, o.binTokens, o.coldPass, o.chainBaseline, o.floor, o.levels)
		}
	}
}

// TestCorpusExactPrompts: --prompts fixes the stored prompts, and the cold
// pass asks each of them exactly once, expecting its holder to hold it all.
func TestCorpusExactPrompts(t *testing.T) {
	c, err := newCorpus(corpusConfig{Publishers: 3, BlockSize: 4, PromptTokens: 32, SystemTokens: 8, Groups: 2,
		Prompts: 25, Replicas: 1, Queries: 10, Mix: mix{Full: 1}, Vocab: 50, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.prompts) != 25 {
		t.Fatalf("%d stored prompts, want 25", len(c.prompts))
	}
	cold := c.coldQueries()
	seen := map[string]bool{}
	for _, q := range cold {
		key := fmt.Sprint(q.tokens)
		if seen[key] {
			t.Fatal("a prompt is asked twice in the cold pass")
		}
		seen[key] = true
		if d := cmp.Diff(c.trie.expect(q.tokens), q.expect); d != "" {
			t.Fatalf("cold expectation (-trie +query):\n%s", d)
		}
		full := 0
		for _, e := range q.expect {
			full = max(full, e)
		}
		if full != 32 {
			t.Errorf("a stored prompt's best holder has %d of 32 tokens", full)
		}
	}
	if len(seen) != 25 {
		t.Fatalf("cold pass asks %d distinct prompts, want 25", len(seen))
	}
}

// TestColdPassAndChainShort runs the cold pass and the chain baseline
// against a spawned server: every cold answer is checked, and the report
// sets server CPU against the bare chain.
func TestColdPassAndChainShort(t *testing.T) {
	if testing.Short() {
		t.Skip("loadgen: spawns and loads a server for a few seconds")
	}
	o, ctx := spawnedRun(t, "--publishers", "2", "--prompts", "40", "--prompt-tokens", "512", "--system-tokens", "128",
		"--groups", "4", "--queries", "40", "--mix", "full=1", "--token-encoding", "bin", "--cold-pass", "--chain-baseline", "--floor",
		"--concurrency", "1", "--duration", "300ms")
	rep, err := run(ctx, o)
	if rep == nil {
		t.Fatalf("load did not run: %v", err)
	}
	md := logMarkdown(t, rep)
	if err != nil || rep.Failures != 0 {
		t.Fatalf("load failed (%v): %d wrong answers or errors", err, rep.Failures)
	}
	if rep.Cold == nil || rep.Cold.Queries != 40 || rep.Cold.Failures != 0 {
		t.Fatalf("cold pass: %+v, want 40 queries, none wrong", rep.Cold)
	}
	if f := rep.Floor; f == nil || f.Queries == 0 || f.Failures != 0 || f.ServerCPUPerQueryUS <= 0 {
		t.Fatalf("2-block floor: %+v, want checked queries with their server CPU", rep.Floor)
	}
	// Both passes are paired: a 2-block query and the same query for a
	// model nobody stores (its answer checked empty) after each of theirs.
	for _, p := range []struct {
		name string
		c    *coldResult
	}{{"cold", rep.Cold}, {"warm", rep.Warm}} {
		if c := p.c; c == nil || c.Queries != 40 || c.FloorQueries != 40 || c.PairedFloorUS <= 0 || c.PairedBodyUS <= 0 || c.ServerCPUPerQueryUS <= 0 || c.Failures != 0 {
			t.Errorf("%s pass: %+v, want 40 queries, 40 of each floor, their server CPU, none wrong", p.name, c)
		}
	}
	if !strings.Contains(md, "for a model nobody stores") {
		t.Error("the Markdown report lacks the same-size floor")
	}
	// Every stored block was verified on ingest, so the cold prompts take
	// their digests from links rather than hashing.
	if c := rep.Cold; c.LinkBlocksPerQuery < 1 || c.LinkBytes <= 0 {
		t.Errorf("cold pass took %.1f blocks per query from links (%.0f bytes of them)", c.LinkBlocksPerQuery, c.LinkBytes)
	}
	if rep.Chain == nil || len(rep.Chain.RunsUS) != 3 || rep.Chain.MedianUS <= 0 {
		t.Fatalf("bare chain: %+v, want 3 timed runs", rep.Chain)
	}
	if !strings.Contains(md, "against the bare chain") {
		t.Error("the Markdown report lacks the ratios")
	}
	if rep.AfterUnregSeconds < 0 {
		t.Errorf("RSS after unregistration read after %v s", rep.AfterUnregSeconds)
	}
}
