package main

import (
	"context"
	"runtime"
	"slices"
	"time"

	"github.com/mooncake-conductor-go/conductor/internal/hashing"
)

// chainResult is the bare hash chain of the stored prompts, timed in this
// process on one locked thread, in the same run as the server's figures so
// that their ratio survives the machine's drift. Runs are taken after
// ingest, after the cold pass and after the timed levels; the median is
// the baseline.
type chainResult struct {
	Prompts int       `json:"prompts"`
	RunsUS  []float64 `json:"runs_us_per_prompt"`
	// MedianUS is the median of RunsUS: CPU per prompt of the bare chain.
	MedianUS float64 `json:"median_us_per_prompt"`
}

func (c *chainResult) add(v float64) {
	if v < 0 {
		return
	}
	c.RunsUS = append(c.RunsUS, v)
	s := slices.Sorted(slices.Values(c.RunsUS))
	if n := len(s); n%2 == 1 {
		c.MedianUS = s[n/2]
	} else {
		c.MedianUS = (s[n/2-1] + s[n/2]) / 2
	}
}

// ratio is cpu over the chain's median, or -1 when either is unknown.
func (c *chainResult) ratio(cpu float64) float64 {
	if c == nil || c.MedianUS <= 0 || cpu < 0 {
		return -1
	}
	return cpu / c.MedianUS
}

