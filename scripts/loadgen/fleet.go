package main

// The fleet preset (--fleet-rounds N, issue 43): engines at capacity. After
// the realistic index is ingested and checked, every publisher replaces
// each prompt it holds by a new one, oldest first, one message per prompt
// (BlockRemoved of the old prompt's private blocks and BlockStored of the
// new one's, in one batch), round after round: where a production indexer
// lives, every engine's cache full and every store evicting.
//
// The first N rounds run without queries: each is timed from its first
// message until the server applied every event and verified every stored
// block, which gives server CPU per block operation (stores and removals,
// verification included). Then one more round per --concurrency level
// runs with checked queries at that concurrency: latencies during the
// churn and server CPU per query, the round's CPU less its block
// operations at the quiet rounds' median cost. Those rounds spread their
// messages over --duration (at --fleet-rate when set), so that the
// queries run against a churn of known pace for a known time. RSS is
// sampled all along; VmHWM is reset after the initial ingest (when the
// kernel lets us), so the peak is the churn's; settled RSS is read once
// the server is idle.
// fleetmodel.go says what each answer may be.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mooncake-conductor-go/conductor/internal/hashing"
)

// fleetConfig holds the fleet preset's own flags.
type fleetConfig struct {
	rounds int     // quiet replacement rounds (0: no fleet phase)
	rate   float64 // block operations a second, all publishers together (0: as fast as possible)
}

func (c *fleetConfig) addFlags(fs *flag.FlagSet) {
	fs.IntVar(&c.rounds, "fleet-rounds", 0, "after ingest, this many rounds in which every publisher replaces each prompt it holds by a new one (BlockRemoved of the old prompt's private blocks + BlockStored of the new one's, one message per prompt), timed without queries; then one more such round per --concurrency level with checked queries running, its messages spread over --duration unless --fleet-rate is set (0: no fleet phase; --preset fleet sets 4)")
	fs.Float64Var(&c.rate, "fleet-rate", 0, "block operations (stores and removals) a second, all publishers together, during the fleet rounds (0: as fast as possible)")
}

// validateFleet refuses what the fleet model cannot describe.
func (o *options) validateFleet() error {
	c := o.fleet
	switch {
	case c.rounds == 0:
		return nil
	case c.rounds < 0 || c.rounds > 100:
		return errors.New("--fleet-rounds must be in 0..100")
	case c.rate < 0:
		return errors.New("--fleet-rate must not be negative")
	case o.corpus.Replicas != 1:
		return errors.New("--fleet-rounds needs --replicas 1: each slot's prompt has one holder")
	case o.servers() > 1 || o.restart || o.coldPass || o.floor || o.steadyIngest > 0 || o.soak.duration != 0:
		return errors.New("--fleet-rounds drives one server and does not combine with --restart, --cold-pass, --floor, --steady-ingest or --soak")
	}
	return nil
}

// fleetRound is one round's figures.
type fleetRound struct {
	Round int `json:"round"`
	// Concurrency is the query workers during the round (0: none).
	Concurrency int   `json:"query_concurrency"`
	Messages    int   `json:"messages"`
	BlockOps    int64 `json:"block_operations"`
	// RateOpsPerSec is the pace the messages were sent at (0: at once).
	RateOpsPerSec float64 `json:"sent_block_ops_per_s"`
	Seconds       float64 `json:"seconds_until_verified"`
	OpsPerSec     float64 `json:"block_operations_per_s"`
	// ServerCPUPerOpUS is the server's CPU from the round's first message
	// until every event was applied and every stored block verified
	// (less its reads of /metrics meanwhile), per block operation; in a
	// round with queries their CPU is in it too.
	ServerCPUPerOpUS float64 `json:"server_cpu_per_block_op_us"`
	// FaultsPerOp is the server's minor page faults over the same span.
	FaultsPerOp float64 `json:"faults_per_block_op"`
	RSSEnd      int64   `json:"rss_end_bytes"`
	RSSMax      int64   `json:"rss_max_bytes"`
	// Queries and the rest are the round's checked queries.
	Queries             int     `json:"queries,omitempty"`
	QPS                 float64 `json:"queries_per_s,omitempty"`
	P50US               float64 `json:"p50_us,omitempty"`
	P99US               float64 `json:"p99_us,omitempty"`
	MaxUS               float64 `json:"max_us,omitempty"`
	ServerCPUPerQueryUS float64 `json:"server_cpu_per_query_us,omitempty"`
	// PrefixCount is /global_view's prefix_count after the round: every
	// replacement removes as many distinct blocks as it stores, so it
	// must stay at the corpus's.
	PrefixCount int `json:"prefix_count"`
}

