package main

// Soak mode (--soak DURATION): ingestion, queries and registration churn run
// together for a bounded time, then the run asserts that the server reached
// a steady state: stable RSS, a stable goroutine count, no wrong answers, no
// 5xx and no transport errors. It exists to catch what short benchmarks
// cannot: entries or goroutines leaked per eviction, clear or
// re-registration, and races between ingestion, queries and registration
// changes that only show up after thousands of interleavings.
//
// Timeline: publishers register and confirm their subscriptions before the
// clock starts. Then, for the whole duration, every publisher stores a new
// prompt and evicts its oldest (or clears everything) once per
// --soak-op-interval, query workers send prompts built around what the
// publishers hold and check every answer, and a churn worker restarts a
// subset of publishers (unregistered then registered on a new port or on
// the same port, or restarted in place while registered, which the server
// must notice as a publisher restart, a new epoch) and registers short-lived services
// whose endpoints have nothing behind them. A sampler reads the server's RSS from /proc and
// go_goroutines from /metrics. At the end of the warm-up and at the end of
// the run the churn worker is paused until nothing it started is left (the
// quiescent points), so both goroutine counts are taken with the same set of
// registrations; queries and publishing keep running through both, so the
// HTTP connections are the same too.
//
// Checks: every answer is compared with what each publisher's model allows
// (soakmodel.go): exactly one value where nothing changed during the query,
// a range where a batch was in flight, absence where the publisher was
// unregistered throughout. RSS may not grow by more than --soak-rss-tolerance
// from its post-warm-up level to its final one (medians of a few samples);
// a drop is not a leak and passes. Goroutines and open fds may not grow by
// more than --soak-goroutine-slack between the quiescent points. At the end
// every service is unregistered and the soak's contexts must vanish.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/mooncake-conductor-go/conductor/internal/hashing"
)

// soakConfig holds the soak's own flags.
type soakConfig struct {
	duration       time.Duration
	warmup         float64 // fraction of duration
	publishers     int
	churned        int // publishers the churn worker restarts
	window         int // prompts each publisher holds
	promptTokens   int
	systemTokens   int
	groups         int
	opInterval     time.Duration
	clearEvery     int
	queryConc      int
	churnInterval  time.Duration
	transients     int // short-lived services alive at once, at most
	rssTolerance   float64
	goroutineSlack int
	sampleInterval time.Duration // 0: duration/60 within [100ms, 2s]
	// memoMiB sizes a spawned server's prefix memo (-1: the
	// server's default). The memo is a bounded cache that fills at the
	// rate queries bring new blocks; at its default size it takes minutes
	// to fill at soak rates, so RSS would still be climbing, legitimately,
	// long after warm-up. A memo that wraps within the warm-up makes the
	// RSS assertion test that it stays bounded while it keeps evicting.
	memoMiB int
}

