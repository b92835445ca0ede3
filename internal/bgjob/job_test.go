package bgjob

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestEveryRequestIsFollowedByARun: however many requests arrive at once,
// each round ends with a run that started after its last request, runs
// never overlap, and Wait leaves no goroutine behind.
func TestEveryRequestIsFollowedByARun(t *testing.T) {
	defer goleak.VerifyNone(t)
	var runs, inRun, overlaps atomic.Int64
	var lastRunStart atomic.Int64
	j := New(func() {
		if inRun.Add(1) > 1 {
			overlaps.Add(1)
		}
		lastRunStart.Store(time.Now().UnixNano())
		time.Sleep(time.Millisecond)
		runs.Add(1)
		inRun.Add(-1)
	}, nil)
	for round := range 5 {
		before := runs.Load()
		var wg sync.WaitGroup
		var lastRequest atomic.Int64
		for range 16 {
			wg.Go(func() {
				j.Request()
				lastRequest.Store(time.Now().UnixNano())
			})
		}
		wg.Wait()
		j.Wait()
		if runs.Load() == before || lastRunStart.Load() < lastRequest.Load()-int64(time.Millisecond) || j.Running() {
			t.Fatalf("round %d: %d runs (had %d), running %v", round, runs.Load(), before, j.Running())
		}
	}
	if overlaps.Load() != 0 {
		t.Errorf("%d overlapping runs", overlaps.Load())
	}
}

// TestRequestDuringRunRunsAgain: a request made while a run is under way
// is not lost; it gets a run of its own after that one.
func TestRequestDuringRunRunsAgain(t *testing.T) {
	defer goleak.VerifyNone(t)
	started, release := make(chan struct{}), make(chan struct{})
	var runs atomic.Int64
	j := New(func() {
		if runs.Add(1) == 1 {
			close(started)
			<-release
		}
	}, nil)
	j.Request()
	<-started
	j.Request() // while the first run is blocked
	close(release)
	j.Wait()
	if runs.Load() != 2 {
		t.Errorf("%d runs, want 2", runs.Load())
	}
}

// TestDelayCoalescesRequests: requests made while the job waits out its
// delay are served by the one run that follows.
func TestDelayCoalescesRequests(t *testing.T) {
	defer goleak.VerifyNone(t)
	var runs atomic.Int64
	var hold atomic.Bool
	hold.Store(true)
	j := New(func() { runs.Add(1) }, func() time.Duration {
		if hold.Load() {
			return time.Millisecond
		}
		return 0
	})
	for range 10 {
		j.Request()
		time.Sleep(100 * time.Microsecond)
	}
	if runs.Load() != 0 {
		t.Fatalf("%d runs during the delay", runs.Load())
	}
	hold.Store(false)
	j.Wait()
	if runs.Load() != 1 {
		t.Errorf("%d runs, want 1", runs.Load())
	}
}