// fleetResult is the fleet phase's report.
type fleetResult struct {
	Rounds         []fleetRound `json:"rounds"`
	RateOpsPerSec  float64      `json:"rate_block_ops_per_s"` // 0: as fast as possible
	SlotsPerPub    []int        `json:"prompts_per_publisher"`
	OpsPerMessage  int          `json:"block_operations_per_message"`
	ServerMemLimit string       `json:"server_gomemlimit,omitempty"`
	// MedianCPUPerOpUS is the quiet rounds' median, SteadyCPUPerOpUS the
	// median of those after the first (the first replaces the ingest's
	// layout; from the second on the server meets its own churn).
	MedianCPUPerOpUS float64 `json:"median_server_cpu_per_block_op_us"`
	SteadyCPUPerOpUS float64 `json:"steady_server_cpu_per_block_op_us"`
	RSSMax           int64   `json:"rss_max_bytes"`
	// PeakReset says whether VmHWM was reset after the initial ingest
	// (clear_refs), so that PeakRSS is the churn's own.
	PeakReset  bool    `json:"peak_reset_after_ingest"`
	PeakRSS    int64   `json:"vmhwm_bytes"`
	SettledRSS int64   `json:"settled_rss_bytes"`
	PeakRatio  float64 `json:"vmhwm_over_settled"`
	// Answers checked during the query rounds and after every round, by
	// how the publisher that moved compared: within exact bounds, within
	// a range (a message for the prompt in flight), above the upper bound
	// (always wrong), below the lower bound (wrong unless the server
	// dropped information: IndexEvictions, LinkShed).
	Answers        int64    `json:"answers_checked"`
	Exact          int64    `json:"entries_exact"`
	Ranged         int64    `json:"entries_range"`
	Above          int64    `json:"entries_above_model"`
	Below          int64    `json:"entries_below_model"`
	IndexEvictions int64    `json:"index_evictions"`
	LinkShed       int64    `json:"link_verify_shed"`
	BelowNotes     []string `json:"below_model_examples,omitempty"`
}

// fleetRun is the fleet phase's state.
type fleetRun struct {
	s     *session
	c     *corpus
	prof  *hashing.Profile
	ids   []string
	fails *failures
	fl    fleet
	res   *fleetResult

	slots      []fleetSlots
	sent       []atomic.Int64 // per publisher: replacement messages sent
	applied    []atomic.Int64 // per publisher: messages the server showed applied
	keys       [][][]uint64   // [p][j]: chain keys of the newest prompt sent for slot j
	holdsGroup [][]bool       // [p][g]: p holds group g's system prompt
	sysBlocks  int
	blocks     int

	// tokens[r][p][j] is slot j's round-r prompt for the rounds queries
	// may still ask (round 0 is the corpus's); written between rounds only.
	tokens map[int][][][]int32

	exact, ranged, above, below, answers atomic.Int64

	cur    atomic.Int64 // the round running, for the RSS sampler
	rssMu  sync.Mutex
	rssMax map[int]int64 // round → largest RSS sampled during it
	// belowNotes are the first answers below the model.
	belowNotes []string
}

