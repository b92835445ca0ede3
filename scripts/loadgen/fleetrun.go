package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/mooncake-conductor-go/conductor/internal/hashing"
)

// One fleet round: preparing, sending and awaiting a round's messages,
// and the checked queries that run during it.

// prepare hashes and encodes round k's messages, one per slot, and
// records the new prompts' tokens and keys.
func (r *fleetRun) prepare(k int) ([][][]byte, error) {
	cfg := r.c.cfg
	bs, sys := cfg.BlockSize, r.sysBlocks
	out := make([][][]byte, cfg.Publishers)
	toks := make([][][]int32, cfg.Publishers)
	err := parallelIdx(cfg.Publishers, func(p int) error {
		enc := newEncoder()
		ch := hashing.AcquireChain()
		defer hashing.ReleaseChain(ch)
		toks[p] = make([][]int32, r.slots[p].n)
		for j := range r.slots[p].n {
			t := r.fleetTokens(p, j, k)
			keys := chainKeys(ch, r.prof, bs, t)
			if len(keys) != r.blocks {
				return fmt.Errorf("publisher %d slot %d: %d keys for %d blocks", p, j, len(keys), r.blocks)
			}
			msg, err := enc.batchPayload([]any{
				removedEvent(r.s.o.engine, r.keys[p][j][sys:]),
				storedEvent(r.s.o.engine, bs, keys[sys:], &keys[sys-1], t[sys*bs:]),
			})
			if err != nil {
				return err
			}
			out[p] = append(out[p], msg)
			toks[p][j], r.keys[p][j] = t, keys
		}
		return nil
	})
	r.tokens[k] = toks
	return out, err
}

