// Command loadgen measures a running conductor end to end: it starts fake
// engines that publish KV-cache events over real ZMQ sockets, waits until
// the index has absorbed them, drives POST /query at several concurrency
// levels while checking every answer against expectations it computed from
// the tokens alone, then unregisters the engines under query load.
//
// Phases, in order:
//
//  1. corpus: stored prompts (a group's shared system prompt plus a private
//     suffix) until the publishers together publish --blocks blocks, and a
//     pool of queries (full, partial, system-only, cold) with the expected
//     longest_matched per instance, computed from tokens alone;
//  2. registration: one PUB socket per engine on 127.0.0.1, POST /register,
//     then a probe block is published until /query shows it, because a SUB
//     joins asynchronously and anything sent before it would be lost (and
//     the resulting sequence gap would make the source stale);
//  3. ingest: every publisher sends its BlockStored batches (--batch blocks
//     each) at once; /global_view's prefix_count reaching the number of
//     distinct blocks ends the phase and gives blocks/s;
//  4. one checked pass over the pool, then each --concurrency level for
//     --duration: queries/s, latency percentiles, server and client CPU;
//  5. unregistration of every engine while queries keep running.
//
// Everything stays on loopback, every phase is bounded in time and count,
// and all sockets (and a --spawn'ed server) are closed at exit. Any wrong
// answer makes the exit status non-zero. The Markdown report goes to stdout
// (JSON with --json), progress to stderr. --spawn builds the server from the
// working tree, uncommitted changes included.
//
// With --spawn --server-replicas N it starts N servers from one build (with
// --targets it drives servers already running): every publisher is
// registered on each, the verification pass asks each one the whole pool,
// and the timed queries go to them in turn (see replicas.go).
//
// With --fleet-rounds N (--preset fleet) the index is then kept at
// capacity instead of queried: every publisher replaces each prompt it
// holds by a new one, round after round, with checked queries during the
// last rounds (see fleet.go).
//
// With --soak DURATION it runs the soak test instead (see soak.go):
// ingestion with eviction and clears, checked queries and registration
// churn together, then assertions that the server reached a steady state.
//
//	go run ./scripts/loadgen --spawn --publishers 8 --blocks 200000 --concurrency 1,4,16 --duration 5s
//	scripts/loadgen.sh --publishers 8 --blocks 200000 --duration 5s   # the same, built first
//	go run ./scripts/loadgen --spawn --preset router-8k --concurrency 8 --server-replicas 3
//	go run ./scripts/loadgen --spawn --preset fleet --fleet-rounds 4 --server-memory-mib 256
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/mooncake-conductor-go/conductor/internal/hashing"
)

func main() {
	o, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if o.soak.duration > 0 {
		code := soakMain(ctx, o)
		stop()
		os.Exit(code)
	}
	r, err := run(ctx, o)
	if r != nil {
		if o.json {
			r.writeMarkdown(os.Stderr)
			_ = r.writeJSON(os.Stdout)
		} else {
			r.writeMarkdown(os.Stdout)
		}
	}
	code := 0
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		code = 1
	}
	if r != nil && r.Failures > 0 {
		fmt.Fprintf(os.Stderr, "loadgen: %d wrong answers or failed queries\n", r.Failures)
		code = 1
	}
	stop()
	os.Exit(code)
}

// session holds what must be released at exit, whatever phase failed.
type session struct {
	o          *options
	zctx       *zmq.Context // the run's own, so that runs in one process (tests) do not share one
	pubs       []*publisher
	registered []bool
	// apis are every server driven, servers every one spawned, spawnRoot
	// the directory that holds several spawned ones.
	apis      []*api
	servers   []*spawned
	spawnRoot string
}

