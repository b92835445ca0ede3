package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
)

// report is everything a run measured; it is printed as Markdown or JSON.
// Durations are in microseconds or seconds as their names say; server
// figures are -1 when no server pid was known.
type report struct {
	// ServerReplicas is how many servers were driven, Targets their base
	// URLs; the queries went to them in turn. RSS figures are the first
	// server's, CPU figures every server's.
	ServerReplicas int      `json:"server_replicas"`
	Targets        []string `json:"targets"`

	Engine        string         `json:"engine"`
	Publishers    int            `json:"publishers"`
	BlockSize     int            `json:"block_size"`
	PromptTokens  int            `json:"prompt_tokens"`
	SystemTokens  int            `json:"system_tokens"`
	Groups        int            `json:"groups"`
	Replicas      int            `json:"replicas"`
	StoredPrompts int            `json:"stored_prompts"`
	PoolQueries   int            `json:"pool_queries"`
	PoolKinds     map[string]int `json:"pool_kinds"`
	TokenEncoding string         `json:"token_encoding"`

	Ingest ingestResult `json:"ingest"`
	// Cold is --cold-pass and Chain --chain-baseline, when run.
	Cold  *coldResult  `json:"cold_pass,omitempty"`
	Chain *chainResult `json:"bare_chain,omitempty"`
	// Warm is the cold pass's prompts asked a second time, right after it.
	Warm *coldResult `json:"warm_pass,omitempty"`
	// Floor is --floor: the 2-block request floor.
	Floor *floorResult `json:"floor,omitempty"`
	// AfterUnregSeconds is when RSS.AfterUnreg was read, counted from the
	// last unregistration: as soon as RSS was within 20 % of its value
	// before ingest, or 5 s.
	AfterUnregSeconds float64       `json:"after_unregistration_s"`
	unregEnd          time.Time     // when the last unregister call returned
	Levels            []levelResult `json:"levels"`
	Unreg             unregResult   `json:"unregistration"`
	// Restart is the --restart phase, when run.
	Restart *restartResult `json:"restart,omitempty"`
	RSS     rssResult      `json:"server_rss_bytes"`
	RSSAnon rssResult      `json:"server_rss_anon_bytes"`
	// Fleet is the --fleet-rounds phase, when run (the levels and the
	// unregistration under load are not run then).
	Fleet *fleetResult `json:"fleet,omitempty"`
	// SteadyIngest is --steady-ingest's ingest during the levels.
	SteadyIngest *steadyResult `json:"steady_ingest,omitempty"`
	// PeakRSS is the (first) server's peak resident size, VmHWM, after
	// ingest and at the end of the run (-1: unknown): what a container's
	// memory limit is held against.
	PeakRSS peakResult `json:"server_peak_rss_bytes"`
	// HugeBeforeCold is how much of the (first) server's anonymous memory
	// was on transparent huge pages when the cold pass began (-1: not
	// read).
	HugeBeforeCold int64 `json:"server_huge_page_bytes_before_cold"`
	Checked        int64 `json:"answers_checked"`

	// LoadAverage is /proc/loadavg's 1-minute figure at the start and the
	// end: on a shared machine other work skews every number here.
	LoadAverage [2]float64 `json:"load_average_1m"`

	Failures     int64    `json:"failures"`
	FailureNotes []string `json:"failure_examples,omitempty"`
}

// restartResult is a graceful restart on the same state directory: how
// long the old process took to stop, the new one to answer /healthz and
// /readyz (snapshot loaded, every source caught up), and the answers
// checked again afterwards.
type restartResult struct {
	StopMS      float64 `json:"stop_ms"`
	ToHealthyMS float64 `json:"to_healthy_ms"`
	ToReadyMS   float64 `json:"to_ready_ms"`
	Checked     int     `json:"answers_checked"`
	Failures    int64   `json:"failures"`
}

