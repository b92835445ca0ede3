package main

import (
	"context"
	"time"
)

// floorBlocks is the size of a --floor query in blocks: the smallest
// prompt that still hashes and walks, so its server CPU is the fixed cost
// of one /query request (read, route, decode, encode, write) on this
// machine, which a per-query ratio against the bare chain should not be
// charged with.
const floorBlocks = 2

// floorQueries is how many --floor queries are timed: enough that the
// server CPU read from /proc (in clock ticks) is exact to a few percent.
const floorQueries = 20000

// floorResult is --floor: 2-block queries at concurrency 1, in the same
// run as the cold pass and the levels, so the request's fixed cost can be
// subtracted from theirs.
type floorResult struct {
	Queries             int     `json:"queries"`
	ServerCPUPerQueryUS float64 `json:"server_cpu_per_query_us"`
	P50US               float64 `json:"p50_us"`
	P99US               float64 `json:"p99_us"`
	Failures            int64   `json:"failures"`
}

// floorPool is the first two blocks of every stored prompt, each with its
// expected answer, encoded before anything is timed.
func floorPool(c *corpus, model string, bin bool) ([]preparedQuery, error) {
	bs := c.cfg.BlockSize
	var qs []query
	for _, p := range c.prompts {
		if len(p.tokens) < floorBlocks*bs {
			continue
		}
		toks := p.tokens[:floorBlocks*bs]
		qs = append(qs, query{kind: kindFull, tokens: toks, expect: c.trie.expect(toks)})
	}
	pool := make([]preparedQuery, len(qs))
	for i := range qs {
		b, err := queryBody(model, bs, qs[i].tokens, "", bin)
		if err != nil {
			return nil, err
		}
		pool[i] = preparedQuery{query: &qs[i], body: b}
	}
	return pool, nil
}

// floorPass asks floorQueries 2-block queries at concurrency 1, checking
// every answer, and measures the server's CPU per query.
func (s *session) floorPass(ctx context.Context, pool []preparedQuery, ids []string, fails *failures, m fleet) (*floorResult, error) {
	if len(pool) == 0 {
		return nil, nil
	}
	d := &driver{targets: s.apis, pool: pool, ids: ids, fails: fails, pres: func(int) presence { return mustMatch }}
	f0, c0 := fails.count.Load(), total(m.cpus())
	t0 := time.Now()
	samples, elapsed := d.run(ctx, 1, t0, t0.Add(time.Minute), floorQueries, nil)
	c1 := total(m.cpus())
	lat := latencies(samples)
	r := &floorResult{Queries: len(samples), ServerCPUPerQueryUS: perUnit(c0, c1, len(samples)),
		P50US: us(percentile(lat, 0.5)), P99US: us(percentile(lat, 0.99)), Failures: fails.count.Load() - f0}
	s.logf("2-block floor: %d queries in %v, server CPU/query %s, %d wrong", r.Queries, elapsed.Round(time.Millisecond), fmtUS(r.ServerCPUPerQueryUS), r.Failures)
	return r, ctx.Err()
}

// lessFloor is cpu minus the floor's server CPU per query, or -1 when
// either is unknown.
func (f *floorResult) lessFloor(cpu float64) float64 {
	if f == nil || f.ServerCPUPerQueryUS < 0 || cpu < 0 {
		return -1
	}
	return max(cpu-f.ServerCPUPerQueryUS, 0)
}
