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
// must notice as a sequence regression) and registers short-lived services
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
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/valyala/fasthttp"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/mooncake-conductor-go/conductor/hashing"
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
	fs.IntVar(&c.memoMiB, "soak-memo-mib", 2, "--hash-memo-mib and --token-memo-mib for a spawned server, small so that the memos wrap during warm-up (-1: the server's defaults)")
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
	staleExpected                         atomic.Int64
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

// windowLog records when unregistrations were in flight. A transport error
// on a query that overlapped one is reported but not counted as a failure:
// the soak tolerates connection trouble only while a service is being torn
// down. One entry per unregistration, so the log grows with the churn, not
// with the query load.
type windowLog struct {
	mu      sync.Mutex
	windows [][2]time.Time
}

func (w *windowLog) open() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.windows = append(w.windows, [2]time.Time{time.Now(), {}})
	return len(w.windows) - 1
}

func (w *windowLog) close(i int) {
	w.mu.Lock()
	w.windows[i][1] = time.Now()
	w.mu.Unlock()
}

// overlaps reports whether [t0, t1] overlaps an unregistration.
func (w *windowLog) overlaps(t0, t1 time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, win := range slices.Backward(w.windows) {
		end := win[1]
		if end.IsZero() {
			end = t1 // still open
		}
		if !win[0].After(t1) && !end.Before(t0) {
			return true
		}
	}
	return false
}

// stats returns how many unregistrations there were, the share of the
// span [from, to] at least one was in flight, and the slowest.
func (w *windowLog) stats(from, to time.Time) (n int, share float64, slowest time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var covered time.Duration
	var last time.Time // windows open in time order; merge overlaps
	for _, win := range w.windows {
		if win[1].IsZero() {
			continue
		}
		n++
		slowest = max(slowest, win[1].Sub(win[0]))
		s, e := latest(win[0], from, last), win[1]
		if e.After(to) {
			e = to
		}
		if e.After(s) {
			covered += e.Sub(s)
			last = e
		}
	}
	if to.After(from) {
		share = float64(covered) / float64(to.Sub(from))
	}
	return n, share, slowest
}

func latest(ts ...time.Time) time.Time {
	var l time.Time
	for _, t := range ts {
		if t.After(l) {
			l = t
		}
	}
	return l
}

// goneSet remembers when each transient service's unregistration completed,
// so an answer that still lists it afterwards is a wrong answer.
type goneSet struct {
	mu sync.Mutex
	at map[string]time.Time
}

func (g *goneSet) add(id string) {
	g.mu.Lock()
	if g.at == nil {
		g.at = map[string]time.Time{}
	}
	g.at[id] = time.Now()
	// Forget entries no query in flight can still concern (bounded map).
	if len(g.at) > 4096 {
		for k, t := range g.at {
			if time.Since(t) > 2*requestTimeout {
				delete(g.at, k)
			}
		}
	}
	g.mu.Unlock()
}

// before reports whether id was unregistered before t.
func (g *goneSet) before(id string, t time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	at, ok := g.at[id]
	return ok && at.Before(t)
}

