package events

import "testing"

// TestReasonNames: every reason has a name, the label operators see on the
// counters. (Names repeat across kinds on purpose: an envelope's and an
// event's bad timestamp are both "timestamp", under different metrics.)
func TestReasonNames(t *testing.T) {
	for r := Reason(0); r < NumReasons; r++ {
		if r.String() == "" {
			t.Errorf("reason %d has no name", r)
		}
	}
}
