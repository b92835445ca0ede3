package events

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/mooncake-conductor-go/conductor/internal/eventtest"
)

// TestArrayFixtureReasons checks the reason of every rejected or ignored
// event of the array-encoded fixtures (ids with "_array_"): each
// expectation names it first, after "rejected: " or "ignored: ", so a
// position read as the wrong field, or a wrong type judged by another rule,
// fails here even where the outcome alone (TestFixturesDirect) would pass.
func TestArrayFixtureReasons(t *testing.T) {
	m := eventtest.LoadManifest(t)
	n := 0
	for i := range m.Fixtures {
		f := &m.Fixtures[i]
		if !strings.Contains(f.ID, "_array_") || f.PayloadFile == "" {
			continue
		}
		n++
		t.Run(f.ID, func(t *testing.T) {
			var want []string
			for _, ev := range f.Expect.Events {
				res, detail, _ := strings.Cut(ev, ": ")
				reason, _, _ := strings.Cut(detail, " ")
				if res == "applied" {
					reason = "none"
				}
				want = append(want, res+":"+reason)
			}
			x := newTester(t, m, f.Registration, f.AlsoRegistered...)
			x.applyBatch(1, eventtest.Payload(t, f))
			var got []string
			for _, o := range x.outcomes[1] {
				got = append(got, o.Result.String()+":"+o.Reason.String())
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("outcomes (-want +got):\n%s", diff)
			}
		})
	}
	if n < 16 {
		t.Errorf("only %d array fixtures found", n)
	}
}
