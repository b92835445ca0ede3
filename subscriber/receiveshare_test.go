package subscriber

import (
	"testing"

	"github.com/mooncake-conductor-go/conductor/internal/zmqx"
)

// TestReceiveShare: the receive part is split among the running sources,
// half for the queue and half for a recovery, with each floor; an
// unbounded part leaves the Tuning's values.
func TestReceiveShare(t *testing.T) {
	const MiB = 1 << 20
	for _, tc := range []struct {
		name    string
		total   int64
		sources int
		want    ReceiveLimits
	}{
		{"256 MiB limit, 4 sources", 24 * MiB, 4, ReceiveLimits{HWM: 2, MaxMessageBytes: 3 * MiB / 2, BufferedBytes: 3 * MiB}},
		{"256 MiB limit, 1 source", 24 * MiB, 1, ReceiveLimits{HWM: 8, MaxMessageBytes: 3 * MiB / 2, BufferedBytes: 12 * MiB}},
		{"none running yet", 24 * MiB, 0, ReceiveLimits{HWM: 8, MaxMessageBytes: 3 * MiB / 2, BufferedBytes: 12 * MiB}},
		{"many sources: the floors", 24 * MiB, 64, ReceiveLimits{HWM: minReceiveHWM, MaxMessageBytes: 3 * MiB / 2, BufferedBytes: 3 * MiB / 2}},
		{"small part: the smallest message limit", 4 * MiB, 2, ReceiveLimits{HWM: 2, MaxMessageBytes: minMessageBytes, BufferedBytes: MiB}},
		{"large part: the unbounded message limit", 1 << 30, 1, ReceiveLimits{HWM: 32, MaxMessageBytes: zmqx.MaxMessageBytes, BufferedBytes: 512 * MiB}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newReceiveShare(tc.total)
			for range tc.sources {
				r.join()
			}
			if got := r.limits(); got != tc.want {
				t.Errorf("limits %+v, want %+v", got, tc.want)
			}
			if !r.bounded() {
				t.Error("a sized part is not bounded")
			}
		})
	}
	if newReceiveShare(0).bounded() {
		t.Error("an unsized part bounds the sources")
	}
}
