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
// libzmq faults back in at once, and on a busy machine (every source's
// queue empties whenever the subscriber gets the CPU) lulls of a few
// milliseconds come many times a second. Waiting for a lull longer than
// a scheduler's time slice trims once, at the end of the burst.
const trimQuiet = 100 * time.Millisecond

// trimInterval spaces trims out: malloc_trim walks every arena (0.2-4 ms
// after a 2 M-block burst).
const trimInterval = 50 * time.Millisecond

var (
	trimHeap    = TrimCHeap  // replaced by tests to count trims
	lastTrim    atomic.Int64 // unix nanoseconds
	lastBacklog atomic.Int64 // unix nanoseconds of the last receive that left messages queued

	// trimJob calls TrimCHeap once no source has had a backlog for
	// trimQuiet and the last trim is trimInterval old. Requests made
	// meanwhile are coalesced into that trim, and one made while a trim
	// runs gets another afterwards, so the last burst to end is always
	// followed by a trim. No goroutine lingers when idle.
	trimJob = bgjob.New(func() {
		trimHeap()
		lastTrim.Store(time.Now().UnixNano())
	}, func() time.Duration {
		return time.Duration(max(lastTrim.Load()+int64(trimInterval), lastBacklog.Load()+int64(trimQuiet)) - time.Now().UnixNano())
	})
)

// WaitTrims returns once the trim goroutine running at the call, if any, has
// exited (within about trimInterval). Shutdown calls it after every
// subscriber has stopped, so that no goroutine of this package outlives the
// service.
func WaitTrims() { trimJob.Wait() }

// NoteBacklog records that a socket still had messages queued in libzmq;
// trims wait for trimQuiet after the last such note.
func NoteBacklog() { lastBacklog.Store(time.Now().UnixNano()) }

// RequestTrim asks for a C heap trim once every backlog has drained; a
// receiver calls it when a backlog of at least TrimAfterBytes emptied.
func RequestTrim() { trimJob.Request() }

// TrimRunning reports whether the trim goroutine exists (tests wait for it
// to be idle before they swap the trim out).
func TrimRunning() bool { return trimJob.Running() }

// SwapTrim replaces the trim itself and returns the previous one. Tests
// count trims with it; call it only while TrimRunning is false.
func SwapTrim(f func()) (old func()) {
	old, trimHeap = trimHeap, f
	return old
}