type ingestResult struct {
	BlocksPublished int     `json:"blocks_published"`
	Messages        int     `json:"messages"`
	DistinctBlocks  int     `json:"distinct_blocks"`
	Seconds         float64 `json:"seconds"`
	BlocksPerSec    float64 `json:"blocks_per_s"`
	// ServerCPUPerBlockUS is the server's CPU time during ingest divided by
	// the blocks published (with several servers, which each ingest every
	// block: their CPU time divided by blocks × servers).
	ServerCPUPerBlockUS float64 `json:"server_cpu_per_block_us"`
	// VerifiedSeconds is from the start of ingest until no stored block
	// waits for link verification any more (then the query phases
	// start); ServerCPUPerBlockVerifiedUS is the server CPU until then.
	// PublisherCPUPerBlockUS is the load generator's own CPU during ingest
	// (its publishers, libzmq's send side, the polling) per block.
	PublisherCPUPerBlockUS      float64 `json:"publisher_cpu_per_block_us"`
	VerifiedSeconds             float64 `json:"verified_seconds"`
	VerifiedBlocksPerSec        float64 `json:"verified_blocks_per_s"`
	ServerCPUPerBlockVerifiedUS float64 `json:"server_cpu_per_block_verified_us"`
	// FaultsPerBlock is the first server's minor page faults from the
	// start of ingest until verified, per block, and SystemCPUPerBlockUS
	// its time in the kernel over the same span (10 ms ticks). A minor
	// fault is mostly the first touch of a fresh 4 KiB page, whose cost is
	// the machine's (go run ./scripts/pagefault measures it), not the
	// server's code: BENCHMARKS.md subtracts it to name the server's part.
	FaultsPerBlock      float64 `json:"faults_per_block"`
	SystemCPUPerBlockUS float64 `json:"system_cpu_per_block_us"`
}

type levelResult struct {
	Concurrency int     `json:"concurrency"`
	Queries     int     `json:"queries"`
	Seconds     float64 `json:"seconds"`
	QPS         float64 `json:"queries_per_s"`
	P50US       float64 `json:"p50_us"`
	P99US       float64 `json:"p99_us"`
	P999US      float64 `json:"p999_us"`
	MaxUS       float64 `json:"max_us"`
	// ServerCPUPerQueryUS is the server's CPU time over the level divided
	// by the queries answered.
	ServerCPUPerQueryUS float64 `json:"server_cpu_per_query_us"`
	// ClientCPUPerQueryUS is the load generator's own CPU per query
	// (encoding is done up front; this is HTTP plus decoding and checking).
	ClientCPUPerQueryUS float64 `json:"client_cpu_per_query_us"`
	// ServerCPUCores and ClientCPUCores are the servers' (together) and
	// the load generator's CPU time over the level's wall time: on one
	// machine they share its cores, so their sum near the core count says
	// the machine, not a server, was the limit.
	ServerCPUCores float64 `json:"server_cpu_cores"`
	ClientCPUCores float64 `json:"client_cpu_cores"`
	// PerServer splits the level by the server that answered.
	PerServer []replicaLevel `json:"per_server"`
	Failures  int64          `json:"failures"`
	// AnswerHitPct, PrefixMemoHitPct and TokenMemoHitPct are the shares
	// of long queries, blocks and token ids the server's caches served over
	// the level (-1: unknown, or off; the answer cache is gone, so
	// AnswerHitPct is -1 against a current server and is kept to read older
	// reports); MemoBytes is what they held at its end.
	AnswerHitPct     float64 `json:"answer_hit_pct"`
	PrefixMemoHitPct float64 `json:"prefix_memo_hit_pct"`
	TokenMemoHitPct  float64 `json:"token_memo_hit_pct"`
	MemoBytes        int64   `json:"memo_bytes"`
}

type unregResult struct {
	Publishers  int     `json:"publishers"`
	Concurrency int     `json:"query_concurrency"`
	Seconds     float64 `json:"seconds"`
	MaxCallMS   float64 `json:"slowest_unregister_ms"`
	// Queries and the latencies below cover queries in flight at any time
	// between the first unregister call and the last answer.
	Queries  int     `json:"queries_overlapping"`
	P99US    float64 `json:"p99_us"`
	WorstUS  float64 `json:"worst_query_us"`
	Failures int64   `json:"failures"`
	// Reclaim, with --reclaim-window, covers the queries that ran entirely
	// inside the pause before the last publisher was unregistered (and are
	// not counted above).
	Reclaim *reclaimResult `json:"reclaim_window,omitempty"`
}

// reclaimResult is the query load while the service reclaims the entries of
// every publisher but the last.
type reclaimResult struct {
	Seconds float64 `json:"seconds"`
	Queries int     `json:"queries"`
	P99US   float64 `json:"p99_us"`
	WorstUS float64 `json:"worst_query_us"`
}