func (c *soakConfig) addFlags(fs *flag.FlagSet) {
	fs.DurationVar(&c.duration, "soak", 0, "run the soak test for this long instead of the benchmark (e.g. 60s, 10m)")
	fs.Float64Var(&c.warmup, "soak-warmup", 0.2, "fraction of the soak before the steady-state levels are taken")
	fs.IntVar(&c.publishers, "soak-publishers", 6, "publishers in the soak")
	fs.IntVar(&c.churned, "soak-churned", 3, "publishers the churn worker unregisters and re-registers (fewer than --soak-publishers)")
	fs.IntVar(&c.window, "soak-window", 8, "prompts each soak publisher holds before evicting the oldest")
	fs.IntVar(&c.promptTokens, "soak-prompt-tokens", 1024, "tokens per soak prompt")
	fs.IntVar(&c.systemTokens, "soak-system-tokens", 256, "tokens of each soak group's system prompt")
	fs.IntVar(&c.groups, "soak-groups", 4, "system prompts in the soak")
	fs.DurationVar(&c.opInterval, "soak-op-interval", 20*time.Millisecond, "time between two steps of one publisher")
	fs.IntVar(&c.clearEvery, "soak-clear-every", 50, "every Nth step of a publisher clears all its blocks first (0: never)")
	fs.IntVar(&c.queryConc, "soak-query-concurrency", 4, "query workers")
	fs.DurationVar(&c.churnInterval, "soak-churn-interval", 250*time.Millisecond, "time between two churn actions")
	fs.IntVar(&c.transients, "soak-transients", 3, "short-lived dead-endpoint services alive at once, at most")
	fs.Float64Var(&c.rssTolerance, "soak-rss-tolerance", 0.2, "allowed RSS growth over the post-warm-up level, as a fraction")
	fs.IntVar(&c.goroutineSlack, "soak-goroutine-slack", 10, "allowed goroutine growth over the post-warm-up level")
	fs.IntVar(&c.memoMiB, "soak-memo-mib", 2, "--hash-memo-mib, --token-memo-mib and --link-memo-mib for a spawned server, small so that the memos wrap during warm-up (-1: the server's defaults)")
	fs.DurationVar(&c.sampleInterval, "soak-sample-interval", 0, "RSS and goroutine sampling interval (default duration/60, within 100ms..2s)")
}

func (c *soakConfig) validate() error {
	switch {
	case c.duration < 0 || c.duration > 24*time.Hour:
		return fmt.Errorf("--soak must be in (0, 24h]")
	case c.warmup <= 0 || c.warmup >= 0.8:
		return fmt.Errorf("--soak-warmup must be in (0, 0.8)")
	case c.publishers < 2 || c.publishers > 1000:
		return fmt.Errorf("--soak-publishers must be in 2..1000")
	case c.churned < 0 || c.churned >= c.publishers:
		return fmt.Errorf("--soak-churned must be in 0..publishers-1: one publisher always stays, so the context does")
	case c.window < 1 || c.window > 64:
		return fmt.Errorf("--soak-window must be in 1..64")
	case c.groups < 1 || c.groups > 1024:
		return fmt.Errorf("--soak-groups must be in 1..1024")
	case c.opInterval < 0 || c.churnInterval <= 0:
		return fmt.Errorf("--soak-op-interval must not be negative, --soak-churn-interval must be positive")
	case c.clearEvery < 0:
		return fmt.Errorf("--soak-clear-every must not be negative")
	case c.queryConc < 1 || c.queryConc > 1024:
		return fmt.Errorf("--soak-query-concurrency must be in 1..1024")
	case c.transients < 0 || c.transients > 100:
		return fmt.Errorf("--soak-transients must be in 0..100")
	case c.rssTolerance <= 0 || c.goroutineSlack < 0:
		return fmt.Errorf("--soak-rss-tolerance must be positive, --soak-goroutine-slack not negative")
	}
	if c.sampleInterval == 0 {
		c.sampleInterval = min(max(c.duration/60, 100*time.Millisecond), 2*time.Second)
	}
	return nil
}

// soakCounts are the workers' shared counters.
type soakCounts struct {
	queries, exact, tolerant, unchecked atomic.Int64
	wrong, fiveXX, otherStatus          atomic.Int64
	transportOutside, transportInside   atomic.Int64
	controlErrors                       atomic.Int64
	transients, transientFailures       atomic.Int64
	slow, slowInUnreg                   atomic.Int64
	// Per publisher entry of an answer: one exact value, a range (a batch
	// in flight), or a registration change (absence allowed).
	entryExact, entryRange, entryPresence atomic.Int64
	restartMode                           [numRestartModes]atomic.Int64
	restartsDetected                      atomic.Int64 // in-place restarts the server counted
}

