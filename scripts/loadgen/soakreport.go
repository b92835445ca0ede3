package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// soakLevel is the server's state at a quiescent point.
type soakLevel struct {
	At         float64 `json:"at_s"`
	RSS        int64   `json:"rss_bytes"`
	Goroutines int64   `json:"goroutines"`
	FDs        int64   `json:"open_fds"`
}

// soakReport is everything a soak measured and its verdicts. Counts that
// could not be measured are -1.
type soakReport struct {
	Engine          string  `json:"engine"`
	Publishers      int     `json:"publishers"`
	Churned         int     `json:"churned_publishers"`
	Window          int     `json:"window_prompts"`
	PromptTokens    int     `json:"prompt_tokens"`
	SystemTokens    int     `json:"system_tokens"`
	BlockSize       int     `json:"block_size"`
	Groups          int     `json:"groups"`
	OpIntervalMS    float64 `json:"op_interval_ms"`
	ClearEvery      int     `json:"clear_every"`
	QueryWorkers    int     `json:"query_workers"`
	ChurnMS         float64 `json:"churn_interval_ms"`
	MaxTransients   int     `json:"max_transients"`
	MemoMiB         int     `json:"server_memo_mib"` // -1: the server's default
	DurationS       float64 `json:"duration_s"`
	WarmupS         float64 `json:"warmup_s"`
	Seconds         float64 `json:"elapsed_s"`
	WindDownSeconds float64 `json:"wind_down_s"`
	RSSTolerance    float64 `json:"rss_tolerance"`
	GoroutineSlack  int     `json:"goroutine_slack"`

	Ops           int `json:"steps"`
	BlocksStored  int `json:"blocks_stored"`
	BlocksRemoved int `json:"blocks_removed"`
	Clears        int `json:"clears"`

	Queries   int64 `json:"queries"`
	Exact     int64 `json:"queries_exact"`
	Tolerant  int64 `json:"queries_in_flight"`
	Unchecked int64 `json:"queries_unchecked"`
	// Per publisher entry: exact, within a range, or around a
	// registration change. Most entries of a query with an update in
	// flight are still exact.
	EntriesExact    int64   `json:"entries_exact"`
	EntriesRange    int64   `json:"entries_in_flight_range"`
	EntriesPresence int64   `json:"entries_registration_change"`
	QPS             float64 `json:"queries_per_s"`
	P50US           float64 `json:"p50_us"`
	P99US           float64 `json:"p99_us"`
	MaxUS           float64 `json:"max_us"`
	Slow            int64   `json:"queries_over_100ms"`
	// Unregistrations, the share of the soak one was in flight and the
	// slowest call: set against SlowUnreg, they tell whether queries stall
	// while a service is torn down.
	Unregistrations int     `json:"unregistrations"`
	UnregShare      float64 `json:"unregistration_time_share"`
	SlowestUnregMS  float64 `json:"slowest_unregistration_ms"`
	SlowUnreg       int64   `json:"queries_over_100ms_in_unregistration"`

	RestartsNewPort   int64 `json:"restarts_new_port"`
	RestartsSamePort  int64 `json:"restarts_same_port"`
	RestartsInPlace   int64 `json:"restarts_in_place"`
	Transients        int64 `json:"transient_services"`
	TransientFailures int64 `json:"transient_failures"`

	Wrong            int64 `json:"wrong_answers"`
	FiveXX           int64 `json:"responses_5xx"`
	ServerFiveXX     int64 `json:"server_counted_5xx"`
	OtherStatus      int64 `json:"other_error_statuses"`
	TransportOutside int64 `json:"transport_errors"`
	TransportInside  int64 `json:"transport_errors_in_unregistration"`
	ControlErrors    int64 `json:"control_errors"`
	MaxStale         int64 `json:"max_stale_sources"`
	// RestartsDetected counts in-place restarts the server counted in
	// conductor_publisher_restarts_total (a new epoch each, never stale):
	// it must equal RestartsInPlace, and no source may go stale.
	RestartsDetected int64 `json:"restarts_detected"`
	StaleTransitions int64 `json:"stale_transitions"`
	StaleRegressions int64 `json:"stale_transitions_regression"`
	TeardownLeft     int   `json:"contexts_left_after_teardown"`
	FinalStale       int64 `json:"final_stale_sources"`

	RSSStart int64     `json:"rss_start_bytes"`
	Warmup   soakLevel `json:"after_warmup"`
	Final    soakLevel `json:"final"`
	PeakRSS  int64     `json:"peak_rss_after_warmup_bytes"`

	LoadAverage [2]float64 `json:"load_average_1m"`

	Aborted      string       `json:"aborted,omitempty"`
	Failures     int64        `json:"failures"`
	FailureNotes []string     `json:"failure_examples,omitempty"`
	Verdicts     []verdict    `json:"verdicts"`
	Samples      []soakSample `json:"samples"`
}

