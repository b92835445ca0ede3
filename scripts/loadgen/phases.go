package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// The session's phases around the query levels: waiting for a quiet or
// verified server, the ingest, a restart, and unregistration under load.

// restartServer stops the spawned server gracefully, starts it again on the
// same state directory and measures how long it takes to answer /readyz
// 200: its snapshot loaded, and every publisher's next message (a probe)
// received in order. Then every pool answer is checked again against the
// same expectations.
func (s *session) restartServer(ctx context.Context, d *driver, blockSize int) (*restartResult, error) {
	r := &restartResult{}
	t0 := time.Now()
	old := s.servers[0]
	if err := old.stop(); err != nil {
		return r, fmt.Errorf("stop for restart: %w", err)
	}
	r.StopMS = ms(time.Since(t0))
	t1 := time.Now()
	ns, err := startServer(ctx, old.dir, old.bin, old.so, 10)
	if err != nil {
		return r, fmt.Errorf("restart: %w", err)
	}
	s.servers[0] = ns
	r.ToHealthyMS = ms(time.Since(t1))
	s.apis[0].close()
	a, err := newAPI(ns.base, s.o.authToken, max(slices.Max(s.o.levels), s.o.unregConc, len(s.pubs))+8)
	if err != nil {
		return r, err
	}
	s.apis[0] = a
	d.targets = []*api{a}
	if err := parallel(s.pubs, func(p *publisher) error { return s.awaitProbe(ctx, p, blockSize) }); err != nil {
		return r, err
	}
	for deadline := time.Now().Add(time.Minute); ; {
		status, _, err := a.do("GET", "/readyz", nil, false)
		if err == nil && status == 200 {
			break
		}
		if time.Now().After(deadline) {
			return r, fmt.Errorf("not ready a minute after the restart (last %d, %v)", status, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	r.ToReadyMS = ms(time.Since(t1))
	failed := d.fails.count.Load()
	t2 := time.Now()
	verified, _ := d.run(ctx, 1, t2, t2.Add(5*time.Minute), len(d.pool), nil)
	r.Checked, r.Failures = len(verified), d.fails.count.Load()-failed
	s.logf("restart: stopped in %.0f ms, healthy after %.0f ms, ready after %.0f ms; %d answers checked again, %d wrong",
		r.StopMS, r.ToHealthyMS, r.ToReadyMS, r.Checked, r.Failures)
	return r, ctx.Err()
}

// parallel runs f for every publisher concurrently and returns the first
// error. Each publisher's socket is used by one goroutine only.
func parallel(pubs []*publisher, f func(p *publisher) error) error {
	errs := make([]error, len(pubs))
	var wg sync.WaitGroup
	for i, p := range pubs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = f(p) }()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// probeTimeout bounds the wait for one subscription to connect.
const probeTimeout = 15 * time.Second

// waitQuiet waits, up to quietTimeout, until the servers' CPU time has
// grown by less than quietIdle in each of quietWindows windows in a
// row: until they are done with background work before a phase that
// charges them its CPU: snapshots, evictions and verification that
// ingest left behind.
func (s *session) waitQuiet(ctx context.Context, fl fleet) {
	const (
		quietWindow  = 100 * time.Millisecond
		quietIdle    = 2 * time.Millisecond
		quietWindows = 12 // windows: 1.2 s
		quietTimeout = 15 * time.Second
	)
	start := time.Now()
	prev := total(fl.cpus())
	for quiet := 0; time.Since(start) < quietTimeout && prev >= 0; {
		select {
		case <-ctx.Done():
			return
		case <-time.After(quietWindow):
		}
		now := total(fl.cpus())
		if quiet++; now-prev >= quietIdle {
			quiet = 0
		}
		if quiet == quietWindows {
			s.logf("servers idle after %v", time.Since(start).Round(time.Millisecond))
			return
		}
		prev = now
	}
	s.logf("servers still busy after %v; going on", quietTimeout)
}

// awaitProbe publishes p's probe block until a /query for it, restricted
// to p's instance, shows it on the device tier of every server. A SUB
// socket joins a PUB asynchronously and messages published before that
// are lost; sending the corpus only after the probe arrived means none of
// it is lost, and the first received probe is the server's sequence
// baseline.
func (s *session) awaitProbe(ctx context.Context, p *publisher, blockSize int) error {
	body, err := queryBody(s.o.model, blockSize, p.probeTok, p.instance, false)
	if err != nil {
		return err
	}
	seen := make([]bool, len(s.apis))
	deadline := time.Now().Add(probeTimeout)
	for time.Now().Before(deadline) {
		if err := p.send(p.probe); err != nil {
			return fmt.Errorf("%s: probe: %w", p.instance, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		all := true
		for i, a := range s.apis {
			if seen[i] {
				continue
			}
			status, resp, err := a.do("POST", "/query", body, false)
			if err != nil {
				return err
			}
			if status != 200 {
				return fmt.Errorf("%s: probe query: %d %s", p.instance, status, describe(resp))
			}
			var r queryResponse
			if err := msgpack.Unmarshal(resp, &r); err != nil {
				return fmt.Errorf("%s: probe answer: %w", p.instance, err)
			}
			seen[i] = r.Instances[p.instance].Device == int64(blockSize)
			all = all && seen[i]
		}
		if all {
			return nil
		}
	}
	return fmt.Errorf("%s: probe not visible on every server after %v", p.instance, probeTimeout)
}

// awaitVerified waits until no server has stored blocks waiting for link
// verification (conductor_link_verify_pending_blocks, absent on a server
// without links) and notes how long after the start of ingest that was.
// It returns how many times it read the servers' /metrics.
func (s *session) awaitVerified(ctx context.Context, rep *report) (int, error) {
	start := time.Now()
	deadline := start.Add(s.o.ingestTimeout)
	for polls := 1; ; polls++ {
		waiting, err := s.pendingLinks()
		if err != nil {
			return polls, err
		}
		if waiting == 0 {
			rep.Ingest.VerifiedSeconds = rep.Ingest.Seconds + time.Since(start).Seconds()
			rep.Ingest.VerifiedBlocksPerSec = float64(rep.Ingest.BlocksPublished) / rep.Ingest.VerifiedSeconds
			s.logf("verified in %.0f ms more: %.0f blocks/s until verified", time.Since(start).Seconds()*1000, rep.Ingest.VerifiedBlocksPerSec)
			return polls, nil
		}
		if time.Now().After(deadline) {
			return polls, fmt.Errorf("link verification still waiting for %.0f blocks after %v", waiting, s.o.ingestTimeout)
		}
		select {
		case <-ctx.Done():
			return polls, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// pendingLinks is the stored blocks waiting for link verification on all
// servers.
func (s *session) pendingLinks() (float64, error) {
	waiting := 0.0
	for _, a := range s.apis {
		m, _, err := a.metrics()
		if err != nil {
			return 0, err
		}
		waiting += max(m.value("conductor_link_verify_pending_blocks", nil), 0)
	}
	return waiting, nil
}

// ingest sends every publisher's corpus concurrently and polls
// /global_view until prefix_count reaches want. Every block prompt suffix
// is unique, so the count can only reach want once every message arrived;
// a lost message instead makes its source stale, which /readyz reports.
func (s *session) ingest(ctx context.Context, want int, rep *report) error {
	start := time.Now()
	sendErr := make(chan error, 1)
	go func() {
		sendErr <- parallel(s.pubs, func(p *publisher) error {
			for _, msg := range p.payloads {
				if err := p.send(msg); err != nil {
					return fmt.Errorf("%s: %w", p.instance, err)
				}
			}
			return nil
		})
	}()
	sent := false
	// Never return while senders still use the sockets: session.close
	// closes them, and a ZMQ socket must not be used from two goroutines.
	defer func() {
		if !sent {
			<-sendErr
		}
	}()
	bar := newProgress("ingest", s.o.quiet)
	defer bar.done()
	deadline := start.Add(s.o.ingestTimeout)
	lastStale := time.Time{}
	for {
		n, found, over, err := s.prefixCounts()
		if err != nil {
			return err
		}
		elapsed := time.Since(start)
		bar.update(float64(n), float64(want), fmt.Sprintf("%d/%d blocks, %.0f/s", n, want, float64(n)/elapsed.Seconds()))
		if found && n == want {
			if !sent {
				sent = true
				if err := <-sendErr; err != nil {
					return err
				}
			}
			rep.Ingest.Seconds = elapsed.Seconds()
			rep.Ingest.BlocksPerSec = float64(rep.Ingest.BlocksPublished) / elapsed.Seconds()
			bar.done()
			s.logf("ingested %d blocks in %v: %.0f blocks/s", rep.Ingest.BlocksPublished, elapsed.Round(time.Millisecond), rep.Ingest.BlocksPerSec)
			return nil
		}
		if over > want {
			return fmt.Errorf("prefix_count %d exceeds the %d distinct blocks published", over, want)
		}
		if !sent {
			select {
			case err := <-sendErr:
				sent = true
				if err != nil {
					return err
				}
			default:
			}
		}
		if time.Since(lastStale) > time.Second {
			lastStale = time.Now()
			stale := 0
			for _, a := range s.apis {
				n, err := a.staleSources()
				if err != nil {
					return err
				}
				stale += n
			}
			if stale > 0 {
				return fmt.Errorf("%d source(s) went stale during ingest (a message was lost); prefix_count %d of %d", stale, n, want)
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("ingest timed out after %v: prefix_count %d of %d", s.o.ingestTimeout, n, want)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// prefixCounts reads our context's prefix_count on every server: the
// smallest, whether every server has the context, and the largest.
func (s *session) prefixCounts() (least int, found bool, most int, err error) {
	found = true
	for i, a := range s.apis {
		n, f, err := a.prefixCount(s.o.model, s.cfgBlockSize())
		if err != nil {
			return 0, false, 0, err
		}
		if i == 0 || n < least {
			least = n
		}
		most = max(most, n)
		found = found && f
	}
	return least, found, most, nil
}

func (s *session) cfgBlockSize() int { return s.o.corpus.BlockSize }

// bar shows a time-based progress bar until the returned func is called.
func (s *session) bar(label string, total time.Duration) func() {
	if s.o.quiet {
		return func() {}
	}
	p := newProgress(label, false)
	quit := make(chan struct{})
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				e := time.Since(start)
				p.update(e.Seconds(), total.Seconds(), fmt.Sprintf("%.1fs/%.0fs", e.Seconds(), total.Seconds()))
			}
		}
	}()
	return func() { close(quit); <-done; p.done() }
}

// unregLoadCap bounds the query load of the unregistration phase even if
// unregister calls hang until their own timeouts.
const unregLoadCap = 2 * time.Minute

// unregisterUnderLoad unregisters every publisher, one after another, while
// queries keep running, and measures how long that takes and how slow the
// queries overlapping it get. Answers are still checked: an instance being
// unregistered may vanish, one already unregistered must not appear, the
// others must stay exact.
func (s *session) unregisterUnderLoad(ctx context.Context, d0 *driver, rep *report) error {
	conc := s.o.unregConc
	d := &driver{targets: d0.targets, pool: d0.pool, ids: d0.ids, fails: d0.fails, states: make([]atomic.Uint32, len(d0.ids))}
	f0 := d.fails.count.Load()
	stop := make(chan struct{})
	t0 := time.Now()
	type result struct {
		samples []sample
	}
	out := make(chan result, 1)
	go func() {
		smp, _ := d.run(ctx, conc, t0, t0.Add(unregLoadCap), s.o.maxSamples, stop)
		out <- result{smp}
	}()
	// Let the load reach a steady state first.
	time.Sleep(300 * time.Millisecond)
	uStart := time.Since(t0)
	var slowest, wStart, wEnd time.Duration
	var uerr error
	for i, p := range s.pubs {
		if i == len(s.pubs)-1 && i > 0 && s.o.reclaimWindow > 0 {
			// Every other publisher is gone; the service reclaims their
			// entries now, while the last one's answers stay exact.
			wStart = time.Since(t0)
			time.Sleep(s.o.reclaimWindow)
			wEnd = time.Since(t0)
		}
		// With several servers the publisher is gone only once every
		// server unregistered it; until then it may still answer anywhere.
		d.states[i].Store(uint32(mayVanish))
		for _, a := range s.apis {
			c0 := time.Now()
			if err := a.unregister(p.instance); err != nil {
				uerr = err
				break
			}
			slowest = max(slowest, time.Since(c0))
		}
		if uerr != nil {
			break
		}
		s.registered[i] = false
		d.states[i].Store(uint32(mustBeGone))
	}
	uEnd := time.Since(t0)
	rep.unregEnd = t0.Add(uEnd)
	// Keep querying briefly: answers after the last unregistration must
	// be empty.
	time.Sleep(300 * time.Millisecond)
	close(stop)
	res := <-out
	if uerr != nil {
		return uerr
	}
	var overlapping, inWindow []sample
	for _, smp := range res.samples {
		end := smp.start + smp.lat
		switch {
		case wEnd > 0 && smp.start >= wStart && end <= wEnd:
			inWindow = append(inWindow, smp)
		case smp.start < uEnd && end > uStart:
			overlapping = append(overlapping, smp)
		}
	}
	lat := latencies(overlapping)
	rep.Unreg = unregResult{
		Publishers: len(s.pubs), Concurrency: conc, Seconds: (uEnd - uStart - (wEnd - wStart)).Seconds(),
		MaxCallMS: float64(slowest) / float64(time.Millisecond),
		Queries:   len(overlapping), P99US: us(percentile(lat, 0.99)), WorstUS: us(percentile(lat, 1)),
		Failures: d.fails.count.Load() - f0,
	}
	if wEnd > 0 {
		wl := latencies(inWindow)
		rep.Unreg.Reclaim = &reclaimResult{Seconds: (wEnd - wStart).Seconds(), Queries: len(inWindow),
			P99US: us(percentile(wl, 0.99)), WorstUS: us(percentile(wl, 1))}
	}
	rep.Checked += int64(len(res.samples))
	s.logf("unregistered %d publishers in %v under %d concurrent queries; worst overlapping query %s",
		len(s.pubs), (uEnd - uStart).Round(time.Microsecond), conc, fmtUS(rep.Unreg.WorstUS))

	// The context disappears with its last service, on every server.
	deadline := time.Now().Add(5 * time.Second)
	for _, a := range s.apis {
		for {
			_, found, err := a.prefixCount(s.o.model, s.cfgBlockSize())
			if err != nil {
				return err
			}
			if !found {
				break
			}
			if time.Now().After(deadline) {
				d.fails.add("context %s still in %s/global_view 5s after its last service was unregistered", s.o.model, a.base)
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}