type rssResult struct {
	Start        int64 `json:"start"`
	BeforeIngest int64 `json:"before_ingest"`
	AfterIngest  int64 `json:"after_ingest"`
	AfterLoad    int64 `json:"after_load"`
	AfterUnreg   int64 `json:"after_unregistration"`
}

// steadyResult is what --steady-ingest stored while the levels ran.
type steadyResult struct {
	PromptsPerSecPerPublisher float64 `json:"prompts_per_sec_per_publisher"`
	Blocks                    int64   `json:"blocks"`
}

// peakResult is VmHWM at two points of the run.
type peakResult struct {
	AfterIngest int64 `json:"after_ingest"`
	End         int64 `json:"end"`
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func fmtUS(v float64) string {
	switch {
	case v < 0:
		return "n/a"
	case v >= 10000:
		return fmt.Sprintf("%.1f ms", v/1000)
	}
	return fmt.Sprintf("%.0f µs", v)
}

func fmtBytes(b int64) string {
	if b < 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
}

func fmtPct(v float64) string {
	if v < 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.1f %%", v)
}

// writeMarkdown prints the per-level table and a summary table.
func (r *report) writeMarkdown(w io.Writer) {
	servers := ""
	if r.ServerReplicas > 1 {
		servers = fmt.Sprintf("; %d servers, every publisher registered on each", r.ServerReplicas)
	}
	fmt.Fprintf(w, "\n%d %s publishers, %d stored prompts of %d tokens (block %d, %d groups with %d-token system prompts, %d replica(s)); pool of %d queries %s; token_ids as %s%s\n\n",
		r.Publishers, r.Engine, r.StoredPrompts, r.PromptTokens, r.BlockSize, r.Groups, r.SystemTokens, r.Replicas, r.PoolQueries, kindsString(r.PoolKinds), r.TokenEncoding, servers)
	if r.Fleet != nil {
		r.Fleet.writeMarkdown(w)
	} else {
		fmt.Fprintln(w, "| concurrency | queries | queries/s | p50 | p99 | p999 | max | server CPU/query | client CPU/query | memo hits (answers / blocks / ids), memory | wrong |")
		fmt.Fprintln(w, "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	}
	for _, l := range r.Levels {
		fmt.Fprintf(w, "| %d | %d | %.0f | %s | %s | %s | %s | %s | %s | %s / %s / %s, %s | %d |\n",
			l.Concurrency, l.Queries, l.QPS, fmtUS(l.P50US), fmtUS(l.P99US), fmtUS(l.P999US), fmtUS(l.MaxUS),
			fmtUS(l.ServerCPUPerQueryUS), fmtUS(l.ClientCPUPerQueryUS),
			fmtPct(l.AnswerHitPct), fmtPct(l.PrefixMemoHitPct), fmtPct(l.TokenMemoHitPct), fmtBytes(l.MemoBytes), l.Failures)
	}
	fmt.Fprintln(w)
	if r.ServerReplicas > 1 {
		r.writeServers(w)
	}
	if r.Chain != nil || r.Cold != nil || r.Warm != nil || r.Floor != nil {
		r.writeRatios(w)
	}
	fmt.Fprintln(w, "| measure | value |")
	fmt.Fprintln(w, "| --- | ---: |")
	in := r.Ingest
	fmt.Fprintf(w, "| ingest | %d blocks in %d messages (%d distinct) in %.2f s |\n", in.BlocksPublished, in.Messages, in.DistinctBlocks, in.Seconds)
	fmt.Fprintf(w, "| ingest rate | %.0f blocks/s |\n", in.BlocksPerSec)
	if rs := r.Restart; rs != nil {
		fmt.Fprintf(w, "| graceful restart: stop / healthy / ready | %.0f ms / %.0f ms / %.0f ms |\n", rs.StopMS, rs.ToHealthyMS, rs.ToReadyMS)
		fmt.Fprintf(w, "| answers checked after the restart | %d (%d wrong) |\n", rs.Checked, rs.Failures)
	}
	fmt.Fprintf(w, "| server CPU per ingested block | %s |\n", fmtFrac(in.ServerCPUPerBlockUS))
	fmt.Fprintf(w, "| publishers' CPU per block (this process, same cores) | %s |\n", fmtFrac(in.PublisherCPUPerBlockUS))
	fmt.Fprintf(w, "| until verified: seconds, rate, server CPU per block | %.2f s, %.0f blocks/s, %s |\n", in.VerifiedSeconds, in.VerifiedBlocksPerSec, fmtFrac(in.ServerCPUPerBlockVerifiedUS))
	if in.FaultsPerBlock > 0 {
		fmt.Fprintf(w, "| until verified: server page faults per block (minor), system CPU per block | %.4f, %s |\n", in.FaultsPerBlock, fmtFrac(in.SystemCPUPerBlockUS))
	}
	fmt.Fprintf(w, "| server RSS at start (anonymous) | %s (%s) |\n", fmtBytes(r.RSS.Start), fmtBytes(r.RSSAnon.Start))
	fmt.Fprintf(w, "| server RSS before ingest (anonymous) | %s (%s) |\n", fmtBytes(r.RSS.BeforeIngest), fmtBytes(r.RSSAnon.BeforeIngest))
	fmt.Fprintf(w, "| server RSS after ingest (anonymous) | %s (%s) |\n", fmtBytes(r.RSS.AfterIngest), fmtBytes(r.RSSAnon.AfterIngest))
	if r.Fleet == nil {
		fmt.Fprintf(w, "| server RSS after query load (anonymous) | %s (%s) |\n", fmtBytes(r.RSS.AfterLoad), fmtBytes(r.RSSAnon.AfterLoad))
	}
	if r.HugeBeforeCold >= 0 && r.Cold != nil {
		fmt.Fprintf(w, "| server memory on huge pages when the cold pass began | %s |\n", fmtBytes(r.HugeBeforeCold))
	}
	if r.Fleet == nil {
		fmt.Fprintf(w, "| server RSS after unregistration (anonymous), read after | %s (%s), %.1f s |\n", fmtBytes(r.RSS.AfterUnreg), fmtBytes(r.RSSAnon.AfterUnreg), r.AfterUnregSeconds)
	}
	if si := r.SteadyIngest; si != nil {
		fmt.Fprintf(w, "| steady ingest during the levels (server CPU per query includes it) | %g prompts/s per publisher, %d blocks |\n", si.PromptsPerSecPerPublisher, si.Blocks)
	}
	fmt.Fprintf(w, "| server peak RSS (VmHWM) after ingest / at the end | %s / %s |\n", fmtBytes(r.PeakRSS.AfterIngest), fmtBytes(r.PeakRSS.End))
	u := r.Unreg
	if r.Fleet == nil {
		fmt.Fprintf(w, "| unregistration of %d publishers | %.1f ms (slowest call %.1f ms) |\n", u.Publishers, u.Seconds*1000, u.MaxCallMS)
		fmt.Fprintf(w, "| queries during unregistration (concurrency %d) | %d, p99 %s, worst %s |\n", u.Concurrency, u.Queries, fmtUS(u.P99US), fmtUS(u.WorstUS))
	}
	if rc := u.Reclaim; rc != nil {
		fmt.Fprintf(w, "| queries while the others' entries are reclaimed (%.1f s before the last unregistration) | %d, p99 %s, worst %s |\n", rc.Seconds, rc.Queries, fmtUS(rc.P99US), fmtUS(rc.WorstUS))
	}
	fmt.Fprintf(w, "| machine load average (1 min) at start / end | %s / %s |\n", fmtLoad(r.LoadAverage[0]), fmtLoad(r.LoadAverage[1]))
	fmt.Fprintf(w, "| answers checked | %d |\n", r.Checked)
	fmt.Fprintf(w, "| wrong answers or errors | %d |\n", r.Failures)
	for _, n := range r.FailureNotes {
		fmt.Fprintf(w, "\n- %s", n)
	}
	if len(r.FailureNotes) > 0 {
		fmt.Fprintln(w)
	}
}

// writeServers prints each level's split by server, with the CPU cores
// the servers and the load generator used.
func (r *report) writeServers(w io.Writer) {
	fmt.Fprintf(w, "%d servers, queries sent to them in turn\n\n", r.ServerReplicas)
	fmt.Fprintln(w, "| concurrency | server | queries | queries/s | server CPU/query | server CPU (cores) |")
	fmt.Fprintln(w, "| ---: | --- | ---: | ---: | ---: | ---: |")
	for _, l := range r.Levels {
		for _, p := range l.PerServer {
			fmt.Fprintf(w, "| %d | %s | %d | %.0f | %s | %s |\n", l.Concurrency, p.Target, p.Queries, p.QPS, fmtUS(p.ServerCPUPerQueryUS), fmtCores(p.ServerCPUCores))
		}
		fmt.Fprintf(w, "| %d | all (client: %s cores, %s/query) | %d | %.0f | %s | %s |\n", l.Concurrency, fmtCores(l.ClientCPUCores), fmtUS(l.ClientCPUPerQueryUS),
			l.Queries, l.QPS, fmtUS(l.ServerCPUPerQueryUS), fmtCores(l.ServerCPUCores))
	}
	fmt.Fprintln(w)
}

func fmtCores(v float64) string {
	if v < 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", v)
}

// writeRatios prints the cold pass and every level's server CPU per query
// against the bare chain of the same prompts measured in the same run.
func (r *report) writeRatios(w io.Writer) {
	fmt.Fprintln(w, "| server CPU per /query against the bare chain | server CPU/query | bare chain/prompt | ratio | less the 2-block floor | ratio |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | ---: |")
	chain := -1.0
	if r.Chain != nil {
		chain = r.Chain.MedianUS
	}
	rowLess := func(what string, cpu, less float64) {
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", what, fmtFrac(cpu), fmtFrac(chain),
			fmtRatio(r.Chain.ratio(cpu)), fmtFrac(less), fmtRatio(r.Chain.ratio(less)))
	}
	row := func(what string, cpu float64) { rowLess(what, cpu, r.Floor.lessFloor(cpu)) }
	// A paired pass subtracts its own floor (see pairedPass).
	passRow := func(what string, c *coldResult) {
		if c.PairedFloorUS < 0 {
			row(what, c.ServerCPUPerQueryUS)
			return
		}
		rowLess(what, c.ServerCPUPerQueryUS, c.lessFloor())
		fmt.Fprintf(w, "| its paired 2-block floor (%d queries, one after each of its own) | %s | | | | |\n", c.FloorQueries, fmtFrac(c.PairedFloorUS))
		if c.PairedBodyUS >= 0 {
			less := max(c.ServerCPUPerQueryUS-c.PairedBodyUS, 0)
			fmt.Fprintf(w, "| its queries for a model nobody stores (same size, no lookup: the request floor at this size), and the pass less them | %s | %s | | %s | %s |\n",
				fmtFrac(c.PairedBodyUS), fmtFrac(chain), fmtFrac(less), fmtRatio(r.Chain.ratio(less)))
		}
	}
	if f := r.Floor; f != nil {
		fmt.Fprintf(w, "| 2-block floor (%d queries, concurrency 1, p50 %s, p99 %s; %d wrong) | %s | | | | |\n",
			f.Queries, fmtUS(f.P50US), fmtUS(f.P99US), f.Failures, fmtFrac(f.ServerCPUPerQueryUS))
	}
	if c := r.Cold; c != nil {
		links := ""
		if c.LinkBlocksPerQuery >= 0 {
			links = fmt.Sprintf(", %.0f blocks per query from links (%s)", c.LinkBlocksPerQuery, fmtBytes(int64(c.LinkBytes)))
		}
		passRow(fmt.Sprintf("cold pass (%d prompts, each once, concurrency 1, p50 %s, p99 %s%s; %d wrong)", c.Queries, fmtUS(c.P50US), fmtUS(c.P99US), links, c.Failures), c)
	}
	if c := r.Warm; c != nil {
		passRow(fmt.Sprintf("warm pass (the same prompts again, concurrency 1, p50 %s, p99 %s; %d wrong)", fmtUS(c.P50US), fmtUS(c.P99US), c.Failures), c)
	}
	for _, l := range r.Levels {
		row(fmt.Sprintf("concurrency %d (%.0f queries/s, p50 %s, p99 %s, client %s/query)", l.Concurrency, l.QPS, fmtUS(l.P50US), fmtUS(l.P99US), fmtUS(l.ClientCPUPerQueryUS)), l.ServerCPUPerQueryUS)
	}
	if r.Chain != nil {
		fmt.Fprintf(w, "\nbare chain runs (µs per prompt, thread CPU): %v\n", r.Chain.RunsUS)
	}
	fmt.Fprintln(w)
}

func fmtRatio(v float64) string {
	if v < 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f×", v)
}

func fmtLoad(v float64) string {
	if v < 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", v)
}

func fmtFrac(v float64) string {
	if v < 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f µs", v)
}

func kindsString(k map[string]int) string {
	var parts []string
	for _, name := range []string{"full", "partial", "system", "cold"} {
		parts = append(parts, fmt.Sprintf("%s %d", name, k[name]))
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

func (r *report) writeJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}
