package eventtest

import (
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/vmihailenco/msgpack/v5"
)

// WaitFor polls cond until it holds, failing the test after timeout. Tests
// wait for a condition rather than sleeping a fixed time; the timeout is a
// generous bound for a busy machine, not a performance assertion.
func WaitFor(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	Poll(t, what, timeout, time.Millisecond, cond)
}

// Eventually is Poll for the conditions end-to-end tests wait on (a
// server answering, a publisher's message showing, an etcd change seen):
// checked every 10 ms for up to 30 s, a bound for a busy machine.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	Poll(t, what, 30*time.Second, 10*time.Millisecond, cond)
}

// Poll is WaitFor checking cond every interval: a condition that itself
// sends (an event published until it shows) or asks a server is polled
// less often than one that reads memory.
func Poll(t testing.TB, what string, timeout, interval time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(interval)
	}
}

// Logger is a debug logger into the test log under -v, silent otherwise.
func Logger(t testing.TB) zerolog.Logger {
	if testing.Verbose() {
		return zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.DebugLevel)
	}
	return zerolog.Nop()
}

// Encode marshals v as MessagePack or fails the test.
func Encode(t testing.TB, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
