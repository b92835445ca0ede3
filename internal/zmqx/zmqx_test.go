package zmqx

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	zmq "github.com/pebbe/zmq4"
)

// TestRecvMessageKeepsAtMostKeep: a message of up to keep frames comes out
// whole; a longer one is consumed as a unit and stands as keep frames plus
// one nil, so that frame-count checks reject it and the next message is
// read from its start.
func TestRecvMessageKeepsAtMostKeep(t *testing.T) {
	const keep = 4
	push, err := NewSocket(zmq.PUSH, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer push.Close()
	pull, err := NewSocket(zmq.PULL, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer pull.Close()
	ep := fmt.Sprintf("inproc://zmqx-recv-%p", t)
	if err := pull.Bind(ep); err != nil {
		t.Fatal(err)
	}
	if err := push.Connect(ep); err != nil {
		t.Fatal(err)
	}
	frames := func(n int) [][]byte {
		var f [][]byte
		for i := range n {
			f = append(f, fmt.Appendf(nil, "f%d", i))
		}
		return f
	}
	for _, n := range []int{1, 3, keep, keep + 1, 9} {
		if _, err := push.SendMessage(frames(n)); err != nil {
			t.Fatal(err)
		}
		var got [][]byte
		for got == nil {
			got, err = RecvMessage(pull, nil, keep)
			if zmq.AsErrno(err) == zmq.Errno(syscall.EAGAIN) {
				got = nil
				time.Sleep(time.Millisecond) // not delivered yet
				continue
			}
			if err != nil {
				t.Fatalf("%d frames: %v", n, err)
			}
		}
		want := frames(min(n, keep))
		if n > keep {
			want = append(want, nil)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%d frames (-want +got):\n%s", n, diff)
		}
	}
	if _, err := RecvMessage(pull, nil, keep); zmq.AsErrno(err) != zmq.Errno(syscall.EAGAIN) {
		t.Fatalf("empty socket: %v, want EAGAIN", err)
	}
}
