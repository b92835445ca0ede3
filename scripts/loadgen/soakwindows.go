package main

// Bookkeeping that decides which answers the soak may tolerate: when
// unregistrations were in flight, and when transient services were gone.

import (
	"slices"
	"sync"
	"time"
)

// windowLog records when unregistrations were in flight. A transport error
// on a query that overlapped one is reported but not counted as a failure:
// the soak tolerates connection trouble only while a service is being torn
// down. One entry per unregistration, so the log grows with the churn, not
// with the query load.
type windowLog struct {
	mu      sync.Mutex
	windows [][2]time.Time
}

func (w *windowLog) open() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.windows = append(w.windows, [2]time.Time{time.Now(), {}})
	return len(w.windows) - 1
}

func (w *windowLog) close(i int) {
	w.mu.Lock()
	w.windows[i][1] = time.Now()
	w.mu.Unlock()
}

// overlaps reports whether [t0, t1] overlaps an unregistration.
func (w *windowLog) overlaps(t0, t1 time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, win := range slices.Backward(w.windows) {
		end := win[1]
		if end.IsZero() {
			end = t1 // still open
		}
		if !win[0].After(t1) && !end.Before(t0) {
			return true
		}
	}
	return false
}

// stats returns how many unregistrations there were, the share of the
// span [from, to] at least one was in flight, and the slowest.
func (w *windowLog) stats(from, to time.Time) (n int, share float64, slowest time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var covered time.Duration
	var last time.Time // windows open in time order; merge overlaps
	for _, win := range w.windows {
		if win[1].IsZero() {
			continue
		}
		n++
		slowest = max(slowest, win[1].Sub(win[0]))
		s, e := latest(win[0], from, last), win[1]
		if e.After(to) {
			e = to
		}
		if e.After(s) {
			covered += e.Sub(s)
			last = e
		}
	}
	if to.After(from) {
		share = float64(covered) / float64(to.Sub(from))
	}
	return n, share, slowest
}

func latest(ts ...time.Time) time.Time {
	var l time.Time
	for _, t := range ts {
		if t.After(l) {
			l = t
		}
	}
	return l
}

// goneSet remembers when each transient service's unregistration completed,
// so an answer that still lists it afterwards is a wrong answer.
type goneSet struct {
	mu sync.Mutex
	at map[string]time.Time
}

func (g *goneSet) add(id string) {
	g.mu.Lock()
	if g.at == nil {
		g.at = map[string]time.Time{}
	}
	g.at[id] = time.Now()
	// Forget entries no query in flight can still concern (bounded map).
	if len(g.at) > 4096 {
		for k, t := range g.at {
			if time.Since(t) > 2*requestTimeout {
				delete(g.at, k)
			}
		}
	}
	g.mu.Unlock()
}

// before reports whether id was unregistered before t.
func (g *goneSet) before(id string, t time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	at, ok := g.at[id]
	return ok && at.Before(t)
}
