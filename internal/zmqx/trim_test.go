package zmqx

import (
	"sync"
	"sync/atomic"
	"testing"
)

// TestTrimAfterRequest: every request is followed by a trim, however many
// arrive at once (they are coalesced, never lost).
func TestTrimAfterRequest(t *testing.T) {
	var n atomic.Int64
	tr := NewTrimmer(func() { n.Add(1) })
	for round := int64(1); round <= 3; round++ {
		before := n.Load()
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() { defer wg.Done(); tr.Request() }()
		}
		wg.Wait()
		// Wait returns once the trimmer has run and exited.
		tr.Wait()
		if n.Load() <= before || tr.Running() {
			t.Fatalf("round %d: Wait returned with %d trims (had %d), trimmer running %v", round, n.Load(), before, tr.Running())
		}
	}
}
