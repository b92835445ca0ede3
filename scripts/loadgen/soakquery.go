package main

// The soak's query workers: prompts built around what the publishers hold,
// and every answer checked against the publishers' models.

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/vmihailenco/msgpack/v5"
)

// queryStats are one worker's latencies (bounded) and counts.
type queryStats struct {
	lat []time.Duration
}

// slowQuery is the latency above which a query is counted as slow, and
// checked against the unregistration windows: a server that blocks queries
// while a service is torn down shows up as slow queries inside them.
const slowQuery = 100 * time.Millisecond

// maxLatencies bounds each worker's latency samples.
const maxLatencies = 250_000

// queryWorker sends prompts built around what the publishers hold, have
// just evicted or are about to store, and checks every answer against the
// versions of each publisher's state that may have been applied while the
// query was in flight.
func (r *soakRun) queryWorker(ctx context.Context, w int, st *queryStats) {
	sh := r.shape
	rng := rand.New(rand.NewPCG(r.o.corpus.Seed, 0x900d+uint64(w)))
	marks := make([]mark, len(r.pubs))
	exps := make([]expectation, len(r.pubs))
	var resp queryResponse
	// Bounded by time (ctx has a deadline) and by count.
	for i := 0; i < maxLoop; i++ {
		if ctx.Err() != nil || r.fails.count.Load() > maxFailures {
			return
		}
		pub := rng.IntN(len(r.pubs))
		q, toks := r.buildQuery(rng, pub, int(r.pubs[pub].step.Load()))
		body, err := queryBody(r.o.model, sh.bs, toks, "", r.o.binTokens && i%2 == 0)
		if err != nil {
			r.fails.add("encode query: %v", err)
			return
		}
		for j, p := range r.pubs {
			marks[j] = p.model.mark()
		}
		t0 := time.Now()
		status, out, err := r.api.do(fasthttp.MethodPost, "/query", body, false)
		t1 := time.Now()
		if len(st.lat) < maxLatencies {
			st.lat = append(st.lat, t1.Sub(t0))
		}
		if t1.Sub(t0) > slowQuery {
			r.counts.slow.Add(1)
			if r.windows.overlaps(t0, t1) {
				r.counts.slowInUnreg.Add(1)
			}
		}
		r.counts.queries.Add(1)
		switch {
		case err != nil:
			if r.windows.overlaps(t0, t1) {
				r.counts.transportInside.Add(1)
			} else {
				r.counts.transportOutside.Add(1)
				r.fails.add("query: %v", err)
			}
			continue
		case status >= 500:
			r.counts.fiveXX.Add(1)
			r.fails.add("query: status %d %s", status, describe(out))
			continue
		case status != 200:
			r.counts.otherStatus.Add(1)
			r.fails.add("query: status %d %s", status, describe(out))
			continue
		}
		clear(resp.Instances)
		if err := msgpack.Unmarshal(out, &resp); err != nil {
			r.counts.wrong.Add(1)
			r.fails.add("query: decoding answer: %v", err)
			continue
		}
		exact, unchecked := true, false
		var nExact, nRange, nPresence int64
		for j, p := range r.pubs {
			e := p.model.expect(marks[j], &q, sh.sysBlocks)
			exps[j] = e
			switch {
			case e.pres == mayVanish:
				nPresence++
			case e.lo != e.hi:
				nRange++
			default:
				nExact++
			}
			exact = exact && e.pres != mayVanish && e.lo == e.hi
			unchecked = unchecked || e.unchecked
		}
		switch {
		case unchecked:
			r.counts.unchecked.Add(1)
			continue
		case exact:
			r.counts.exact.Add(1)
		default:
			r.counts.tolerant.Add(1)
		}
		r.counts.entryExact.Add(nExact)
		r.counts.entryRange.Add(nRange)
		r.counts.entryPresence.Add(nPresence)
		isGone := func(id string) bool { return r.gone.before(id, t0) }
		if err := checkSoakAnswer(&resp, r.ids, exps, sh.bs, r.prefix, isGone); err != nil {
			r.counts.wrong.Add(1)
			r.fails.add("%s query (source %#x, keep %d blocks): %v", q.kind, uint64(q.source), q.keep, err)
		}
	}
}

// buildQuery draws a query around publisher pub's step cur: its source is
// a content the publisher stored a little before the window's oldest,
// holds, or is about to store, so answers cover evicted, held and
// not-yet-stored prompts. Kinds: 40 % full, 30 % partial (a random number
// of the source's blocks, then fresh tokens), 20 % a system prompt then
// fresh tokens, 10 % cold.
func (r *soakRun) buildQuery(rng *rand.Rand, pub, cur int) (soakQuery, []int32) {
	sh := r.shape
	fresh := func(t []int32) {
		for i := range t {
			t[i] = rng.Int32N(sh.vocab)
		}
	}
	step := max(1, cur-r.cfg.window-2+rng.IntN(r.cfg.window+4))
	src := contentAt(pub, step)
	var q soakQuery
	var toks []int32
	switch k := rng.IntN(10); {
	case k < 4:
		q = soakQuery{kind: kindFull, source: src, group: sh.group(src), keep: sh.blocks}
		toks = sh.tokens(src)
	case k < 7:
		q = soakQuery{kind: kindPartial, source: src, group: sh.group(src), keep: 1 + rng.IntN(sh.blocks-1)}
		toks = sh.tokens(src)
		fresh(toks[q.keep*sh.bs:])
	case k < 9:
		q = soakQuery{kind: kindSystem, group: rng.IntN(sh.groups), keep: sh.sysBlocks}
		toks = make([]int32, sh.blocks*sh.bs)
		copy(toks, sh.systems[q.group])
		fresh(toks[len(sh.systems[q.group]):])
	default:
		q = soakQuery{kind: kindCold}
		toks = make([]int32, sh.blocks*sh.bs)
		fresh(toks)
	}
	return q, toks
}
