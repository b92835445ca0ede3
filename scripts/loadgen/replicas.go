package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Replicas: the load generator can drive several servers at once, either
// spawned (--server-replicas N, each its own process, port and state
// directory) or already running (--targets). Every publisher is registered
// on every server: a ZMQ PUB socket fans each message out to every
// subscriber, so each replica ingests the whole corpus by itself, as
// replicas sharing registrations through etcd do. Timed queries go to the
// servers in turn; every answer is checked against the same model, and the
// verification pass asks each server the whole pool.

// maxServerReplicas bounds --server-replicas: every replica holds the whole
// index, and on one machine a few already share its cores.
const maxServerReplicas = 8

// parseTargets splits --targets: comma-separated base URLs, blanks around
// them ignored, none empty, none twice (the same server twice would count
// its CPU twice and hide a missing replica). "" means none.
func parseTargets(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []string
	for _, f := range strings.Split(s, ",") {
		u := strings.TrimRight(strings.TrimSpace(f), "/")
		if u == "" {
			return nil, fmt.Errorf("--targets %q: empty URL", s)
		}
		if slices.Contains(out, u) {
			return nil, fmt.Errorf("--targets %q: %s given twice", s, u)
		}
		out = append(out, u)
	}
	if len(out) > maxServerReplicas {
		return nil, fmt.Errorf("--targets: at most %d servers", maxServerReplicas)
	}
	return out, nil
}

// parsePIDs splits --server-pids, one positive process id per target, in
// the same order ("" means none known).
func parsePIDs(s string, targets int) ([]int, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("--server-pids %q: want positive process ids", s)
		}
		out = append(out, n)
	}
	if len(out) != targets {
		return nil, fmt.Errorf("--server-pids: %d ids for %d targets", len(out), targets)
	}
	return out, nil
}

// fleet samples every server's CPU time.
type fleet []sampler

// cpus reads each server's CPU time (-1 where unknown).
func (f fleet) cpus() []time.Duration {
	out := make([]time.Duration, len(f))
	for i, m := range f {
		out[i] = m.cpu()
	}
	return out
}

// total adds per-server CPU times, or -1 if any is unknown: a sum over
// some servers only would pass for all of them.
func total(cpus []time.Duration) time.Duration {
	var sum time.Duration
	for _, c := range cpus {
		if c < 0 {
			return -1
		}
		sum += c
	}
	return sum
}

// replicaLevel is one server's share of a concurrency level.
type replicaLevel struct {
	Target  string  `json:"target"`
	Queries int     `json:"queries"`
	QPS     float64 `json:"queries_per_s"`
	// ServerCPUPerQueryUS is this server's CPU over the level divided by
	// the queries it answered; ServerCPUCores is that CPU over the level's
	// wall time (1.0: one core busy throughout).
	ServerCPUPerQueryUS float64 `json:"server_cpu_per_query_us"`
	ServerCPUCores      float64 `json:"server_cpu_cores"`
}

// perTarget counts samples by the server that answered them.
func perTarget(samples []sample, n int) []int {
	out := make([]int, n)
	for _, s := range samples {
		out[s.target]++
	}
	return out
}

// cores is a CPU delta over wall time elapsed, or -1 when unknown.
func cores(c0, c1 time.Duration, elapsed time.Duration) float64 {
	if c0 < 0 || c1 < c0 || elapsed <= 0 {
		return -1
	}
	return float64(c1-c0) / float64(elapsed)
}

// memoStatsAll adds up the memo figures of every server (a figure unknown
// on one is unknown in the sum).
func memoStatsAll(apis []*api) (memoStats, error) {
	var sum memoStats
	for i, a := range apis {
		m, err := a.memoStats()
		if err != nil {
			return memoStats{}, err
		}
		if i == 0 {
			sum = m
			continue
		}
		for _, p := range []struct{ into, add *float64 }{
			{&sum.prefixHits, &m.prefixHits}, {&sum.prefixMisses, &m.prefixMisses},
			{&sum.tokenHits, &m.tokenHits}, {&sum.tokenMisses, &m.tokenMisses},
			{&sum.prefixBytes, &m.prefixBytes}, {&sum.tokenBytes, &m.tokenBytes},
			{&sum.answerHits, &m.answerHits}, {&sum.answerMisses, &m.answerMisses}, {&sum.answerBytes, &m.answerBytes},
			{&sum.linkHits, &m.linkHits}, {&sum.linkBytes, &m.linkBytes},
		} {
			if *p.into < 0 || *p.add < 0 {
				*p.into = -1
			} else {
				*p.into += *p.add
			}
		}
	}
	return sum, nil
}