// close unregisters whatever is still registered (best effort: the run is
// over), closes every socket and stops a spawned server.
func (s *session) close() error {
	for _, a := range s.apis {
		// Cleanup after a failure must not hang on a hung server.
		a.timeout = 3 * time.Second
		for i, p := range s.pubs {
			if s.registered[i] {
				_ = a.unregister(p.instance)
			}
		}
		a.close()
	}
	for _, p := range s.pubs {
		p.close()
	}
	termContext(s.zctx, "")
	var errs []error
	for _, srv := range s.servers {
		errs = append(errs, srv.cleanup())
	}
	if s.spawnRoot != "" {
		os.RemoveAll(s.spawnRoot)
	}
	return errors.Join(errs...)
}

// termContext terminates a run's ZMQ context (nil: none). With every
// socket closed (linger 0) that is immediate; the timeout only guards
// against a socket we missed, which it reports (what names the run).
func termContext(zctx *zmq.Context, what string) {
	if zctx == nil {
		return
	}
	termed := make(chan struct{})
	go func() { _ = zctx.Term(); close(termed) }()
	select {
	case <-termed:
	case <-time.After(2 * time.Second):
		fmt.Fprintf(os.Stderr, "loadgen: %sZMQ context did not terminate; a socket was left open\n", what)
	}
}

// logf writes a progress note on stderr.
func (s *session) logf(format string, args ...any) {
	if !s.o.quiet {
		fmt.Fprintf(os.Stderr, format+"\n", args...)
	}
}

// sampler reads the server's CPU time and RSS, or -1 without a pid.
type sampler struct{ pid int }

func (m sampler) cpu() time.Duration {
	if m.pid <= 0 {
		return -1
	}
	d, err := procCPU(m.pid)
	if err != nil {
		return -1
	}
	return d
}

// faults reads the server's minor faults and system time; ok is false
// when unknown.
func (m sampler) faults() (statFaults, bool) {
	if m.pid <= 0 {
		return statFaults{}, false
	}
	f, err := procFaults(m.pid)
	return f, err == nil
}

// peak is the server's VmHWM, -1 when unknown.
func (m sampler) peak() int64 {
	if m.pid <= 0 {
		return -1
	}
	b, err := procPeakRSS(m.pid)
	if err != nil {
		return -1
	}
	return b
}

func (m sampler) rss() int64 {
	if m.pid <= 0 {
		return -1
	}
	b, err := procRSS(m.pid)
	if err != nil {
		return -1
	}
	return b
}

// memory reads the server's RSS and its anonymous part into *rss and *anon
// (-1 when unknown). The rest is file-backed: code and shared-library pages
// the server has touched, which grow as new paths run and never return.
func (m sampler) memory(rss, anon *int64) {
	*rss, *anon = m.rss(), -1
	if m.pid > 0 {
		if b, err := procAnonRSS(m.pid); err == nil {
			*anon = b
		}
	}
}

// perUnit divides a CPU delta by a count in µs, or -1 when unknown. A zero
// delta is unknown too: /proc counts in 10 ms ticks, and a phase shorter
// than one tick of server work cannot be told apart from no work.
func perUnit(c0, c1 time.Duration, n int) float64 {
	if c0 < 0 || c1 <= c0 || n == 0 {
		return -1
	}
	return us(c1-c0) / float64(n)
}