// soakRun is one soak in progress.
type soakRun struct {
	o       *options
	cfg     soakConfig
	api     *api
	zctx    *zmq.Context
	shape   *soakShape
	prof    hashing.Profile
	pubs    []*soakPublisher
	ids     []string
	prefix  string // of transient services' instance ids
	fails   *failures
	counts  soakCounts
	windows windowLog
	gone    goneSet
	ipcDir  string
	// staleAtStart is staleTransitions before the soak: a server that was
	// not spawned may have a history.
	staleAtStart [2]int64
}

// soakMain runs the soak, prints its summary and returns the exit status:
// 0 only if every assertion held.
func soakMain(ctx context.Context, o *options) int {
	rep, err := runSoak(ctx, o)
	if rep == nil {
		fmt.Fprintln(os.Stderr, "loadgen: soak:", err)
		return 1
	}
	if o.json {
		rep.writeMarkdown(os.Stderr)
		if jerr := rep.writeJSON(os.Stdout); jerr != nil {
			fmt.Fprintln(os.Stderr, "loadgen:", jerr)
			return 1
		}
	} else {
		rep.writeMarkdown(os.Stdout)
	}
	if !rep.passed() {
		fmt.Fprintln(os.Stderr, "loadgen: soak failed")
		return 1
	}
	return 0
}

// runSoak runs the whole soak and returns its report; err is for failures
// that prevented a verdict (setup), not for failed assertions.
func runSoak(ctx context.Context, o *options) (rep *soakReport, err error) {
	cfg := o.soak
	r := &soakRun{o: o, cfg: cfg, fails: &failures{}, prefix: o.model + "-transient-"}
	var server *spawned
	defer func() {
		if cerr := r.close(server); cerr != nil && err == nil {
			err = cerr
		}
		if rep != nil {
			rep.finish(r.fails, err)
		}
	}()
	base := o.baseURL
	if o.spawn {
		repo := o.repo
		if repo == "" {
			if repo, err = findRepoRoot(); err != nil {
				return nil, err
			}
		}
		if server, err = spawnServer(ctx, repo, o.serverOptions()); err != nil {
			return nil, err
		}
		base = server.base
		o.serverPID = server.pid()
		r.logf("server pid %d at %s", o.serverPID, base)
	}
	if r.api, err = newAPI(base, o.authToken, cfg.queryConc+cfg.publishers+16); err != nil {
		return nil, err
	}
	if !r.api.healthy() {
		return nil, fmt.Errorf("%s/healthz does not answer 200", base)
	}
	if r.shape, err = newSoakShape(o.corpus.BlockSize, cfg.promptTokens, cfg.systemTokens, cfg.groups, o.corpus.Vocab, o.corpus.Seed); err != nil {
		return nil, err
	}
	if r.prof, err = hashing.Resolve(o.engine.hashSpec()); err != nil {
		return nil, fmt.Errorf("hash profile: %w", err)
	}
	if r.zctx, err = zmq.NewContext(); err != nil {
		return nil, err
	}
	if r.ipcDir, err = os.MkdirTemp("", "loadgen-soak-ipc-"); err != nil {
		return nil, err
	}
	for i := range cfg.publishers {
		p, err := r.newSoakPublisher(i)
		if err != nil {
			return nil, err
		}
		p.chain = hashing.AcquireChain()
		r.pubs = append(r.pubs, p)
		r.ids = append(r.ids, p.instance)
	}
	rep = r.newReport()
	rep.LoadAverage[0] = loadAverage()
	sm := sampler{pid: o.serverPID}
	rep.RSSStart = sm.rss()
	return rep, r.soak(ctx, rep)
}

