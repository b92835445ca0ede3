// Package fakeclock is a settable clock for tests of time-driven behaviour
// (freshness, expiry): the code under test takes its Now, the test moves
// it with Add, and nothing waits for wall-clock time.
package fakeclock

import (
	"sync"
	"time"
)

// Clock is a time that moves only when told to. Safe for concurrent use.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// New returns a clock reading t.
func New(t time.Time) *Clock { return &Clock{t: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Add moves the clock by d.
func (c *Clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}
