package streampos

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestRestore: a handle is waited on only between Begin and the first
// Settle, counts that first outcome alone, and remembers Expire.
func TestRestore(t *testing.T) {
	for _, tc := range []struct {
		name       string
		begin      bool
		settle     []Outcome
		catchingUp bool
		counted    []Outcome
	}{
		{name: "never begun (a stale restore, or a start that failed)"},
		{name: "catching up", begin: true, catchingUp: true},
		{name: "settled", begin: true, settle: []Outcome{Replay}, counted: []Outcome{Replay}},
		{name: "settled once", begin: true, settle: []Outcome{Cold, Lagging}, counted: []Outcome{Cold}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var counted []Outcome
			r := NewRestore(Resume{Seq: 7}, func(o Outcome) { counted = append(counted, o) })
			if tc.begin {
				r.Begin()
			}
			for _, o := range tc.settle {
				r.Settle(o)
			}
			if got := r.CatchingUp(); got != tc.catchingUp {
				t.Errorf("catching up %v, want %v", got, tc.catchingUp)
			}
			if diff := cmp.Diff(tc.counted, counted); diff != "" {
				t.Errorf("counted (-want +got):\n%s", diff)
			}
			if r.Expired() {
				t.Error("expired before Expire")
			}
			r.Expire()
			if !r.Expired() || r.Seq != 7 {
				t.Errorf("expired %v, seq %d", r.Expired(), r.Seq)
			}
		})
	}
}