// soak runs the timeline; the report is filled in whatever happens.
func (r *soakRun) soak(parent context.Context, rep *soakReport) error {
	cfg := r.cfg
	ctx, cancel := context.WithCancelCause(parent)
	defer cancel(nil)
	// fatal ends the soak early: a publisher whose model no longer
	// matches the server, or a control call that failed, makes every later
	// check meaningless.
	fatal := func(err error) {
		r.fails.add("%v", err)
		cancel(err)
	}

	// Publishers join first; the clock starts when all are live.
	pubCtx, stopPubs := context.WithCancel(ctx)
	joined := make(chan struct{}, len(r.pubs))
	var pubWG sync.WaitGroup
	for _, p := range r.pubs {
		pubWG.Add(1)
		go func() {
			defer pubWG.Done()
			if err := p.run(pubCtx, joined); err != nil && pubCtx.Err() == nil {
				fatal(err)
			}
		}()
	}
	defer func() { stopPubs(); pubWG.Wait() }()
	for range r.pubs {
		select {
		case <-joined:
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(2 * probeTimeout):
			return errors.New("publishers did not join in time")
		}
	}
	r.logf("%d publishers live; soaking for %v (warm-up %v)", len(r.pubs), cfg.duration, r.warmupDuration())
	m, err := r.metrics()
	if err != nil {
		return err
	}
	r.staleAtStart[0], r.staleAtStart[1] = staleTransitions(m)

	start := time.Now()
	end := start.Add(cfg.duration)
	// Workers stop at the hard deadline even if the coordinator is stuck;
	// the margin covers the final quiescence and winding down.
	hardStop := end.Add(2*requestTimeout + windDownTimeout)
	workCtx, stopWork := context.WithDeadline(ctx, hardStop)
	defer stopWork()

	var wg sync.WaitGroup
	samples := &sampleLog{}
	wg.Add(1)
	go func() { defer wg.Done(); r.sampleLoop(workCtx, start, samples) }()
	qstats := make([]queryStats, cfg.queryConc)
	for w := range cfg.queryConc {
		wg.Add(1)
		go func() { defer wg.Done(); r.queryWorker(workCtx, w, &qstats[w]) }()
	}
	churn := newChurn(r)
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := churn.run(workCtx); err != nil && workCtx.Err() == nil {
			fatal(err)
		}
	}()
	// However the soak ends, stop every worker, then fill in the report:
	// an aborted soak still shows what it measured until then.
	var warmEnd time.Duration
	defer func() {
		stopWork()
		wg.Wait()
		stopPubs()
		pubWG.Wait()
		rep.Seconds = time.Since(start).Seconds()
		n, share, slowest := r.windows.stats(start, time.Now())
		rep.Unregistrations, rep.UnregShare, rep.SlowestUnregMS = n, share, ms(slowest)
		rep.Samples = samples.get()
		if warmEnd > 0 {
			rep.Warmup.RSS, rep.Final.RSS, rep.PeakRSS = rssLevels(rep.Samples, warmEnd)
		}
		for _, s := range rep.Samples {
			rep.MaxStale = max(rep.MaxStale, s.Stale)
		}
		r.collect(rep, qstats)
		if err := r.serverCounts(rep); err != nil {
			r.counts.controlErrors.Add(1)
			r.fails.add("final metrics: %v", err)
		}
		rep.TeardownLeft = r.teardown()
	}()

	stopBar := r.bar("soak", cfg.duration)
	defer stopBar()

	// Post-warm-up levels, taken at a quiescent point.
	if !sleepCtx(ctx, r.warmupDuration()) {
		return context.Cause(ctx)
	}
	if err := churn.quiesce(ctx); err != nil {
		return err
	}
	rep.Warmup.At = time.Since(start).Seconds()
	rep.Warmup.Goroutines, rep.Warmup.FDs = r.steadyCounts(ctx)
	churn.resume()
	warmEnd = time.Since(start)
	r.logf("after warm-up: %d goroutines, %d open fds", rep.Warmup.Goroutines, rep.Warmup.FDs)

	if !sleepCtx(ctx, time.Until(end)) {
		return context.Cause(ctx)
	}
	if err := churn.quiesce(ctx); err != nil {
		return err
	}
	stopBar()
	// Goroutines of finished requests and subscribers take a moment to
	// exit; give them windDownTimeout to come back within the slack.
	windDownStart := time.Now()
	for {
		rep.Final.Goroutines, rep.Final.FDs = r.steadyCounts(ctx)
		if rep.Final.Goroutines >= 0 && rep.Final.Goroutines <= rep.Warmup.Goroutines+int64(cfg.goroutineSlack) ||
			time.Since(windDownStart) > windDownTimeout || ctx.Err() != nil {
			break
		}
		sleepCtx(ctx, 500*time.Millisecond)
	}
	rep.WindDownSeconds = time.Since(windDownStart).Seconds()
	rep.Final.At = time.Since(start).Seconds()
	return context.Cause(ctx)
}

