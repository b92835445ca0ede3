package index

import (
	"sync"
	"time"
)

// reaper clears removed owners' entries in the background, for an Index
// with Options.RemovalPause set. A removed owner is unpublished at once, so
// queries stop reporting it before any entry is touched; what is left is
// giving its memory back, which need not compete with queries: clearing at
// full speed takes a stripe write lock back to back and slows the queries
// running meanwhile on a small machine. The reaper
// clears for about reapBurst (in chunks of clearBudget, unlocking between
// them), then sleeps for the pause, so it takes a small share of a core
// (BENCHMARKS.md, queries while a large engine is reclaimed).
//
// One worker goroutine runs while there is work and exits when the queue
// is empty; Index.Close stops it. Jobs of a dropped table end at once
// (its stripes are dead).
type reaper struct {
	pause time.Duration

	mu      sync.Mutex
	jobs    []reapJob
	running bool
	idle    chan struct{} // closed when the running worker exits
	closed  bool
}

// reapBurst is how long the reaper clears before it pauses.
const reapBurst = 100 * time.Microsecond

type reapJob struct {
	t  *Table
	id OwnerID
}

// enqueue schedules id's entries of t for clearing and reports false when
// the reaper is closed, in which case the caller clears synchronously.
func (r *reaper) enqueue(t *Table, id OwnerID) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.jobs = append(r.jobs, reapJob{t, id})
	if !r.running {
		r.running = true
		r.idle = make(chan struct{})
		go r.work(r.idle)
	}
	return true
}

// work runs jobs until none is left or the reaper is closed.
func (r *reaper) work(idle chan struct{}) {
	defer close(idle)
	for {
		r.mu.Lock()
		if r.closed || len(r.jobs) == 0 {
			r.running = false
			r.jobs = nil
			r.mu.Unlock()
			return
		}
		j := r.jobs[0]
		r.jobs[0] = reapJob{}
		r.jobs = r.jobs[1:]
		r.mu.Unlock()
		j.t.clearOwner(j.id, engineBit, r.pacer())
		if r.stopping() {
			continue // abandoned: the slot stays unusable, the index is closing
		}
		j.t.releaseSlot(j.id)
	}
}

// pacer returns clearOwner's between-holds hook for one job: after about
// reapBurst of work it sleeps for the pause, and it ends the job once the
// reaper is closed.
func (r *reaper) pacer() func() bool {
	burst := time.Now()
	return func() bool {
		if time.Since(burst) < reapBurst {
			return true
		}
		if r.stopping() {
			return false
		}
		time.Sleep(r.pause)
		burst = time.Now()
		return true
	}
}

// stopping reports whether Close was called, so a long job can end early.
func (r *reaper) stopping() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}

// wait blocks until no worker runs, or (close) stops the worker first.
func (r *reaper) wait(close bool) {
	for {
		r.mu.Lock()
		if close {
			r.closed = true
		}
		idle, running := r.idle, r.running
		r.mu.Unlock()
		if !running {
			return
		}
		<-idle
	}
}

// Close stops background clearing: the running chunk finishes, queued
// owners are left as they are (the process is shutting down), and later
// removals clear synchronously. It returns once no reaper goroutine runs.
// It also stops the evictor of a bounded index: writers no longer wait
// for it, and the budget is no longer enforced.
func (ix *Index) Close() {
	ix.reap.wait(true)
	ix.bud.close()
}

// Settle waits until every removed owner's entries are cleared, so tests
// and tools can observe the index at rest.
func (ix *Index) Settle() { ix.reap.wait(false) }
