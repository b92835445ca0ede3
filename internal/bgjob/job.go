// Package bgjob runs a function in the background on request, one run at
// a time: requests made while it runs are coalesced into one more run, so
// the last request is always followed by a run, and no goroutine stays
// once the job is idle. The service uses it for work that is worth doing
// after an event but not in the event's path, such as handing freed memory
// back to the operating system.
package bgjob

import (
	"sync"
	"sync/atomic"
	"time"
)

// Job is one such background function; the zero Job is not usable, see
// New. Safe for concurrent use.
type Job struct {
	run   func()
	delay func() time.Duration

	running atomic.Bool // a goroutine owns the job
	pending atomic.Bool // a request is not yet served by a run

	mu     sync.Mutex
	exited chan struct{} // closed when the latest goroutine has exited
}

// New returns a job that calls run. delay, when not nil, is asked before
// each run how long to wait first (zero or less: run now); requests made
// during that wait are served by the same run, which is how a burst of
// requests can be made to wait for a lull.
func New(run func(), delay func() time.Duration) *Job {
	return &Job{run: run, delay: delay}
}

// Request asks for a run. It never blocks: a goroutine is started if none
// owns the job, otherwise the owning one runs again before it exits.
func (j *Job) Request() {
	j.pending.Store(true)
	if !j.running.CompareAndSwap(false, true) {
		return
	}
	done := make(chan struct{})
	j.mu.Lock()
	j.exited = done
	j.mu.Unlock()
	go j.loop(done)
}

func (j *Job) loop(done chan struct{}) {
	defer close(done)
	for {
		for j.pending.Load() {
			if j.delay != nil {
				if d := j.delay(); d > 0 {
					time.Sleep(d)
					continue
				}
			}
			j.pending.Store(false)
			j.run()
		}
		j.running.Store(false)
		// A request between the last check and the store above found the
		// job owned and left the run to this goroutine.
		if !j.pending.Load() || !j.running.CompareAndSwap(false, true) {
			return
		}
	}
}

// Running reports whether a goroutine currently owns the job.
func (j *Job) Running() bool { return j.running.Load() }

// Wait returns once the goroutine owning the job at the call, if any, has
// exited; with no new requests the job is then idle. Shutdown calls it so
// that no goroutine outlives the service.
func (j *Job) Wait() {
	j.mu.Lock()
	done := j.exited
	j.mu.Unlock()
	if done != nil {
		<-done
	}
}