// chainCPUPerPrompt hashes every prompt's full chain, without a memo, as
// the server would for a query it has never seen, and returns the thread
// CPU per prompt in µs (-1 if unknown). The thread is locked so that its
// CPU clock covers exactly this work.
func chainCPUPerPrompt(p *hashing.Profile, bs int, prompts [][]int32) float64 {
	if len(prompts) == 0 {
		return -1
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	t0 := threadCPU()
	for _, toks := range prompts {
		ch := hashing.AcquireChain()
		ch.Reset(p, bs, toks, "", "")
		for {
			if _, _, ok := ch.Next(); !ok {
				break
			}
		}
		hashing.ReleaseChain(ch)
	}
	t1 := threadCPU()
	if t0 < 0 || t1 <= t0 {
		return -1
	}
	return us(t1-t0) / float64(len(prompts))
}

// threadCPU is the calling thread's CPU time, from its nanosecond clock:
// getrusage's per-thread figure moves in scheduler ticks, and a short
// chain run could read as no time at all.
func threadCPU() time.Duration {
	d, err := clockTime(clockThreadCPUTime)
	if err != nil {
		return -1
	}
	return d
}

// coldResult is --cold-pass: every stored prompt asked once, at
// concurrency 1, none asked before.
type coldResult struct {
	Queries             int     `json:"queries"`
	Seconds             float64 `json:"seconds"`
	ServerCPUPerQueryUS float64 `json:"server_cpu_per_query_us"`
	P50US               float64 `json:"p50_us"`
	P99US               float64 `json:"p99_us"`
	Failures            int64   `json:"failures"`
	// LinkBlocksPerQuery is how many blocks per query took a verified
	// link's digest instead of SHA-256 (-1 when unknown); LinkBytes is
	// the links' memory after the pass.
	LinkBlocksPerQuery float64 `json:"link_blocks_per_query"`
	LinkBytes          float64 `json:"link_bytes"`
	// FloorQueries and PairedFloorUS are the 2-block queries interleaved
	// with the pass's and their server CPU per query (-1: not paired).
	FloorQueries  int     `json:"floor_queries"`
	PairedFloorUS float64 `json:"paired_floor_server_cpu_per_query_us"`
	// PairedBodyUS is the server CPU of the pass's queries sent for a
	// model nobody stores, interleaved likewise (-1: not paired).
	PairedBodyUS float64 `json:"paired_same_size_server_cpu_per_query_us"`
}

// lessFloor is the pass's server CPU per query less its paired floor, -1
// when either is unknown.
func (c *coldResult) lessFloor() float64 {
	if c.PairedFloorUS < 0 || c.ServerCPUPerQueryUS < 0 {
		return -1
	}
	return max(c.ServerCPUPerQueryUS-c.PairedFloorUS, 0)
}

// coldPool encodes the cold pass's queries (every stored prompt once, in
// a random order) before anything is timed.
func coldPool(c *corpus, model string, bin bool) ([]preparedQuery, error) {
	qs := c.coldQueries()
	pool := make([]preparedQuery, len(qs))
	for i := range qs {
		b, err := queryBody(model, c.cfg.BlockSize, qs[i].tokens, "", bin)
		if err != nil {
			return nil, err
		}
		pool[i] = preparedQuery{query: &qs[i], body: b}
	}
	return pool, nil
}

// pairedPass asks every query of pool once at concurrency 1, checking
// every answer, and measures the servers' CPU per query. what names it
// in the log ("cold pass", "warm pass").
//
// With floor (2-block queries, see floorPool), one of them follows each
// query of pool, and then the same query for a model nobody stores
// (body, see bodyPool); each answer is charged the servers' CPU since the
// answer before. The pass's queries and the floors then run under the
// same conditions (an idle vCPU woken for each, the same caches): the
// 2-block floor subtracted from them is this pairing's, PairedFloorUS (a
// floor measured in a phase of its own drifted by 14-56 µs from run to
// run on an idle VM, more than a cold 8K query's own work), and
// PairedBodyUS is what a request of the same size costs without a lookup
// (receiving its body is most of the difference from the floor).
//
// With several servers the queries go to them in turn, so each prompt is
// still new to the server that answers it, and the CPU is all servers'.
func (s *session) pairedPass(ctx context.Context, what string, pool, floor, body []preparedQuery, ids []string, fails *failures, m fleet) (*coldResult, error) {
	mixed := pool
	if len(floor) > 0 {
		mixed = make([]preparedQuery, 0, 3*len(pool))
		for i, q := range pool {
			f := floor[i%len(floor)]
			f.paired = pairedFloor
			mixed = append(mixed, q, f)
			if i < len(body) {
				b := body[i]
				b.paired = pairedBody
				mixed = append(mixed, b)
			}
		}
	}
	d := &driver{targets: s.apis, pool: mixed, ids: ids, fails: fails, pres: func(int) presence { return mustMatch },
		cpu: func() time.Duration { return total(m.cpus()) }}
	ms0, err0 := memoStatsAll(s.apis)
	f0, c0 := fails.count.Load(), total(m.cpus())
	t0 := time.Now()
	samples, elapsed := d.run(ctx, 1, t0, t0.Add(5*time.Minute), len(mixed), nil)
	c1 := total(m.cpus())
	by := splitPaired(samples)
	own, floors := by[pairedOwn], by[pairedFloor]
	lat := latencies(own)
	r := &coldResult{Queries: len(own), Seconds: elapsed.Seconds(), ServerCPUPerQueryUS: perUnit(c0, c1, len(own)),
		P50US: us(percentile(lat, 0.5)), P99US: us(percentile(lat, 0.99)), Failures: fails.count.Load() - f0,
		LinkBlocksPerQuery: -1, LinkBytes: -1, PairedFloorUS: -1, PairedBodyUS: -1}
	if len(floors) > 0 {
		r.FloorQueries = len(floors)
		r.ServerCPUPerQueryUS, r.PairedFloorUS = meanCPU(own), meanCPU(floors)
	}
	if len(by[pairedBody]) > 0 {
		r.PairedBodyUS = meanCPU(by[pairedBody])
	}
	if ms1, err1 := memoStatsAll(s.apis); err0 == nil && err1 == nil && ms0.linkHits >= 0 && ms1.linkHits >= 0 && len(own) > 0 {
		// A floor query's two blocks are links' too (they are stored
		// prompts' first two).
		r.LinkBlocksPerQuery = max(ms1.linkHits-ms0.linkHits-float64(floorBlocks*len(floors)), 0) / float64(len(own))
		r.LinkBytes = ms1.linkBytes
	}
	s.logf("%s: %d queries (and %d 2-block ones) in %v, server CPU/query %s, paired floor %s, same size without a lookup %s, %d wrong", what, r.Queries, r.FloorQueries,
		elapsed.Round(time.Millisecond), fmtUS(r.ServerCPUPerQueryUS), fmtUS(r.PairedFloorUS), fmtUS(r.PairedBodyUS), r.Failures)
	return r, ctx.Err()
}

// splitPaired separates a paired pass's samples by their part.
func splitPaired(samples []sample) (by [pairedBody + 1][]sample) {
	for _, sm := range samples {
		by[sm.paired] = append(by[sm.paired], sm)
	}
	return by
}

// bodyPool is pool's queries for a model nobody stores (pairedBody).
func bodyPool(c *corpus, pool []preparedQuery, model string, bin bool) ([]preparedQuery, error) {
	out := make([]preparedQuery, len(pool))
	for i, q := range pool {
		b, err := queryBody(model+"-nobody", c.cfg.BlockSize, q.tokens, "", bin)
		if err != nil {
			return nil, err
		}
		out[i] = preparedQuery{query: q.query, body: b}
	}
	return out, nil
}

// meanCPU is the samples' mean server CPU in µs, -1 when one of them has
// none.
func meanCPU(samples []sample) float64 {
	var sum time.Duration
	for _, sm := range samples {
		if sm.cpu < 0 {
			return -1
		}
		sum += sm.cpu
	}
	if len(samples) == 0 {
		return -1
	}
	return float64(sum.Nanoseconds()) / 1e3 / float64(len(samples))
}

// awaitRSS polls the server's RSS until it is within 20 % of base or
// limit has passed since from, and returns the seconds since from (-1
// when RSS is unknown).
func awaitRSS(m sampler, base int64, from time.Time, limit time.Duration) float64 {
	if base <= 0 || m.rss() < 0 {
		return -1
	}
	for {
		if m.rss() <= base*6/5 || time.Since(from) >= limit {
			return time.Since(from).Seconds()
		}
		time.Sleep(100 * time.Millisecond)
	}
}