// soakSample is one reading of the server's state.
type soakSample struct {
	At         time.Duration `json:"at_ns"` // since the soak clock started
	RSS        int64         `json:"rss_bytes"`
	Goroutines int64         `json:"goroutines"`
	FDs        int64         `json:"open_fds"`
	Stale      int64         `json:"stale_sources"`
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
	// the margin covers the final quiescence and settling.
	hardStop := end.Add(2*requestTimeout + settleTimeout)
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
	// exit; give them settleTimeout to come back within the slack.
	settleStart := time.Now()
	for {
		rep.Final.Goroutines, rep.Final.FDs = r.steadyCounts(ctx)
		if rep.Final.Goroutines >= 0 && rep.Final.Goroutines <= rep.Warmup.Goroutines+int64(cfg.goroutineSlack) ||
			time.Since(settleStart) > settleTimeout || ctx.Err() != nil {
			break
		}
		sleepCtx(ctx, 500*time.Millisecond)
	}
	rep.SettleSeconds = time.Since(settleStart).Seconds()
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

// settleTimeout bounds the wait for goroutines to return to their level.
const settleTimeout = 10 * time.Second

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

func median(v []int64) int64 {
	if len(v) == 0 {
		return -1
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// rssLevels returns the RSS level after warm-up (the median of the first
// few samples after warmEnd), the final level (the median of the last few)
// and the peak after warm-up. Medians, because the Go heap oscillates
// between collections and one sample may catch a peak or a trough.
func rssLevels(samples []soakSample, warmEnd time.Duration) (warm, final, peak int64) {
	var after []int64
	for _, s := range samples {
		if s.At >= warmEnd && s.RSS >= 0 {
			after = append(after, s.RSS)
		}
	}
	if len(after) == 0 {
		return -1, -1, -1
	}
	k := min(5, max(1, len(after)/4))
	return median(after[:k]), median(after[len(after)-k:]), slices.Max(after)
}

// procFDs counts the open file descriptors of pid, or -1.
func procFDs(pid int) int64 {
	if pid <= 0 {
		return -1
	}
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return -1
	}
	return int64(len(ents))
}

// sampleLog is the sampler's output, read by the coordinator.
type sampleLog struct {
	mu sync.Mutex
	s  []soakSample
}

func (l *sampleLog) add(s soakSample) {
	l.mu.Lock()
	l.s = append(l.s, s)
	l.mu.Unlock()
}

func (l *sampleLog) get() []soakSample {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.s)
}

// maxSamples bounds the sample log whatever the duration and interval.
const maxSoakSamples = 100_000

// sampleLoop reads RSS, goroutines, fds and stale sources periodically.
func (r *soakRun) sampleLoop(ctx context.Context, start time.Time, out *sampleLog) {
	sm := sampler{pid: r.o.serverPID}
	t := time.NewTicker(r.cfg.sampleInterval)
	defer t.Stop()
	for range maxSoakSamples {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s := soakSample{At: time.Since(start), RSS: sm.rss(), Goroutines: -1, FDs: procFDs(r.o.serverPID), Stale: -1}
		if m, err := r.metrics(); err == nil {
			s.Goroutines = int64(m.value("go_goroutines", nil))
			s.Stale = int64(m.value("conductor_stale_sources", nil))
		} else if ctx.Err() == nil {
			r.counts.controlErrors.Add(1)
			r.fails.add("metrics: %v", err)
		}
		out.add(s)
	}
}

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

// churn is the registration-churn worker: it restarts the churned
// publishers in turn and keeps up to cfg.transients short-lived services
// registered, each pointing at an endpoint with nothing behind it (a closed
// loopback port or a missing ipc path, half of them in our context so they
// show up in answers, half in a context of their own that appears and
// vanishes with them, some with a dead replay endpoint too).
type churn struct {
	r       *soakRun
	pause   chan chan struct{}
	resumed chan struct{}
	exited  chan struct{} // closed when run returns
	live    []transient
	next    int // transient serial
	turn    int // churned publisher to restart next
	rng     *rand.Rand
}

type transient struct {
	id      string
	expires time.Time
}

func newChurn(r *soakRun) *churn {
	return &churn{r: r, pause: make(chan chan struct{}), resumed: make(chan struct{}, 1), exited: make(chan struct{}),
		rng: rand.New(rand.NewPCG(r.o.corpus.Seed, 0xc4)),
	}
}

// quiesce asks the churn worker to finish what it started (every
// transient unregistered, every restarted publisher live again) and waits
// until it has. The worker then waits for resume.
func (c *churn) quiesce(ctx context.Context) error {
	ack := make(chan struct{})
	select {
	case c.pause <- ack:
	case <-c.exited:
		return errors.New("the churn worker stopped before quiescing")
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	select {
	case <-ack:
		return nil
	case <-c.exited:
		return errors.New("the churn worker stopped before quiescing")
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// resume lets a quiesced churn worker continue. The channel has room for
// one, so this never blocks even if the worker has already exited.
func (c *churn) resume() {
	select {
	case c.resumed <- struct{}{}:
	default:
	}
}

func (c *churn) run(ctx context.Context) error {
	defer close(c.exited)
	defer c.dropTransients(true)
	for i := 0; i < maxLoop; i++ {
		jitter := time.Duration(c.rng.Int64N(int64(c.r.cfg.churnInterval)/2 + 1))
		select {
		case <-ctx.Done():
			return nil
		case ack := <-c.pause:
			c.dropTransients(true)
			if err := c.awaitPublishers(ctx); err != nil {
				return err
			}
			close(ack)
			select {
			case <-c.resumed:
			case <-ctx.Done():
				return nil
			}
			continue
		case <-time.After(c.r.cfg.churnInterval*3/4 + jitter):
		}
		c.dropTransients(false)
		if i%2 == 0 && c.r.cfg.churned > 0 {
			c.restartNext()
		} else if len(c.live) < c.r.cfg.transients {
			if err := c.addTransient(); err != nil {
				return err
			}
		}
	}
	return nil
}

// restartNext asks the next churned publisher (the last cfg.churned ones)
// to restart, going round the restart modes. A publisher
// still busy with its previous restart is skipped this turn.
func (c *churn) restartNext() {
	n := c.r.cfg.churned
	p := c.r.pubs[len(c.r.pubs)-n+c.turn%n]
	mode := restartMode((c.turn / n) % int(numRestartModes))
	c.turn++
	p.pending.Add(1)
	select {
	case p.restart <- mode:
	default:
		p.pending.Add(-1)
	}
}

// awaitPublishers waits until every restart asked for has completed.
func (c *churn) awaitPublishers(ctx context.Context) error {
	deadline := time.Now().Add(2*probeTimeout + requestTimeout)
	for {
		busy := 0
		for _, p := range c.r.pubs {
			if p.pending.Load() != 0 || p.model.getPhase() != phaseLive {
				busy++
			}
		}
		if busy == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d publisher(s) still restarting after %v", busy, 2*probeTimeout+requestTimeout)
		}
		if !sleepCtx(ctx, 20*time.Millisecond) {
			return nil
		}
	}
}

// addTransient registers one short-lived service with a dead endpoint.
func (c *churn) addTransient() error {
	r := c.r
	n := c.next
	c.next++
	id := fmt.Sprintf("%s%d", r.prefix, n)
	model := r.o.model
	if n%2 == 1 {
		model = r.o.model + "-transient"
	}
	var endpoint string
	if n%3 == 2 {
		endpoint = "ipc://" + filepath.Join(r.ipcDir, fmt.Sprintf("dead-%d", n))
	} else {
		port, err := deadPort(c.rng)
		if err != nil {
			return err
		}
		endpoint = fmt.Sprintf("tcp://127.0.0.1:%d", port)
	}
	reg := r.o.engine.registration(endpoint, model, id, r.shape.bs)
	if n%4 == 1 {
		port, err := deadPort(c.rng)
		if err != nil {
			return err
		}
		reg["replay_endpoint"] = fmt.Sprintf("tcp://127.0.0.1:%d", port)
	}
	if err := r.api.register(reg); err != nil {
		r.counts.transientFailures.Add(1)
		return err
	}
	r.counts.transients.Add(1)
	life := r.cfg.churnInterval + time.Duration(c.rng.Int64N(int64(4*r.cfg.churnInterval)))
	c.live = append(c.live, transient{id: id, expires: time.Now().Add(life)})
	return nil
}

// dropTransients unregisters expired transients, or all of them.
func (c *churn) dropTransients(all bool) {
	keep := c.live[:0]
	for _, t := range c.live {
		if !all && time.Now().Before(t.expires) {
			keep = append(keep, t)
			continue
		}
		w := c.r.windows.open()
		err := c.r.api.unregister(t.id)
		c.r.windows.close(w)
		if err != nil {
			c.r.counts.transientFailures.Add(1)
			c.r.fails.add("transient: %v", err)
			continue
		}
		c.r.gone.add(t.id)
	}
	c.live = keep
}

// deadPort returns a loopback port below the kernel's ephemeral range with
// nothing listening on it. Below the range matters: our publishers bind
// ephemeral ports, and a transient service must never find one of them
// behind its endpoint.
func deadPort(rng *rand.Rand) (int, error) {
	lo := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil && v > 2048 {
				lo = v
			}
		}
	}
	for range 100 {
		port := 1024 + rng.IntN(lo-1024)
		if err := canListen(port); err == nil {
			return port, nil
		}
	}
	return 0, errors.New("no free port below the ephemeral range")
}

// canListen reports whether nothing listens on the loopback port.
func canListen(port int) error {
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return err
	}
	return ln.Close()
}