// fleetPhase runs the fleet rounds on the session's (single) server. The
// index must hold the corpus, applied and verified.
func (s *session) fleetPhase(ctx context.Context, c *corpus, prof *hashing.Profile, ids []string, fails *failures, fl fleet) (*fleetResult, error) {
	cfg := c.cfg
	bs := cfg.BlockSize
	r := &fleetRun{s: s, c: c, prof: prof, ids: ids, fails: fails, fl: fl,
		res:       &fleetResult{RateOpsPerSec: s.o.fleet.rate, ServerMemLimit: gomemlimit(s.o)},
		sysBlocks: cfg.SystemTokens / bs, blocks: cfg.PromptTokens / bs,
		sent: make([]atomic.Int64, cfg.Publishers), applied: make([]atomic.Int64, cfg.Publishers),
		tokens: map[int][][][]int32{}, rssMax: map[int]int64{},
	}
	r.res.OpsPerMessage = 2 * (r.blocks - r.sysBlocks)
	round0 := make([][][]int32, cfg.Publishers)
	r.keys = make([][][]uint64, cfg.Publishers)
	r.holdsGroup = make([][]bool, cfg.Publishers)
	for p := range cfg.Publishers {
		pls := c.perPub[p]
		sl := fleetSlots{n: len(pls), group: make([]int, len(pls))}
		r.holdsGroup[p] = make([]bool, cfg.Groups)
		round0[p] = make([][]int32, len(pls))
		for j, pl := range pls {
			sl.group[j] = c.prompts[pl.prompt].group
			r.holdsGroup[p][sl.group[j]] = true
			round0[p][j] = c.prompts[pl.prompt].tokens
		}
		if sl.n == 0 {
			return r.res, fmt.Errorf("publisher %d holds no prompt: use at least as many --prompts as --publishers", p)
		}
		r.slots = append(r.slots, sl)
		r.res.SlotsPerPub = append(r.res.SlotsPerPub, sl.n)
	}
	r.tokens[0] = round0
	// The keys of what each slot holds, for the first round's removals.
	if err := parallelIdx(cfg.Publishers, func(p int) error {
		ch := hashing.AcquireChain()
		defer hashing.ReleaseChain(ch)
		r.keys[p] = make([][]uint64, r.slots[p].n)
		for j, t := range round0[p] {
			r.keys[p][j] = chainKeys(ch, prof, bs, t)
			if len(r.keys[p][j]) != r.blocks {
				return fmt.Errorf("publisher %d slot %d: %d keys for %d blocks", p, j, len(r.keys[p][j]), r.blocks)
			}
		}
		return nil
	}); err != nil {
		return r.res, err
	}

	m := fl[0]
	// The peak of the initial ingest is not the churn's: reset VmHWM
	// (proc(5), clear_refs "5") so that the end's VmHWM is the churn's.
	if m.pid > 0 {
		r.res.PeakReset = os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", m.pid), []byte("5"), 0) == nil
	}
	ev0, shed0 := r.dropCounters()
	stopRSS := r.sampleRSS(m)
	levels := s.o.levels
	total := s.o.fleet.rounds + len(levels)
	var err error
	for k := 1; k <= total && err == nil; k++ {
		conc := 0
		if k > s.o.fleet.rounds {
			conc = levels[k-s.o.fleet.rounds-1]
		}
		err = r.round(ctx, k, conc)
	}
	stopRSS()
	ev1, shed1 := r.dropCounters()
	r.res.IndexEvictions, r.res.LinkShed = ev1-ev0, shed1-shed0
	var quiet, steady []float64
	for _, rd := range r.res.Rounds {
		r.res.RSSMax = max(r.res.RSSMax, rd.RSSMax)
		if rd.Concurrency == 0 && rd.ServerCPUPerOpUS >= 0 {
			quiet = append(quiet, rd.ServerCPUPerOpUS)
			if rd.Round > 1 {
				steady = append(steady, rd.ServerCPUPerOpUS)
			}
		}
	}
	r.res.MedianCPUPerOpUS, r.res.SteadyCPUPerOpUS = medianF(quiet), medianF(steady)
	r.rssMu.Lock()
	r.res.BelowNotes = slices.Clone(r.belowNotes)
	r.rssMu.Unlock()
	r.res.Exact, r.res.Ranged, r.res.Above, r.res.Below, r.res.Answers = r.exact.Load(), r.ranged.Load(), r.above.Load(), r.below.Load(), r.answers.Load()
	if r.res.Below > 0 && r.res.IndexEvictions <= 0 && r.res.LinkShed <= 0 {
		fails.add("fleet: %d answer entries below the model with no index eviction or shed verification to explain them", r.res.Below)
	}
	if err != nil {
		return r.res, err
	}
	// Settled: the server idle after the last round, and the median of
	// its RSS over the next 2 s (the runtime returns freed pages in the
	// background, and one reading may catch a step of it).
	s.waitQuiet(ctx, fl)
	var settled []int64
	for range 20 {
		if !sleepCtx(ctx, 100*time.Millisecond) {
			return r.res, ctx.Err()
		}
		settled = append(settled, m.rss())
	}
	r.res.SettledRSS, r.res.PeakRSS = median(settled), m.peak()
	if r.res.SettledRSS > 0 && r.res.PeakRSS > 0 {
		r.res.PeakRatio = float64(r.res.PeakRSS) / float64(r.res.SettledRSS)
	}
	return r.res, ctx.Err()
}