// send publishes every publisher's messages, each from its own goroutine,
// at rate block operations a second in all (0: at once). The sent
// count is raised before each message leaves.
func (r *fleetRun) send(ctx context.Context, payloads [][][]byte, rate float64) error {
	return parallel(r.s.pubs, func(p *publisher) error {
		var every time.Duration
		if rate > 0 {
			every = time.Duration(float64(time.Second) * float64(r.res.OpsPerMessage*len(r.s.pubs)) / rate)
		}
		next := time.Now().Add(every * time.Duration(p.idx) / time.Duration(len(r.s.pubs)))
		for _, msg := range payloads[p.idx] {
			if every > 0 {
				if d := time.Until(next); d > 0 && !sleepCtx(ctx, d) {
					return ctx.Err()
				}
				next = next.Add(every)
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			r.sent[p.idx].Add(1)
			if err := p.send(msg); err != nil {
				return fmt.Errorf("%s: %w", p.instance, err)
			}
		}
		return nil
	})
}

// eventsDone is the server's events applied, ignored and rejected, all
// sources together.
func (r *fleetRun) eventsDone() (float64, error) {
	m, _, err := r.s.apis[0].metrics()
	if err != nil {
		return 0, err
	}
	return m.sum("conductor_events_applied_total") + m.sum("conductor_events_ignored_total") + m.sum("conductor_events_rejected_total"), nil
}

// dropCounters reads what the server dropped on purpose: index evictions
// and shed link verifications (-1 each when unreadable).
func (r *fleetRun) dropCounters() (evictions, shed int64) {
	m, _, err := r.s.apis[0].metrics()
	if err != nil {
		return -1, -1
	}
	return int64(m.sum("conductor_index_evictions_total")), int64(m.sum("conductor_link_verify_shed_total"))
}

// awaitApplied waits until the server has taken want events, each
// publisher's last message shows in an answer, and no stored block waits
// for verification. It returns how many times it read /metrics.
func (r *fleetRun) awaitApplied(ctx context.Context, want float64, sendErr <-chan error) (int, error) {
	deadline := time.Now().Add(r.s.o.ingestTimeout)
	sending := true
	polls := 0
	for stage := 0; stage < 3; {
		if sending {
			select {
			case err := <-sendErr:
				sending = false
				if err != nil {
					return polls, err
				}
			default:
			}
		}
		switch stage {
		case 0:
			polls++
			n, err := r.eventsDone()
			if err != nil {
				return polls, err
			}
			if n >= want && !sending {
				stage++
				continue
			}
		case 1:
			ok, err := r.lastVisible()
			if err != nil {
				return polls, err
			}
			if ok {
				stage++
				continue
			}
		case 2:
			polls++
			waiting, err := r.s.pendingLinks()
			if err != nil {
				return polls, err
			}
			if waiting == 0 {
				stage++
				continue
			}
		}
		if time.Now().After(deadline) {
			return polls, fmt.Errorf("fleet round not applied and verified after %v (stage %d)", r.s.o.ingestTimeout, stage)
		}
		if !sleepCtx(ctx, 20*time.Millisecond) {
			return polls, ctx.Err()
		}
	}
	return polls, nil
}

// lastVisible asks, for every publisher, the prompt its last message
// stored, restricted to that publisher: whole, every message of it is
// applied (a source's messages and a batch's events apply in order).
func (r *fleetRun) lastVisible() (bool, error) {
	bs := r.c.cfg.BlockSize
	for p := range r.s.pubs {
		n := r.sent[p].Load()
		if n == 0 {
			continue
		}
		sl := &r.slots[p]
		j, k := int((n-1)%int64(sl.n)), int((n-1)/int64(sl.n))+1
		body, err := queryBody(r.s.o.model, bs, r.tokens[k][p][j], r.ids[p], r.s.o.binTokens)
		if err != nil {
			return false, err
		}
		status, resp, err := r.s.apis[0].do(fasthttp.MethodPost, "/query", body, false)
		if err != nil {
			return false, err
		}
		if status != 200 {
			return false, fmt.Errorf("%s: last-message query: %d %s", r.ids[p], status, describe(resp))
		}
		var qr queryResponse
		if err := msgpack.Unmarshal(resp, &qr); err != nil {
			return false, err
		}
		if qr.Instances[r.ids[p]].LongestMatched != int64(r.blocks*bs) {
			return false, nil
		}
	}
	return true, nil
}

// fleetQuery is one query of the fleet phase: slot j of publisher p at
// round k.
type fleetQuery struct{ p, j, k int }

// pick chooses a query: a random slot, asking either the prompt its
// publisher sent last for it or the one that replaced before.
func (r *fleetRun) pick(rng *rand.Rand) fleetQuery {
	p := rng.IntN(len(r.slots))
	j := rng.IntN(r.slots[p].n)
	k := r.slots[p].version(r.sent[p].Load(), j)
	if k > 0 && rng.IntN(2) == 0 {
		k--
	}
	return fleetQuery{p, j, k}
}

// ask sends q and checks its answer against the model; it returns the
// latency and false when the request itself failed.
func (r *fleetRun) ask(a *api, q fleetQuery) (time.Duration, bool) {
	bs := r.c.cfg.BlockSize
	body, err := queryBody(r.s.o.model, bs, r.tokens[q.k][q.p][q.j], "", r.s.o.binTokens)
	if err != nil {
		r.fails.add("fleet query: %v", err)
		return 0, false
	}
	applied := r.applied[q.p].Load()
	t0 := time.Now()
	status, resp, err := a.do(fasthttp.MethodPost, "/query", body, false)
	lat := time.Since(t0)
	sent := r.sent[q.p].Load()
	switch {
	case err != nil:
		r.fails.add("fleet query %v: %v", q, err)
		return lat, false
	case status != 200:
		r.fails.add("fleet query %v: status %d %s", q, status, describe(resp))
		return lat, false
	}
	var qr queryResponse
	if err := msgpack.Unmarshal(resp, &qr); err != nil {
		r.fails.add("fleet query %v: decoding answer: %v", q, err)
		return lat, false
	}
	r.answers.Add(1)
	r.check(&qr, q, applied, sent)
	return lat, true
}

// check compares one answer with the model. The queried slot's publisher
// may be anywhere between its marks; every other publisher holds only the
// group's system prompt of this prompt (or nothing of it), which no
// message moves, so its entry is exact.
func (r *fleetRun) check(qr *queryResponse, q fleetQuery, applied, sent int64) {
	bs := r.c.cfg.BlockSize
	g := r.slots[q.p].group[q.j]
	seen := 0
	for i, id := range r.ids {
		h, ok := qr.Instances[id]
		if !ok {
			r.fails.add("fleet query %v: %s missing from the answer", q, id)
			continue
		}
		seen++
		if err := consistentHit(id, h); err != nil {
			r.fails.add("fleet query %v: %v", q, err)
			continue
		}
		lo, hi := 0, 0
		if i == q.p {
			lo, hi = r.slots[i].bounds(q.j, q.k, applied, sent, r.sysBlocks, r.blocks)
		} else if r.holdsGroup[i][g] {
			lo, hi = r.sysBlocks, r.sysBlocks
		}
		switch judge(h.LongestMatched, lo, hi, bs) {
		case verdictExact:
			r.exact.Add(1)
		case verdictRange:
			r.ranged.Add(1)
		case verdictAbove:
			r.above.Add(1)
			r.fails.add("fleet query %v: %v: %s longest_matched=%d above the model's %d..%d", q, errMismatch, id, h.LongestMatched, lo*bs, hi*bs)
		case verdictBelow:
			r.below.Add(1)
			r.noteBelow(fmt.Sprintf("fleet query %v: %s longest_matched=%d below the model's %d..%d", q, id, h.LongestMatched, lo*bs, hi*bs))
		}
		// A whole prompt seen means its message was applied, and every
		// message of that publisher before it.
		if i == q.p && q.k >= 1 && h.LongestMatched == int64(r.blocks*bs) {
			m := r.slots[i].message(q.j, q.k)
			for {
				cur := r.applied[i].Load()
				if cur >= m || r.applied[i].CompareAndSwap(cur, m) {
					break
				}
			}
		}
	}
	if seen != len(qr.Instances) {
		r.fails.add("fleet query %v: %d instances in the answer, %d known", q, len(qr.Instances), seen)
	}
}

// noteBelow keeps the first few answers below the model for the report;
// they fail the run only when the server dropped nothing (see fleetPhase).
func (r *fleetRun) noteBelow(note string) {
	r.rssMu.Lock()
	if len(r.belowNotes) < keepFailures {
		r.belowNotes = append(r.belowNotes, note)
	}
	r.rssMu.Unlock()
}

// queryWorker asks checked queries until stop is closed.
func (r *fleetRun) queryWorker(stop <-chan struct{}, t0 time.Time, seed uint64) []sample {
	rng := rand.New(rand.NewPCG(r.c.cfg.Seed, seed))
	var out []sample
	a := r.s.apis[0]
	for {
		select {
		case <-stop:
			return out
		default:
		}
		if r.fails.count.Load() > maxFailures {
			return out
		}
		q := r.pick(rng)
		start := time.Now()
		if lat, ok := r.ask(a, q); ok {
			out = append(out, sample{start: start.Sub(t0), lat: lat, cpu: -1})
		}
	}
}

// checkQuiet asks, with nothing in flight, a few slots of every
// publisher for their round-k prompt and the one it replaced: every
// bound is exact.
func (r *fleetRun) checkQuiet(k int) {
	rng := rand.New(rand.NewPCG(r.c.cfg.Seed^0xc4ec, uint64(k)))
	for p := range r.slots {
		for range 8 {
			j := rng.IntN(r.slots[p].n)
			for _, kk := range []int{k, k - 1} {
				r.ask(r.s.apis[0], fleetQuery{p, j, kk})
			}
		}
	}
}

// sampleRSS reads the server's RSS every 50 ms until the returned func is
// called, keeping each round's largest reading.
func (r *fleetRun) sampleRSS(m sampler) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
			}
			v, k := m.rss(), int(r.cur.Load())
			r.rssMu.Lock()
			r.rssMax[k] = max(r.rssMax[k], v)
			r.rssMu.Unlock()
		}
	}()
	return func() { close(quit); <-done }
}

// parallelIdx runs f(0..n-1) concurrently and returns every error.
func parallelIdx(n int, f func(i int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = f(i) }()
	}
	wg.Wait()
	return errors.Join(errs...)
}