// metrics fetches and parses GET /metrics, counting a 5xx answer.
func (r *soakRun) metrics() (promText, error) {
	m, status, err := r.api.metrics()
	if status >= 500 {
		r.counts.fiveXX.Add(1)
	}
	return m, err
}

// serverCounts reads the server's own view at the end: 5xx responses it
// counted on every endpoint, and stale sources now.
func (r *soakRun) serverCounts(rep *soakReport) error {
	m, err := r.metrics()
	if err != nil {
		return err
	}
	rep.ServerFiveXX = 0
	for _, s := range m["conductor_http_requests_total"] {
		if strings.HasPrefix(s.labels["status"], "5") {
			rep.ServerFiveXX += int64(s.value)
		}
	}
	rep.FinalStale = int64(m.value("conductor_stale_sources", nil))
	all, regr := staleTransitions(m)
	rep.StaleTransitions, rep.StaleRegressions = all-r.staleAtStart[0], regr-r.staleAtStart[1]
	return nil
}

// staleTransitions sums conductor_stale_transitions_total over every
// series, and over those for a sequence regression.
func staleTransitions(m promText) (all, regression int64) {
	for _, s := range m["conductor_stale_transitions_total"] {
		all += int64(s.value)
		if s.labels["reason"] == "regression" {
			regression += int64(s.value)
		}
	}
	return all, regression
}