// round runs replacement round k with conc query workers (0: none).
func (r *fleetRun) round(ctx context.Context, k, conc int) error {
	s, bs := r.s, r.c.cfg.BlockSize
	t0 := time.Now()
	payloads, err := r.prepare(k)
	if err != nil {
		return err
	}
	msgs := 0
	for _, p := range payloads {
		msgs += len(p)
	}
	ops := int64(msgs) * int64(r.res.OpsPerMessage)
	s.logf("fleet round %d: %d messages (%d block operations) prepared in %v", k, msgs, ops, time.Since(t0).Round(time.Millisecond))
	// What the previous round left the server to do is not this one's.
	s.waitQuiet(ctx, r.fl)
	m := r.fl[0]
	base, err := r.eventsDone()
	if err != nil {
		return err
	}
	rd := fleetRound{Round: k, Concurrency: conc, Messages: msgs, BlockOps: ops}
	r.cur.Store(int64(k))
	cpu0 := total(r.fl.cpus())
	f0, faultsKnown := m.faults()
	start := time.Now()

	stopQ := make(chan struct{})
	var qwg sync.WaitGroup
	per := make([][]sample, conc)
	for w := range conc {
		qwg.Add(1)
		go func() {
			defer qwg.Done()
			per[w] = r.queryWorker(stopQ, start, uint64(k)<<8|uint64(w))
		}()
	}
	sendErr := make(chan error, 1)
	// A round with queries spreads its messages over --duration unless
	// --fleet-rate sets the pace: at once, it would be over before the
	// queries had measured anything.
	rate := s.o.fleet.rate
	if conc > 0 && rate == 0 {
		rate = float64(ops) / s.o.duration.Seconds()
	}
	rd.RateOpsPerSec = rate
	go func() { sendErr <- r.send(ctx, payloads, rate) }()
	polls, werr := r.awaitApplied(ctx, base+2*float64(msgs), sendErr)
	close(stopQ)
	qwg.Wait()
	if werr != nil {
		return werr
	}
	cpuApplied := total(r.fl.cpus())
	// Reads of /metrics cost the server too: measured on a few more.
	const probes = 5
	for range probes {
		if _, err := r.eventsDone(); err != nil {
			return err
		}
	}
	perPoll := (total(r.fl.cpus()) - cpuApplied) / probes
	for i := range r.sent {
		r.applied[i].Store(r.sent[i].Load())
	}
	rd.Seconds = time.Since(start).Seconds()
	rd.OpsPerSec = float64(ops) / rd.Seconds
	rd.ServerCPUPerOpUS = perUnit(cpu0, cpuApplied-time.Duration(polls)*perPoll, int(ops))
	if f, ok := m.faults(); ok && faultsKnown {
		rd.FaultsPerOp = float64(f.minor-f0.minor) / float64(ops)
	}
	if conc > 0 {
		var all []sample
		for _, p := range per {
			all = append(all, p...)
		}
		lat := latencies(all)
		rd.Queries = len(all)
		rd.QPS = float64(len(all)) / rd.Seconds
		rd.P50US, rd.P99US, rd.MaxUS = us(percentile(lat, 0.5)), us(percentile(lat, 0.99)), us(percentile(lat, 1))
		// The round's CPU less its block operations at the quiet rounds'
		// median cost: what the queries added.
		if med := r.quietMedian(); med >= 0 && len(all) > 0 && cpu0 >= 0 {
			// Negative when the round's noise exceeds the queries' cost:
			// unknown then, never 0.
			q := us(cpuApplied-time.Duration(polls)*perPoll-cpu0) - med*float64(ops)
			rd.ServerCPUPerQueryUS = -1
			if q > 0 {
				rd.ServerCPUPerQueryUS = q / float64(len(all))
			}
		} else {
			rd.ServerCPUPerQueryUS = -1
		}
	}
	rd.RSSEnd = m.rss()
	r.rssMu.Lock()
	rd.RSSMax = max(r.rssMax[k], rd.RSSEnd)
	r.rssMu.Unlock()
	n, _, err := s.apis[0].prefixCount(s.o.model, bs)
	if err != nil {
		return err
	}
	rd.PrefixCount = n
	if want := r.c.distinctBlocks() + len(s.pubs); n != want {
		r.fails.add("fleet round %d: prefix_count %d after the round, want %d (each replacement removes as many distinct blocks as it stores)", k, n, want)
	}
	// With nothing in flight every answer is exact: a few slots per
	// publisher, their new and their old prompt.
	r.checkQuiet(k)
	// Queries of the next round ask rounds k-1 and k at most.
	delete(r.tokens, k-2)
	r.res.Rounds = append(r.res.Rounds, rd)
	q := ""
	if conc > 0 {
		q = fmt.Sprintf("; %d queries at concurrency %d, p50 %s p99 %s, server CPU/query %s", rd.Queries, conc, fmtUS(rd.P50US), fmtUS(rd.P99US), fmtUS(rd.ServerCPUPerQueryUS))
	}
	s.logf("fleet round %d: %.2f s, %.0f ops/s, server CPU per block op %s, RSS %s (max %s)%s; %d wrong so far",
		k, rd.Seconds, rd.OpsPerSec, fmtFrac(rd.ServerCPUPerOpUS), fmtBytes(rd.RSSEnd), fmtBytes(rd.RSSMax), q, r.fails.count.Load())
	return ctx.Err()
}