// verdict is one assertion's outcome.
type verdict struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

func (r *soakRun) newReport() *soakReport {
	c := r.cfg
	return &soakReport{
		Engine: string(r.o.engine), Publishers: c.publishers, Churned: c.churned, Window: c.window,
		PromptTokens: r.shape.blocks * r.shape.bs, SystemTokens: r.shape.sysBlocks * r.shape.bs,
		BlockSize: r.shape.bs, Groups: c.groups, OpIntervalMS: ms(c.opInterval), ClearEvery: c.clearEvery,
		QueryWorkers: c.queryConc, ChurnMS: ms(c.churnInterval), MaxTransients: c.transients, MemoMiB: c.memoMiB,
		DurationS: c.duration.Seconds(), WarmupS: r.warmupDuration().Seconds(),
		RSSTolerance: c.rssTolerance, GoroutineSlack: c.goroutineSlack,
		RSSStart: -1, Warmup: soakLevel{RSS: -1, Goroutines: -1, FDs: -1}, Final: soakLevel{RSS: -1, Goroutines: -1, FDs: -1},
		PeakRSS: -1, ServerFiveXX: -1, FinalStale: -1, TeardownLeft: -1, StaleTransitions: -1, StaleRegressions: -1, LoadAverage: [2]float64{-1, -1},
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// collect copies the workers' counters into the report. It runs after
// every worker has stopped.
func (r *soakRun) collect(rep *soakReport, qs []queryStats) {
	for _, p := range r.pubs {
		rep.Ops += p.ops
		rep.BlocksStored += p.stored
		rep.BlocksRemoved += p.removed
		rep.Clears += p.clears
	}
	k := &r.counts
	rep.Queries, rep.Exact, rep.Tolerant, rep.Unchecked = k.queries.Load(), k.exact.Load(), k.tolerant.Load(), k.unchecked.Load()
	rep.Wrong, rep.FiveXX, rep.OtherStatus = k.wrong.Load(), k.fiveXX.Load(), k.otherStatus.Load()
	rep.TransportOutside, rep.TransportInside, rep.ControlErrors = k.transportOutside.Load(), k.transportInside.Load(), k.controlErrors.Load()
	rep.RestartsNewPort, rep.RestartsSamePort = k.restartMode[restartNewPort].Load(), k.restartMode[restartSamePort].Load()
	rep.RestartsInPlace, rep.RestartsDetected = k.restartMode[restartInPlace].Load(), k.restartsDetected.Load()
	rep.Transients, rep.TransientFailures = k.transients.Load(), k.transientFailures.Load()
	rep.Slow, rep.SlowUnreg = k.slow.Load(), k.slowInUnreg.Load()
	rep.EntriesExact, rep.EntriesRange, rep.EntriesPresence = k.entryExact.Load(), k.entryRange.Load(), k.entryPresence.Load()
	var lat []time.Duration
	for _, q := range qs {
		lat = append(lat, q.lat...)
	}
	slices.Sort(lat)
	if rep.Seconds > 0 {
		rep.QPS = float64(rep.Queries) / rep.Seconds
	}
	rep.P50US, rep.P99US, rep.MaxUS = us(percentile(lat, 0.5)), us(percentile(lat, 0.99)), us(percentile(lat, 1))
	rep.LoadAverage[1] = loadAverage()
}

// finish records the failures and computes the verdicts.
func (rep *soakReport) finish(f *failures, runErr error) {
	if runErr != nil {
		rep.Aborted = runErr.Error()
	}
	rep.Failures = f.count.Load()
	f.mu.Lock()
	rep.FailureNotes = slices.Clone(f.first)
	f.mu.Unlock()
	rep.Verdicts = rep.evaluate()
}

// passed reports whether every verdict holds.
func (rep *soakReport) passed() bool {
	for _, v := range rep.Verdicts {
		if !v.OK {
			return false
		}
	}
	return len(rep.Verdicts) > 0
}

// evaluate turns the measurements into verdicts. It is a pure function of
// the report so that tests can feed it bad figures and see it fail.
func (rep *soakReport) evaluate() []verdict {
	var out []verdict
	add := func(name string, ok bool, format string, args ...any) {
		out = append(out, verdict{name, ok, fmt.Sprintf(format, args...)})
	}

	// A soak that did nothing must not pass.
	ran := rep.Queries > 0 && rep.Ops > 0 && rep.Aborted == "" &&
		(rep.Churned == 0 || rep.restarts() > 0) &&
		(rep.MaxTransients == 0 || rep.Transients > 0)
	add("ran to the end with load and churn", ran, "%d steps, %d queries, %d restarts, %d transient services%s",
		rep.Ops, rep.Queries, rep.restarts(), rep.Transients, abortNote(rep.Aborted))

	w, f := rep.Warmup.RSS, rep.Final.RSS
	if w > 0 && f > 0 {
		growth := float64(f)/float64(w) - 1
		// Only growth fails: the runtime returning memory after a peak
		// caught at warm-up is not a leak.
		add(fmt.Sprintf("RSS within %.0f %% of its post-warm-up level", 100*rep.RSSTolerance), growth <= rep.RSSTolerance,
			"%s → %s (%+.1f %%; only growth fails), peak %s", fmtBytes(w), fmtBytes(f), 100*growth, fmtBytes(rep.PeakRSS))
	} else {
		add("RSS within tolerance", false, "RSS unknown: the server's pid is needed (--spawn or --server-pid)")
	}

	gw, gf := rep.Warmup.Goroutines, rep.Final.Goroutines
	add(fmt.Sprintf("goroutines within %d of their post-warm-up level", rep.GoroutineSlack),
		gw > 0 && gf > 0 && gf <= gw+int64(rep.GoroutineSlack),
		"%d → %d (%+d) after %.1f s of winding down", gw, gf, gf-gw, rep.WindDownSeconds)

	fw, ff := rep.Warmup.FDs, rep.Final.FDs
	add(fmt.Sprintf("open fds within %d of their post-warm-up level", rep.GoroutineSlack),
		fw > 0 && ff > 0 && ff <= fw+int64(rep.GoroutineSlack),
		"%d → %d (%+d): a socket leaked per re-registration would show here", fw, ff, ff-fw)

	add("no wrong answers", rep.Wrong == 0, "%d wrong of %d checked (%d exact, %d with an update in flight)",
		rep.Wrong, rep.Exact+rep.Tolerant, rep.Exact, rep.Tolerant)
	add("no 5xx responses", rep.FiveXX == 0 && rep.ServerFiveXX == 0,
		"%d seen by the load generator, %s counted by the server", rep.FiveXX, fmtCount(rep.ServerFiveXX))
	add("no transport errors outside unregistrations", rep.TransportOutside == 0,
		"%d (%d while an unregistration was in flight, tolerated)", rep.TransportOutside, rep.TransportInside)
	add("in-place restarts are new epochs, and no source goes stale", rep.FinalStale == 0 &&
		rep.StaleTransitions == 0 && rep.StaleRegressions == 0 && rep.RestartsDetected == rep.RestartsInPlace,
		"%d of %d in-place restarts detected; %s stale transitions (%s for a sequence regression); %s stale at the end",
		rep.RestartsDetected, rep.RestartsInPlace, fmtCount(rep.StaleTransitions), fmtCount(rep.StaleRegressions), fmtCount(rep.FinalStale))
	add("teardown leaves no context behind", rep.TeardownLeft == 0,
		"%s of the soak's contexts still listed 5 s after their last service was unregistered", fmtCount(int64(rep.TeardownLeft)))
	add("no other errors", rep.OtherStatus == 0 && rep.ControlErrors == 0 && rep.TransientFailures == 0,
		"%d other error statuses, %d control-plane errors, %d failed transient registrations",
		rep.OtherStatus, rep.ControlErrors, rep.TransientFailures)
	return out
}

func (rep *soakReport) restarts() int64 {
	return rep.RestartsNewPort + rep.RestartsSamePort + rep.RestartsInPlace
}

func abortNote(s string) string {
	if s == "" {
		return ""
	}
	return "; aborted: " + s
}

func fmtCount(n int64) string {
	if n < 0 {
		return "unknown"
	}
	return fmt.Sprint(n)
}

func fmtInt(n int64) string {
	if n < 0 {
		return "n/a"
	}
	return fmt.Sprint(n)
}

// writeMarkdown prints the soak summary.
func (rep *soakReport) writeMarkdown(w io.Writer) {
	fmt.Fprintf(w, "\n## Soak: %.0f s of %s ingestion, queries and registration churn\n\n", rep.DurationS, rep.Engine)
	memo := "the server's default"
	if rep.MemoMiB >= 0 {
		memo = fmt.Sprintf("%d MiB", rep.MemoMiB)
	}
	fmt.Fprintf(w, "%d publishers (%d churned), each holding %d prompts of %d tokens (block %d, %d groups with %d-token system prompts), one step per %.0f ms, a clear every %d steps; %d query workers; a churn action every %.0f ms with up to %d dead-endpoint services; a spawned server's prefix memo: %s.\n\n",
		rep.Publishers, rep.Churned, rep.Window, rep.PromptTokens, rep.BlockSize, rep.Groups, rep.SystemTokens,
		rep.OpIntervalMS, rep.ClearEvery, rep.QueryWorkers, rep.ChurnMS, rep.MaxTransients, memo)
	fmt.Fprintln(w, "| measure | value |")
	fmt.Fprintln(w, "| --- | ---: |")
	fmt.Fprintf(w, "| elapsed (warm-up) | %.1f s (%.1f s) |\n", rep.Seconds, rep.WarmupS)
	fmt.Fprintf(w, "| publisher steps | %d: %d blocks stored, %d removed, %d clears |\n", rep.Ops, rep.BlocksStored, rep.BlocksRemoved, rep.Clears)
	fmt.Fprintf(w, "| queries | %d (%.0f/s): %d exact, %d with an update in flight, %d unchecked |\n", rep.Queries, rep.QPS, rep.Exact, rep.Tolerant, rep.Unchecked)
	fmt.Fprintf(w, "| publisher entries checked: exact / in-flight range / around a registration change | %d / %d / %d |\n", rep.EntriesExact, rep.EntriesRange, rep.EntriesPresence)
	fmt.Fprintf(w, "| query latency p50 / p99 / max | %s / %s / %s |\n", fmtUS(rep.P50US), fmtUS(rep.P99US), fmtUS(rep.MaxUS))
	fmt.Fprintf(w, "| queries over 100 ms (overlapping an unregistration) | %d (%d) |\n", rep.Slow, rep.SlowUnreg)
	fmt.Fprintf(w, "| unregistrations: count, share of the time in flight, slowest | %d, %.1f %%, %.1f ms |\n", rep.Unregistrations, 100*rep.UnregShare, rep.SlowestUnregMS)
	fmt.Fprintf(w, "| publisher restarts (new port / same port / in place) | %d / %d / %d |\n", rep.RestartsNewPort, rep.RestartsSamePort, rep.RestartsInPlace)
	fmt.Fprintf(w, "| dead-endpoint services registered | %d |\n", rep.Transients)
	fmt.Fprintf(w, "| server RSS at start / after warm-up / final / peak | %s / %s / %s / %s |\n", fmtBytes(rep.RSSStart), fmtBytes(rep.Warmup.RSS), fmtBytes(rep.Final.RSS), fmtBytes(rep.PeakRSS))
	fmt.Fprintf(w, "| server RSS after warm-up, by quarter of the rest | %s |\n", rssTrajectory(rep.Samples, rep.WarmupS))
	fmt.Fprintf(w, "| goroutines after warm-up / final | %s / %s |\n", fmtInt(rep.Warmup.Goroutines), fmtInt(rep.Final.Goroutines))
	fmt.Fprintf(w, "| open fds after warm-up / final | %s / %s |\n", fmtInt(rep.Warmup.FDs), fmtInt(rep.Final.FDs))
	fmt.Fprintf(w, "| machine load average (1 min) at start / end | %s / %s |\n", fmtLoad(rep.LoadAverage[0]), fmtLoad(rep.LoadAverage[1]))
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| assertion | result | detail |")
	fmt.Fprintln(w, "| --- | --- | --- |")
	for _, v := range rep.Verdicts {
		res := "pass"
		if !v.OK {
			res = "**FAIL**"
		}
		fmt.Fprintf(w, "| %s | %s | %s |\n", v.Name, res, v.Detail)
	}
	for _, n := range rep.FailureNotes {
		fmt.Fprintf(w, "\n- %s", n)
	}
	if len(rep.FailureNotes) > 0 {
		fmt.Fprintln(w)
	}
}

// rssTrajectory shows the RSS at the end of each quarter of the time after
// warm-up, so a reader can tell a plateau from a slow climb that stayed
// under the tolerance.
func rssTrajectory(samples []soakSample, warmupS float64) string {
	var after []soakSample
	for _, s := range samples {
		if s.At.Seconds() >= warmupS && s.RSS >= 0 {
			after = append(after, s)
		}
	}
	if len(after) < 4 {
		return "n/a"
	}
	parts := []string{fmtBytes(after[0].RSS)}
	for q := 1; q <= 4; q++ {
		parts = append(parts, fmtBytes(after[q*(len(after)-1)/4].RSS))
	}
	return strings.Join(parts, " → ")
}

func (rep *soakReport) writeJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}