// promSample is one series of a Prometheus text exposition.
type promSample struct {
	labels map[string]string
	value  float64
}

// promText maps metric names to their series.
type promText map[string][]promSample

// value returns the value of the series of name whose labels include
// want, or -1.
func (m promText) value(name string, want map[string]string) float64 {
outer:
	for _, s := range m[name] {
		for k, v := range want {
			if s.labels[k] != v {
				continue outer
			}
		}
		return s.value
	}
	return -1
}

// parsePromText reads the text exposition format: `name{k="v",...} value`
// per line, comments skipped. Timestamps after the value are ignored.
func parsePromText(b []byte) (promText, error) {
	out := promText{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest := line, ""
		labels := map[string]string{}
		if i := strings.IndexByte(line, '{'); i >= 0 {
			j := strings.LastIndexByte(line, '}')
			if j < i {
				return nil, fmt.Errorf("metrics: bad line %q", line)
			}
			name, rest = line[:i], line[j+1:]
			if err := parseLabels(line[i+1:j], labels); err != nil {
				return nil, fmt.Errorf("metrics: %w in %q", err, line)
			}
		} else if i := strings.IndexAny(line, " \t"); i >= 0 {
			name, rest = line[:i], line[i:]
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return nil, fmt.Errorf("metrics: no value in %q", line)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics: value in %q: %w", line, err)
		}
		out[name] = append(out[name], promSample{labels: labels, value: v})
	}
	return out, sc.Err()
}

// parseLabels reads k="v" pairs with the format's escapes (\\, \", \n).
func parseLabels(s string, out map[string]string) error {
	for s = strings.TrimSpace(s); s != ""; s = strings.TrimLeft(strings.TrimSpace(s), ",") {
		eq := strings.IndexByte(s, '=')
		if eq < 0 || eq+1 >= len(s) || s[eq+1] != '"' {
			return errors.New("bad label")
		}
		key := strings.TrimSpace(s[:eq])
		var val strings.Builder
		i := eq + 2
		for ; i < len(s) && s[i] != '"'; i++ {
			if s[i] == '\\' && i+1 < len(s) {
				i++
				switch s[i] {
				case 'n':
					val.WriteByte('\n')
				default:
					val.WriteByte(s[i])
				}
				continue
			}
			val.WriteByte(s[i])
		}
		if i >= len(s) {
			return errors.New("unterminated label value")
		}
		out[key] = val.String()
		s = s[i+1:]
	}
	return nil
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
