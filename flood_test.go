package main

import (
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mooncake-conductor-go/conductor/internal/config"
	"github.com/mooncake-conductor-go/conductor/internal/procmem"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/racebuild"
)

// TestFloodEndToEnd is the flood through the whole service: two
// vLLM publishers on real ZMQ sockets announce 3 M distinct blocks (1.5 M
// each, 64-block prompts, no removals) against --index-memory-mib 32
// while a client keeps querying over HTTP. The accounted memory never
// exceeds the budget, evictions are counted, every query is answered, and
// each publisher's most recent prompts are fully reported. Under the race
// detector, which multiplies every step's cost, budget and flood are a
// quarter of that, 300 K blocks against 8 MiB: the same paths (eviction
// during ingest and queries, to the same overflow ratio), and the
// resident-size bound is checked only without it.
func TestFloodEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("flood")
	}
	budget := int64(32 << 20)
	prompts := 1_500_000 / 64
	if racebuild.Enabled {
		budget /= 4
		prompts = prompts * 2 / 5 / 4 // 300 K blocks, ~11 MiB accounted
	}
	runtime.GC()
	rss0 := procmem.RSS()
	var cfg *config.Config
	e := startAppWith(t, func(c *config.Config) {
		c.IndexMemoryBytes, c.HashCheckEvery = budget, 0
		// The verified links fill from the flood's token ids within
		// their own budget, counted below with the memos'.
		c.LinkMemoBytes = 16 << 20
		cfg = c
	})
	pubs := []*publisher{newPublisher(t), newPublisher(t)}
	names := []string{"flood-a", "flood-b"}
	for i, p := range pubs {
		_ = p.sock.SetSndhwm(0) // paced below: the publisher never drops
		if status, out := e.post("/register", vllmRegistration(names[i], p.endpoint)); status != 200 {
			t.Fatalf("register %s: %d %v", names[i], status, out)
		}
	}
	// prompt p of publisher i: 1,024 tokens whose first names (i, p), so
	// every prompt's 64 blocks are new.
	prompt := func(i, p int) []int32 {
		tokens := make([]int32, 1024)
		tokens[0] = int32(i<<24 | p)
		for j := 1; j < len(tokens); j++ {
			tokens[j] = int32(j)
		}
		return tokens
	}
	stored := func(tokens []int32) map[string]any {
		return map[string]any{"type": "BlockStored", "block_hashes": vllmKeys(t, tokens), "parent_block_hash": nil,
			"token_ids": tokens, "block_size": 16, "lora_id": nil, "medium": "GPU", "lora_name": nil}
	}
	// The first messages are lost until the subscriptions are up.
	for i, p := range pubs {
		probe := prompt(i+1, 0)
		ev := stored(probe)
		eventtest.Eventually(t, names[i]+" subscribed", func() bool {
			p.send(0, ev)
			return e.deviceHits(names[i], probe) == 1024
		})
	}
	applied := func() float64 { return metricSum(e.scrape(), "conductor_events_applied_total{") }
	base := applied()

	// A client queries publisher a's latest fully sent prompt throughout.
	var latest atomic.Int64
	var stop atomic.Bool
	var lat []time.Duration
	var queries, failures int
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			p := latest.Load()
			if p == 0 {
				runtime.Gosched()
				continue
			}
			start := time.Now()
			status, _ := e.post("/query", map[string]any{"model": "deepseek", "block_size": 16, "token_ids": prompt(1, int(p)), "instance_id": names[0]})
			lat = append(lat, time.Since(start))
			queries++
			if status != 200 {
				failures++
			}
		}
	}()
	const perMessage, window = 4, 256 // events per batch; batches in flight per publisher
	sent := 0
	for p := 1; p < prompts; p += perMessage {
		for i, pub := range pubs {
			evs := make([]map[string]any, 0, perMessage)
			for q := p; q < min(p+perMessage, prompts); q++ {
				evs = append(evs, stored(prompt(i+1, q)))
			}
			pub.send(0, evs...)
			sent += len(evs)
		}
		latest.Store(int64(p))
		if (p/perMessage)%window == window-1 {
			eventtest.Eventually(t, "the flood's batches applied", func() bool { return applied()-base >= float64(sent) })
		}
	}
	eventtest.Eventually(t, "every batch applied", func() bool { return applied()-base >= float64(sent) })
	stop.Store(true)
	wg.Wait()
	rss := procmem.RSS() - rss0

	if peak := e.app.ix.PeakMemoryBytes(); peak > budget || peak < budget*9/10 {
		t.Errorf("accounted memory peaked at %d bytes against a %d budget (want within it, and filled)", peak, budget)
	}
	text := e.scrape()
	if v := metricValue(text, `conductor_index_evictions_total{kind="context"}`); v <= 0 {
		t.Errorf("evictions counted: %v", v)
	}
	if v := metricValue(text, "conductor_index_memory_limit_bytes"); v != float64(budget) {
		t.Errorf("conductor_index_memory_limit_bytes %v", v)
	}
	if failures > 0 || queries == 0 {
		t.Errorf("%d of %d queries failed during the flood", failures, queries)
	}
	for i := range pubs {
		for p := prompts - 16; p < prompts; p++ {
			if got := e.deviceHits(names[i], prompt(i+1, p)); got != 1024 {
				t.Fatalf("%s's recent prompt %d: %d of 1024 tokens reported", names[i], p, got)
			}
		}
	}
	memos := int64(cfg.MemoBytes + cfg.TokenMemoBytes + cfg.LinkMemoBytes)
	if !racebuild.Enabled && rss > 2*budget+memos {
		t.Errorf("resident size grew by %d MiB: over twice the %d MiB budget plus %d MiB of memos", rss>>20, budget>>20, memos>>20)
	}
	slices.Sort(lat)
	var p99 time.Duration
	if len(lat) > 0 {
		p99 = lat[len(lat)*99/100]
	}
	t.Logf("%d blocks in %d batches, %v evicted, %d queries (p99 %v over HTTP, server p99 under %s s), RSS +%d MiB, peak accounted %d MiB",
		sent*64, sent/perMessage, metricValue(text, `conductor_index_evictions_total{kind="context"}`), queries, p99,
		histogramQuantile(text, "conductor_query_duration_seconds", 0.99), rss>>20, e.app.ix.PeakMemoryBytes()>>20)
}

// histogramQuantile is the upper bound of the first bucket of family's
// histogram that holds the q quantile of its observations ("+Inf" past
// the last bucket, "" without observations).
func histogramQuantile(text, family string, q float64) string {
	total := metricValue(text, family+"_count")
	if total <= 0 {
		return ""
	}
	for _, line := range strings.Split(text, "\n") {
		rest, ok := strings.CutPrefix(line, family+`_bucket{le="`)
		if !ok {
			continue
		}
		le, count, ok := strings.Cut(rest, `"} `)
		if n, err := strconv.ParseFloat(count, 64); ok && err == nil && n >= q*total {
			return le
		}
	}
	return "+Inf"
}
