package main

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/vmihailenco/msgpack/v5"
)

// preparedQuery is a pool query with its request body encoded once, so the
// load loop spends its time on the server's answer, not on packing.
type preparedQuery struct {
	*query
	body []byte
	// paired says what a query interleaved with a paired pass's own
	// measures (see pairedPass).
	paired pairing
}

// pairing is a query's part in a paired pass.
type pairing uint8

const (
	pairedOwn   pairing = iota // the pass's own query
	pairedFloor                // a 2-block query: the fixed cost of a request
	// pairedBody is the pass's query sent for a model nobody stores: the
	// request's cost at the same size (reading, decoding, answering), no
	// lookup; its answer must name no instance.
	pairedBody
)

// failures collects wrong answers and errors from concurrent workers. It
// keeps the first few messages for the report and counts all of them.
type failures struct {
	mu    sync.Mutex
	count atomic.Int64
	first []string
}

const keepFailures = 20

func (f *failures) add(format string, args ...any) {
	if f.count.Add(1) > keepFailures {
		return
	}
	f.mu.Lock()
	f.first = append(f.first, fmt.Sprintf(format, args...))
	f.mu.Unlock()
}

// maxFailures stops a phase early: after this many wrong answers the numbers
// mean nothing and the run has already failed.
const maxFailures = 1000

// sample is one query's start (since the phase began), latency, and the
// index in driver.targets of the server that answered it.
type sample struct {
	start  time.Duration
	lat    time.Duration
	target int
	// cpu is the servers' CPU from the previous answer to this one, with
	// driver.cpu (-1 without); paired is the query's preparedQuery.paired.
	cpu    time.Duration
	paired pairing
}

// driver sends pool queries and checks every answer. With several
// targets each worker sends its queries to them in turn.
type driver struct {
	targets []*api
	pool    []preparedQuery
	ids     []string
	fails   *failures
	// pres says what each instance may look like; nil means all must match.
	pres func(i int) presence
	// states, when set, holds each instance's presence, read at the start
	// and the end of every query (see presenceBetween).
	states []atomic.Uint32
	// cpu, when set, reads the servers' CPU time after every answer, so
	// that each sample carries the CPU spent since the previous one: the
	// query's own, and what the servers did after answering the one
	// before. Only run at concurrency 1 uses it (queries overlap
	// otherwise).
	cpu func() time.Duration
}

// presenceBetween combines an instance's state when a query was sent and
// when its answer arrived: if it was registered throughout, the answer must
// be exact; if its unregistration had completed before the query was sent,
// it must be absent; otherwise the query overlapped the unregistration and
// either is acceptable.
func presenceBetween(before, after presence) presence {
	switch {
	case after == mustMatch:
		return mustMatch
	case before == mustBeGone:
		return mustBeGone
	}
	return mayVanish
}

// worker runs queries until stop is closed, the deadline passes, or it has
// taken limit samples, starting at pool offset first.
func (d *driver) worker(stop <-chan struct{}, t0, deadline time.Time, first, limit int, out *[]sample) {
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	var r queryResponse
	var before, after []presence
	if d.states != nil {
		before = make([]presence, len(d.states))
		after = make([]presence, len(d.states))
	}
	samples := make([]sample, 0, min(limit, 1<<16))
	defer func() { *out = samples }()
	cpu := d.cpu
	prevCPU := time.Duration(-1)
	if cpu != nil {
		prevCPU = cpu()
	}
	for i := first; len(samples) < limit; i++ {
		select {
		case <-stop:
			return
		default:
		}
		if d.fails.count.Load() > maxFailures {
			return
		}
		q := &d.pool[i%len(d.pool)]
		ti := i % len(d.targets)
		a := d.targets[ti]
		req.Reset()
		req.SetRequestURI(a.base + "/query")
		req.Header.SetMethod(fasthttp.MethodPost)
		req.Header.SetContentType("application/msgpack")
		req.SetBodyRaw(q.body)
		for j := range before {
			before[j] = presence(d.states[j].Load())
		}
		start := time.Now()
		if !start.Before(deadline) {
			return
		}
		err := a.hc.DoTimeout(req, resp, requestTimeout)
		lat := time.Since(start)
		for j := range after {
			after[j] = presence(d.states[j].Load())
		}
		sm := sample{start: start.Sub(t0), lat: lat, target: ti, cpu: -1, paired: q.paired}
		if cpu != nil {
			if now := cpu(); now >= 0 && prevCPU >= 0 {
				sm.cpu, prevCPU = now-prevCPU, now
			}
		}
		samples = append(samples, sm)
		switch {
		case err != nil:
			d.fails.add("query %d%s: %v", i%len(d.pool), d.at(ti), err)
			continue
		case resp.StatusCode() != 200:
			d.fails.add("query %d%s: status %d %s", i%len(d.pool), d.at(ti), resp.StatusCode(), describe(resp.Body()))
			continue
		}
		clear(r.Instances)
		if err := msgpack.Unmarshal(resp.Body(), &r); err != nil {
			d.fails.add("query %d%s: decoding answer: %v", i%len(d.pool), d.at(ti), err)
			continue
		}
		pres := d.pres
		switch {
		case q.paired == pairedBody:
			pres = func(int) presence { return mustBeGone }
		case d.states != nil:
			pres = func(j int) presence { return presenceBetween(before[j], after[j]) }
		}
		if err := checkAnswer(&r, q.expect, d.ids, pres); err != nil {
			d.fails.add("query %d (%s)%s: %v", i%len(d.pool), q.kind, d.at(ti), err)
		}
	}
}

// at names target ti in a failure when there are several.
func (d *driver) at(ti int) string {
	if len(d.targets) < 2 {
		return ""
	}
	return " at " + d.targets[ti].base
}

// run starts conc workers that send queries until deadline (and at most
// maxSamples queries in all) and returns every sample, unsorted, with
// starts relative to t0. Closing stop or cancelling ctx ends it early.
func (d *driver) run(ctx context.Context, conc int, t0, deadline time.Time, maxSamples int, stop <-chan struct{}) ([]sample, time.Duration) {
	if conc != 1 {
		d.cpu = nil
	}
	per := make([][]sample, conc)
	quit := make(chan struct{})
	var wg sync.WaitGroup
	for w := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d.worker(quit, t0, deadline, w*len(d.pool)/conc, max(1, maxSamples/conc), &per[w])
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		close(quit)
		<-done
	case <-stop:
		close(quit)
		<-done
	}
	elapsed := time.Since(t0)
	var all []sample
	for _, s := range per {
		all = append(all, s...)
	}
	return all, elapsed
}

// latencies extracts and sorts the latencies of samples.
func latencies(s []sample) []time.Duration {
	out := make([]time.Duration, len(s))
	for i := range s {
		out[i] = s[i].lat
	}
	slices.Sort(out)
	return out
}

// percentile is the nearest-rank percentile (p in [0,1]) of sorted values:
// the smallest value with at least p of all values at or below it. Unlike
// interpolation it always returns a latency that was actually observed,
// which is what a p999 over a few thousand samples should be.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}
