package zmqx

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mooncake-conductor-go/conductor/internal/eventtest"
)

// countTrims replaces the C heap trim with a counter for the test.
func countTrims(t *testing.T) *atomic.Int64 {
	var n atomic.Int64
	eventtest.WaitFor(t, "trimmer idle", 5*time.Second, func() bool { return !TrimRunning() })
	old := SwapTrim(func() { n.Add(1) })
	t.Cleanup(func() {
		eventtest.WaitFor(t, "trimmer idle", 5*time.Second, func() bool { return !TrimRunning() })
		SwapTrim(old)
	})
	return &n
}

// TestTrimAfterRequest: every request is followed by a trim, however many
// arrive at once (they are coalesced, never lost).
func TestTrimAfterRequest(t *testing.T) {
	n := countTrims(t)
	for round := int64(1); round <= 3; round++ {
		before := n.Load()
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() { defer wg.Done(); RequestTrim() }()
		}
		wg.Wait()
		// WaitTrims returns once the trimmer has run and exited.
		WaitTrims()
		if n.Load() <= before || TrimRunning() {
			t.Fatalf("round %d: WaitTrims returned with %d trims (had %d), trimmer running %v", round, n.Load(), before, TrimRunning())
		}
	}
}
