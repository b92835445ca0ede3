package subscriber

import (
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// TestSessionDeadline: a lost session waits sessionLostGrace for libzmq's
// own retry; resets with nothing received in between back off, doubling
// from the last reset up to maxSessionBackoff; no loss or no SUB socket
// means no deadline.
func TestSessionDeadline(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 15, 0, 0, 0, time.UTC)
	lost := t0.Add(100 * time.Millisecond)
	for _, tc := range []struct {
		name   string
		lostAt time.Time
		inARow int
		noSub  bool
		want   time.Time
	}{
		{"nothing lost", time.Time{}, 0, false, time.Time{}},
		{"socket closed", lost, 0, true, time.Time{}},
		{"first loss: the grace", lost, 0, false, lost.Add(sessionLostGrace)},
		{"after one reset: 2 s from it", lost, 1, false, t0.Add(2 * time.Second)},
		{"after three: 8 s", lost, 3, false, t0.Add(8 * time.Second)},
		{"capped", lost, 20, false, t0.Add(maxSessionBackoff)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Subscriber{conn: session{sub: &zmq.Socket{}}}
			if tc.noSub {
				s.conn.sub = nil
			}
			s.conn.watch = sessionWatch{lostAt: tc.lostAt, inARow: tc.inARow, lastReset: t0}
			if got := s.conn.sessionDeadline(); !got.Equal(tc.want) {
				t.Errorf("deadline %v, want %v", got, tc.want)
			}
		})
	}
}