// teardown unregisters every publisher and returns how many of the
// soak's two contexts /global_view still lists 5 s later (-1 if it could
// not tell): with its last service gone a context must go too, or the
// index keeps tables nobody can reach.
func (r *soakRun) teardown() int {
	for _, p := range r.pubs {
		if p.model.getPhase() == phaseGone {
			continue
		}
		if err := r.api.unregister(p.instance); err != nil {
			r.counts.controlErrors.Add(1)
			r.fails.add("teardown: %v", err)
			continue
		}
		p.model.setPhase(phaseGone)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		left := 0
		for _, model := range []string{r.o.model, r.o.model + "-transient"} {
			_, found, err := r.api.prefixCount(model, r.shape.bs)
			if err != nil {
				r.counts.controlErrors.Add(1)
				r.fails.add("teardown: %v", err)
				return -1
			}
			if found {
				left++
			}
		}
		if left == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// windDownTimeout bounds the wait for goroutines to return to their level.
const windDownTimeout = 10 * time.Second

func (r *soakRun) warmupDuration() time.Duration {
	return time.Duration(float64(r.cfg.duration) * r.cfg.warmup)
}

// steadyCounts returns the median of a few goroutine and fd readings taken
// a short while apart, so one scrape that caught a burst does not decide.
func (r *soakRun) steadyCounts(ctx context.Context) (goroutines, fds int64) {
	var gs, fs []int64
	for i := range 5 {
		if i > 0 && !sleepCtx(ctx, 100*time.Millisecond) {
			break
		}
		m, err := r.metrics()
		if err != nil {
			r.counts.controlErrors.Add(1)
			r.fails.add("metrics: %v", err)
			continue
		}
		gs = append(gs, int64(m.value("go_goroutines", nil)))
		fs = append(fs, procFDs(r.o.serverPID))
	}
	return median(gs), median(fs)
}

// close unregisters the publishers (best effort), closes every socket,
// terminates the soak's ZMQ context and stops a spawned server.
func (r *soakRun) close(server *spawned) error {
	if r.api != nil {
		r.api.timeout = 3 * time.Second
		for _, p := range r.pubs {
			if p.model.getPhase() != phaseGone {
				_ = r.api.unregister(p.instance)
			}
		}
		r.api.close()
	}
	for _, p := range r.pubs {
		p.close()
		if p.chain != nil {
			hashing.ReleaseChain(p.chain)
			p.chain = nil
		}
	}
	termContext(r.zctx, "soak ")
	if r.ipcDir != "" {
		os.RemoveAll(r.ipcDir)
	}
	if server == nil {
		return nil
	}
	err := server.stop()
	if race := server.raceReport(); race != "" {
		r.fails.add("data race in the server:\n%s", race)
		err = errors.Join(err, errors.New("the race detector found a data race in the server"))
	}
	os.RemoveAll(server.dir)
	return err
}

func (r *soakRun) logf(format string, args ...any) {
	if !r.o.quiet {
		fmt.Fprintf(os.Stderr, format+"\n", args...)
	}
}

// bar shows a time-based progress bar; the returned func is idempotent.
func (r *soakRun) bar(label string, total time.Duration) func() {
	s := &session{o: r.o}
	stop := s.bar(label, total)
	var once sync.Once
	return func() { once.Do(stop) }
}
