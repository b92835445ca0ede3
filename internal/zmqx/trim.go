package zmqx

import (
	"sync/atomic"
	"time"

	"github.com/mooncake-conductor-go/conductor/internal/bgjob"
)

// TrimAfterBytes is the backlog a source must have drained before its
// emptying asks for a C heap trim; smaller backlogs leave too little free
// memory to be worth one.
const TrimAfterBytes = 4 << 20

// trimQuiet is how long no source may have had a backlog before a trim
// runs. During a burst, sources whose queue momentarily empties ask for
// trims while others still receive; trimming then only returns pages that
// libzmq faults back in at once, and on a busy machine lulls of a few
// milliseconds come many times a second. Waiting for a lull longer than a
// scheduler's time slice trims once, at the end of the burst.
const trimQuiet = 100 * time.Millisecond

// trimInterval spaces trims out: malloc_trim walks every arena.
const trimInterval = 50 * time.Millisecond

// Trimmer returns the C heap that drained receive backlogs occupied to the
// OS: glibc otherwise keeps the freed memory of libzmq's I/O thread arena,
// so RSS stays at a burst's peak. One Trimmer serves every receiver of the
// process (the C heap is the process's); the app creates it.
type Trimmer struct {
	trim        func()
	lastTrim    atomic.Int64 // unix nanoseconds
	lastBacklog atomic.Int64 // unix nanoseconds of the last receive that left messages queued
	// job runs trim once no source has had a backlog for trimQuiet and
	// the last trim is trimInterval old. Requests made meanwhile are
	// coalesced into that trim, and one made while a trim runs gets
	// another afterwards, so the last burst to end is always followed by
	// a trim. No goroutine lingers when idle.
	job *bgjob.Job
}

// NewTrimmer returns a Trimmer that calls trim (TrimCHeap when nil).
func NewTrimmer(trim func()) *Trimmer {
	if trim == nil {
		trim = TrimCHeap
	}
	t := &Trimmer{trim: trim}
	t.job = bgjob.New(func() {
		t.trim()
		t.lastTrim.Store(time.Now().UnixNano())
	}, func() time.Duration {
		return time.Duration(max(t.lastTrim.Load()+int64(trimInterval), t.lastBacklog.Load()+int64(trimQuiet)) - time.Now().UnixNano())
	})
	return t
}

// Wait returns once the trim goroutine running at the call, if any, has
// exited (within about trimInterval). Shutdown calls it after every
// subscriber has stopped, so that no goroutine of the trimmer outlives the
// service.
func (t *Trimmer) Wait() { t.job.Wait() }

// NoteBacklog records that a socket still had messages queued in libzmq;
// trims wait for trimQuiet after the last such note.
func (t *Trimmer) NoteBacklog() { t.lastBacklog.Store(time.Now().UnixNano()) }

// Request asks for a C heap trim once every backlog has drained; a
// receiver calls it when a backlog of at least TrimAfterBytes emptied.
func (t *Trimmer) Request() { t.job.Request() }

// Running reports whether the trim goroutine exists.
func (t *Trimmer) Running() bool { return t.job.Running() }
