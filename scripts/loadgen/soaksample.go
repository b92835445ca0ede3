package main

// The soak's sampler: periodic readings of the server's RSS, goroutines,
// open descriptors and stale sources, and the levels compared at the end.

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"
)

// soakSample is one reading of the server's state.
type soakSample struct {
	At         time.Duration `json:"at_ns"` // since the soak clock started
	RSS        int64         `json:"rss_bytes"`
	Goroutines int64         `json:"goroutines"`
	FDs        int64         `json:"open_fds"`
	Stale      int64         `json:"stale_sources"`
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
