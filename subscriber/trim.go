package subscriber

import (
	"sync/atomic"
	"time"
)

// trimAfterBytes is the backlog a source must have drained before its
// emptying triggers a C heap trim; smaller backlogs leave too little free
// memory to be worth a trim.
const trimAfterBytes = 4 << 20

// trimInterval spaces trims out: malloc_trim walks every arena (a few
// milliseconds after a large burst), and many sources draining at once
// need only one.
const trimInterval = 100 * time.Millisecond

var (
	trimHeap    = TrimCHeap // replaced by tests to count trims
	trimRunning atomic.Bool
	trimPending atomic.Bool
	lastTrim    atomic.Int64 // unix nanoseconds
)

// requestTrim makes a background goroutine call TrimCHeap soon: at once if
// the last trim was more than trimInterval ago, otherwise when that much
// time has passed. Requests made meanwhile are coalesced into the next trim,
// and one made while a trim runs gets another afterwards, so the last burst
// to end is always followed by a trim. No goroutine lingers when idle.
func requestTrim() {
	trimPending.Store(true)
	if !trimRunning.CompareAndSwap(false, true) {
		return
	}
	go func() {
		for {
			for trimPending.Load() {
				if wait := time.Until(time.Unix(0, lastTrim.Load()).Add(trimInterval)); wait > 0 {
					time.Sleep(wait)
				}
				trimPending.Store(false)
				trimHeap()
				lastTrim.Store(time.Now().UnixNano())
			}
			trimRunning.Store(false)
			// A request between the last check and the store above found
			// the flag still set and left the trim to us.
			if !trimPending.Load() || !trimRunning.CompareAndSwap(false, true) {
				return
			}
		}
	}()
}