func run(ctx context.Context, o *options) (rep *report, err error) {
	s := &session{o: o}
	defer func() {
		if cerr := s.close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	targets, pids := []string{o.baseURL}, []int{o.serverPID}
	if o.targets != nil {
		targets, pids = o.targets, o.serverPIDs
	}
	if o.spawn {
		repo := o.repo
		if repo == "" {
			if repo, err = findRepoRoot(); err != nil {
				return nil, err
			}
		}
		if o.serverReplicas > 1 {
			if s.servers, s.spawnRoot, err = spawnReplicas(ctx, repo, o.serverOptions(), o.serverReplicas); err != nil {
				return nil, err
			}
		} else {
			srv, err := spawnServer(ctx, repo, o.serverOptions())
			if err != nil {
				return nil, err
			}
			s.servers = []*spawned{srv}
		}
		targets, pids = nil, nil
		for _, srv := range s.servers {
			targets, pids = append(targets, srv.base), append(pids, srv.pid())
			s.logf("server pid %d at %s", srv.pid(), srv.base)
		}
	}
	// RSS is the first server's; CPU is every server's.
	fl := make(fleet, len(targets))
	for i := range fl {
		if i < len(pids) {
			fl[i] = sampler{pid: pids[i]}
		}
	}
	m := fl[0]
	for _, base := range targets {
		a, err := newAPI(base, o.authToken, max(slices.Max(o.levels), o.unregConc, o.corpus.Publishers)+8)
		if err != nil {
			return nil, err
		}
		s.apis = append(s.apis, a)
		if !a.healthy() {
			return nil, fmt.Errorf("%s/healthz does not answer 200", base)
		}
	}

	genStart := time.Now()
	c, err := newCorpus(o.corpus)
	if err != nil {
		return nil, err
	}
	cfg := c.cfg
	rep = &report{
		ServerReplicas: len(s.apis), Targets: targets,
		Engine: string(o.engine), Publishers: cfg.Publishers, BlockSize: cfg.BlockSize,
		PromptTokens: cfg.PromptTokens / cfg.BlockSize * cfg.BlockSize, SystemTokens: cfg.SystemTokens / cfg.BlockSize * cfg.BlockSize,
		Groups: cfg.Groups, Replicas: cfg.Replicas, StoredPrompts: len(c.prompts), PoolQueries: len(c.queries),
		PoolKinds: map[string]int{}, TokenEncoding: map[bool]string{false: "array", true: "bin"}[o.binTokens],
	}
	for k := range numKinds {
		rep.PoolKinds[k.String()] = c.kinds[k]
	}
	rep.RSS = rssResult{-1, -1, -1, -1, -1} // phases not reached stay unknown
	rep.PeakRSS = peakResult{-1, -1}
	rep.RSSAnon = rep.RSS
	rep.LoadAverage[1] = -1
	fails := &failures{}
	defer func() {
		rep.Failures = fails.count.Load()
		fails.mu.Lock()
		rep.FailureNotes = slices.Clone(fails.first)
		fails.mu.Unlock()
	}()
	m.memory(&rep.RSS.Start, &rep.RSSAnon.Start)
	rep.LoadAverage[0] = loadAverage()

	prof, err := hashing.Resolve(o.engine.hashSpec())
	if err != nil {
		return rep, fmt.Errorf("hash profile: %w", err)
	}
	ids := make([]string, cfg.Publishers)
	s.registered = make([]bool, cfg.Publishers)
	if s.zctx, err = zmq.NewContext(); err != nil {
		return rep, fmt.Errorf("ZMQ context: %w", err)
	}
	for i := range cfg.Publishers {
		ids[i] = fmt.Sprintf("%s-e%d", o.model, i)
		p, err := newPublisher(s.zctx, i, ids[i])
		if err != nil {
			return rep, fmt.Errorf("publisher %d: %w", i, err)
		}
		s.pubs = append(s.pubs, p)
	}
	// Hashing and encoding are done before anything is timed; publishers
	// are independent, so they are prepared in parallel.
	if err := parallel(s.pubs, func(p *publisher) error { return p.prepare(c, o.engine, &prof, o.batch) }); err != nil {
		return rep, err
	}
	pool := make([]preparedQuery, len(c.queries))
	for i := range c.queries {
		b, err := queryBody(o.model, cfg.BlockSize, c.queries[i].tokens, "", o.binTokens)
		if err != nil {
			return rep, err
		}
		pool[i] = preparedQuery{query: &c.queries[i], body: b}
	}
	var cold []preparedQuery
	if o.coldPass {
		if cold, err = coldPool(c, o.model, o.binTokens); err != nil {
			return rep, err
		}
	}
	for _, p := range s.pubs {
		rep.Ingest.BlocksPublished += p.blocks
		rep.Ingest.Messages += len(p.payloads)
	}
	rep.Ingest.DistinctBlocks = c.distinctBlocks()
	s.logf("corpus: %d prompts, %d blocks in %d messages (%d distinct), %d queries, prepared in %v",
		len(c.prompts), rep.Ingest.BlocksPublished, rep.Ingest.Messages, c.distinctBlocks(), len(pool), time.Since(genStart).Round(time.Millisecond))

	// Register on every server and wait for each subscription to carry a
	// probe.
	for i, p := range s.pubs {
		for _, a := range s.apis {
			if err := a.register(o.engine.registration(p.endpoint, o.model, p.instance, cfg.BlockSize)); err != nil {
				return rep, err
			}
			s.registered[i] = true
		}
	}
	if err := parallel(s.pubs, func(p *publisher) error { return s.awaitProbe(ctx, p, cfg.BlockSize) }); err != nil {
		return rep, err
	}
	s.logf("all %d subscriptions carry events", len(s.pubs))

	// Ingest.
	m.memory(&rep.RSS.BeforeIngest, &rep.RSSAnon.BeforeIngest)
	cpu0, self0 := total(fl.cpus()), selfCPU()
	faults0, faultsKnown := fl[0].faults()
	if err := s.ingest(ctx, c.distinctBlocks()+len(s.pubs), rep); err != nil {
		return rep, err
	}
	// Each server ingests every block.
	rep.Ingest.ServerCPUPerBlockUS = perUnit(cpu0, total(fl.cpus()), rep.Ingest.BlocksPublished*len(s.apis))
	// The publishers run in this process, on the same cores.
	rep.Ingest.PublisherCPUPerBlockUS = perUnit(self0, selfCPU(), rep.Ingest.BlocksPublished)
	// The blocks are visible; their verification may still wait. The
	// query phases start once it is done, so that what they measure does
	// not depend on how far it got.
	polls, err := s.awaitVerified(ctx, rep)
	if err != nil {
		return rep, err
	}
	cpuVerified := total(fl.cpus())
	if f, ok := fl[0].faults(); ok && faultsKnown {
		// The first server's: every server ingests every block.
		n := float64(rep.Ingest.BlocksPublished)
		rep.Ingest.FaultsPerBlock = float64(f.minor-faults0.minor) / n
		rep.Ingest.SystemCPUPerBlockUS = float64((f.system - faults0.system).Microseconds()) / n
	}
	// Less what reading /metrics took the servers while waiting, measured
	// on a few more reads.
	const probes = 5
	for range probes {
		if _, err := s.pendingLinks(); err != nil {
			return rep, err
		}
	}
	perPoll := (total(fl.cpus()) - cpuVerified) / probes
	rep.Ingest.ServerCPUPerBlockVerifiedUS = perUnit(cpu0, cpuVerified-time.Duration(polls)*perPoll, rep.Ingest.BlocksPublished*len(s.apis))
	s.logf("server CPU per block until verified %.2f µs (less %d reads of /metrics at %v each)", rep.Ingest.ServerCPUPerBlockVerifiedUS, polls, perPoll)
	m.memory(&rep.RSS.AfterIngest, &rep.RSSAnon.AfterIngest)
	rep.PeakRSS.AfterIngest = m.peak()

	var chainPrompts [][]int32
	if o.chainBaseline {
		for i := range c.prompts {
			chainPrompts = append(chainPrompts, c.prompts[i].tokens)
		}
		rep.Chain = &chainResult{Prompts: len(chainPrompts)}
		rep.Chain.add(chainCPUPerPrompt(&prof, cfg.BlockSize, chainPrompts))
	}
	if o.coldPass {
		// What ingest left the servers to do (a garbage collection of
		// the heap it grew) is not the cold queries' cost.
		s.waitQuiet(ctx, fl)
		rep.HugeBeforeCold = -1
		if pid := fl[0].pid; pid > 0 {
			if b, err := procAnonHuge(pid); err == nil {
				rep.HugeBeforeCold = b
			}
		}
		var paired, body []preparedQuery
		if o.floor {
			if paired, err = floorPool(c, o.model, o.binTokens); err != nil {
				return rep, err
			}
			if body, err = bodyPool(c, cold, o.model, o.binTokens); err != nil {
				return rep, err
			}
		}
		s.logf("cold pass: %d stored prompts, each asked once", len(cold))
		cr, err := s.pairedPass(ctx, "cold pass", cold, paired, body, ids, fails, fl)
		rep.Cold = cr
		if cr != nil {
			rep.Checked += int64(cr.Queries + 2*cr.FloorQueries)
		}
		if err != nil {
			return rep, err
		}
		// The same prompts again: their digests now come from the prefix memo.
		wr, err := s.pairedPass(ctx, "warm pass", cold, paired, body, ids, fails, fl)
		rep.Warm = wr
		if wr != nil {
			rep.Checked += int64(wr.Queries + 2*wr.FloorQueries)
		}
		if err != nil {
			return rep, err
		}
		if o.chainBaseline {
			rep.Chain.add(chainCPUPerPrompt(&prof, cfg.BlockSize, chainPrompts))
		}
	}
	if o.floor {
		fp, err := floorPool(c, o.model, o.binTokens)
		if err != nil {
			return rep, err
		}
		fr, err := s.floorPass(ctx, fp, ids, fails, fl)
		rep.Floor = fr
		if fr != nil {
			rep.Checked += int64(fr.Queries)
		}
		if err != nil {
			return rep, err
		}
	}

	// One pass over the pool on each server checks every answer once
	// before load: every replica must give the same, expected, answers.
	for _, a := range s.apis {
		dv := &driver{targets: []*api{a}, pool: pool, ids: ids, fails: fails, pres: func(int) presence { return mustMatch }}
		t0 := time.Now()
		verified, _ := dv.run(ctx, 1, t0, t0.Add(5*time.Minute), len(pool), nil)
		rep.Checked += int64(len(verified))
		at := ""
		if len(s.apis) > 1 {
			at = " from " + a.base
		}
		s.logf("verified %d pool answers%s in %v, %d wrong", len(verified), at, time.Since(t0).Round(time.Millisecond), fails.count.Load())
		if err := ctx.Err(); err != nil {
			return rep, err
		}
	}
	if o.fleet.rounds > 0 {
		// The pool's answers hold for the corpus only: after the fleet
		// rounds the servers hold other prompts, so the run ends here
		// (session.close unregisters).
		fr, err := s.fleetPhase(ctx, c, &prof, ids, fails, fl)
		rep.Fleet = fr
		if fr != nil {
			rep.Checked += fr.Answers
		}
		rep.PeakRSS.End = m.peak()
		rep.LoadAverage[1] = loadAverage()
		return rep, err
	}
	d := &driver{targets: s.apis, pool: pool, ids: ids, fails: fails, pres: func(int) presence { return mustMatch }}
	if o.restart { // parseFlags made sure the server is spawned
		r, err := s.restartServer(ctx, d, cfg.BlockSize)
		rep.Restart = r
		if err != nil {
			return rep, err
		}
		m = sampler{pid: s.servers[0].pid()}
		fl = fleet{m}
		rep.Checked += int64(r.Checked)
	}

	stopSteady := s.steadyIngest(ctx, &prof, o.steadyIngest)
	for _, conc := range o.levels {
		memo0, memoErr := memoStatsAll(s.apis)
		f0, cs0, self0 := fails.count.Load(), fl.cpus(), selfCPU()
		stopBar := s.bar(fmt.Sprintf("concurrency %d", conc), o.duration)
		t0 := time.Now()
		samples, elapsed := d.run(ctx, conc, t0, t0.Add(o.duration), o.maxSamples, nil)
		stopBar()
		cs1, self1 := fl.cpus(), selfCPU()
		c0, c1 := total(cs0), total(cs1)
		lat := latencies(samples)
		l := levelResult{
			Concurrency: conc, Queries: len(samples), Seconds: elapsed.Seconds(),
			QPS:   float64(len(samples)) / elapsed.Seconds(),
			P50US: us(percentile(lat, 0.50)), P99US: us(percentile(lat, 0.99)), P999US: us(percentile(lat, 0.999)),
			MaxUS: us(percentile(lat, 1)), ServerCPUPerQueryUS: perUnit(c0, c1, len(samples)),
			ClientCPUPerQueryUS: perUnit(self0, self1, len(samples)),
			ServerCPUCores:      cores(c0, c1, elapsed), ClientCPUCores: cores(self0, self1, elapsed),
			Failures:     fails.count.Load() - f0,
			AnswerHitPct: -1, PrefixMemoHitPct: -1, TokenMemoHitPct: -1, MemoBytes: -1,
		}
		for i, n := range perTarget(samples, len(s.apis)) {
			l.PerServer = append(l.PerServer, replicaLevel{Target: s.apis[i].base, Queries: n, QPS: float64(n) / elapsed.Seconds(),
				ServerCPUPerQueryUS: perUnit(cs0[i], cs1[i], n), ServerCPUCores: cores(cs0[i], cs1[i], elapsed)})
		}
		if memo1, err := memoStatsAll(s.apis); err == nil && memoErr == nil {
			l.PrefixMemoHitPct = hitPct(memo0.prefixHits, memo0.prefixMisses, memo1.prefixHits, memo1.prefixMisses)
			l.TokenMemoHitPct = hitPct(memo0.tokenHits, memo0.tokenMisses, memo1.tokenHits, memo1.tokenMisses)
			l.AnswerHitPct = hitPct(memo0.answerHits, memo0.answerMisses, memo1.answerHits, memo1.answerMisses)
			if memo1.prefixBytes >= 0 && memo1.tokenBytes >= 0 {
				l.MemoBytes = int64(memo1.prefixBytes + memo1.tokenBytes + max(0, memo1.answerBytes))
			}
		}
		rep.Levels = append(rep.Levels, l)
		rep.Checked += int64(len(samples))
		s.logf("concurrency %d: %d queries, %.0f/s, p50 %s p99 %s p999 %s, server CPU/query %s, %d wrong",
			conc, l.Queries, l.QPS, fmtUS(l.P50US), fmtUS(l.P99US), fmtUS(l.P999US), fmtUS(l.ServerCPUPerQueryUS), l.Failures)
		if err := ctx.Err(); err != nil {
			return rep, err
		}
	}
	if n := stopSteady(); o.steadyIngest > 0 {
		rep.SteadyIngest = &steadyResult{PromptsPerSecPerPublisher: o.steadyIngest, Blocks: n}
		s.logf("steady ingest: %d blocks stored during the levels", n)
	}
	if o.chainBaseline {
		rep.Chain.add(chainCPUPerPrompt(&prof, cfg.BlockSize, chainPrompts))
	}
	m.memory(&rep.RSS.AfterLoad, &rep.RSSAnon.AfterLoad)

	if err := s.unregisterUnderLoad(ctx, d, rep); err != nil {
		return rep, err
	}
	// The runtime returns freed memory in the background: RSS is read until
	// it is back within 20 % of its value before ingest, for at most 5 s
	// after the last unregistration.
	rep.AfterUnregSeconds = awaitRSS(m, rep.RSS.BeforeIngest, rep.unregEnd, 5*time.Second)
	m.memory(&rep.RSS.AfterUnreg, &rep.RSSAnon.AfterUnreg)
	rep.PeakRSS.End = m.peak()

	rep.LoadAverage[1] = loadAverage()
	return rep, nil
}