// quietMedian is the median server CPU per block operation of the quiet
// rounds so far (-1: none).
func (r *fleetRun) quietMedian() float64 {
	var v []float64
	for _, rd := range r.res.Rounds {
		if rd.Concurrency == 0 && rd.ServerCPUPerOpUS >= 0 {
			v = append(v, rd.ServerCPUPerOpUS)
		}
	}
	return medianF(v)
}

func medianF(v []float64) float64 {
	if len(v) == 0 {
		return -1
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// fleetTokens is slot j of publisher p's round-k prompt (k >= 1): the
// slot's group's system prompt, then a private suffix drawn from a PRNG
// seeded with (p, j, k), from the corpus's vocabulary.
func (r *fleetRun) fleetTokens(p, j, k int) []int32 {
	cfg := r.c.cfg
	t := make([]int32, r.blocks*cfg.BlockSize)
	n := copy(t, r.c.systems[r.slots[p].group[j]])
	rng := rand.New(rand.NewPCG(cfg.Seed^0xf1ee7, uint64(p)<<40|uint64(j)<<20|uint64(k)))
	for i := n; i < len(t); i++ {
		t[i] = rng.Int32N(cfg.Vocab)
	}
	return t
}

// gomemlimit is the memory limit a spawned server runs under ("" : none).
func gomemlimit(o *options) string {
	if o.serverMemoryMiB > 0 {
		return fmt.Sprintf("%dMiB", o.serverMemoryMiB)
	}
	return ""
}

// writeMarkdown prints the fleet phase: one row per round, then the
// memory and the answers.
func (f *fleetResult) writeMarkdown(w io.Writer) {
	rate := "quiet rounds sent at once, rounds with queries spread over --duration"
	if f.RateOpsPerSec > 0 {
		rate = fmt.Sprintf("sent at %.0f block operations/s", f.RateOpsPerSec)
	}
	limit := "none"
	if f.ServerMemLimit != "" {
		limit = f.ServerMemLimit
	}
	fmt.Fprintf(w, "Fleet at capacity: every publisher replaces each prompt it holds (%v) by a new one, one message per prompt (%d block operations: the old prompt's private blocks removed, the new one's stored), %s; server GOMEMLIMIT %s\n\n",
		f.SlotsPerPub, f.OpsPerMessage, rate, limit)
	fmt.Fprintln(w, "| round | queries | block ops | sent at (ops/s) | until verified | ops/s | server CPU/block op | faults/op | RSS at end | RSS max | query p50 | p99 | max | server CPU/query | prefix_count |")
	fmt.Fprintln(w, "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, rd := range f.Rounds {
		q, p50, p99, mx, cpu := "none", "", "", "", ""
		if rd.Concurrency > 0 {
			q = fmt.Sprintf("%d at concurrency %d (%.0f/s)", rd.Queries, rd.Concurrency, rd.QPS)
			p50, p99, mx, cpu = fmtUS(rd.P50US), fmtUS(rd.P99US), fmtUS(rd.MaxUS), fmtFrac(rd.ServerCPUPerQueryUS)
		}
		sentAt := "at once"
		if rd.RateOpsPerSec > 0 {
			sentAt = fmt.Sprintf("%.0f", rd.RateOpsPerSec)
		}
		perOp := fmtFrac(rd.ServerCPUPerOpUS)
		if rd.Concurrency > 0 {
			// The queries' CPU is in it: not a block operation's cost.
			perOp = "(" + perOp + " with the queries)"
		}
		fmt.Fprintf(w, "| %d | %s | %d | %s | %.2f s | %.0f | %s | %.4f | %s | %s | %s | %s | %s | %s | %d |\n",
			rd.Round, q, rd.BlockOps, sentAt, rd.Seconds, rd.OpsPerSec, perOp, rd.FaultsPerOp,
			fmtBytes(rd.RSSEnd), fmtBytes(rd.RSSMax), p50, p99, mx, cpu, rd.PrefixCount)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| fleet measure | value |")
	fmt.Fprintln(w, "| --- | ---: |")
	fmt.Fprintf(w, "| server CPU per block operation, quiet rounds: median / from the second round on | %s / %s |\n", fmtFrac(f.MedianCPUPerOpUS), fmtFrac(f.SteadyCPUPerOpUS))
	peak := "VmHWM during the churn (reset after ingest)"
	if !f.PeakReset {
		peak = "VmHWM (not reset: includes the initial ingest)"
	}
	ratio := "n/a"
	if f.PeakRatio > 0 {
		ratio = fmt.Sprintf("%.2f×", f.PeakRatio)
	}
	fmt.Fprintf(w, "| RSS max sampled (every 50 ms) | %s |\n", fmtBytes(f.RSSMax))
	fmt.Fprintf(w, "| %s / settled RSS (median over 2 s once the server is idle after the last round) / ratio | %s / %s / %s |\n", peak, fmtBytes(f.PeakRSS), fmtBytes(f.SettledRSS), ratio)
	fmt.Fprintf(w, "| answers checked during and after the rounds | %d |\n", f.Answers)
	fmt.Fprintf(w, "| answer entries: exact / in a range (a message in flight) / above the model / below it | %d / %d / %d / %d |\n", f.Exact, f.Ranged, f.Above, f.Below)
	fmt.Fprintf(w, "| index evictions / link verifications shed during the rounds | %d / %d |\n", f.IndexEvictions, f.LinkShed)
	for _, n := range f.BelowNotes {
		fmt.Fprintf(w, "\n- %s", n)
	}
	if len(f.BelowNotes) > 0 {
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w)
}
