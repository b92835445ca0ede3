package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mooncake-conductor-go/conductor/internal/state/snapshot"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
)

// TestShutdownUnderLoad closes the app while queries are in flight: every
// request either completes with 200 or is refused after close, and nothing
// of ours keeps running.
func TestShutdownUnderLoad(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, append([]goleak.Option{ignore}, fasthttpGlobals...)...) })
	e := startApp(t)
	pub := newPublisher(t)
	if status, out := e.post("/register", vllmRegistration("s0", pub.endpoint)); status != 200 {
		t.Fatalf("register: %d %v", status, out)
	}
	tokens := make([]int32, 4096)
	for i := range tokens {
		tokens[i] = int32(i)
	}
	var ok, failed atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 10000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				status, err := e.rawQuery(tokens)
				switch {
				case err == nil && status == 200:
					ok.Add(1)
				case err != nil:
					failed.Add(1) // refused or closed after shutdown
				default:
					t.Errorf("status %d during shutdown", status)
					return
				}
			}
		}()
	}
	eventtest.WaitFor(t, "20 answered queries", 30*time.Second, func() bool { return ok.Load() >= 20 })
	// Every wait below is bounded, so a shutdown that hangs fails here
	// instead of running into the suite's timeout.
	within(t, "app.close with queries in flight", shutdownBound, func() { _ = e.app.close() })
	close(stop)
	within(t, "the query workers to return", 30*time.Second, wg.Wait)
	if ok.Load() == 0 {
		t.Fatal("no query succeeded")
	}
}

// shutdownBound is how long a test lets a shutdown take: generous for a
// loaded machine, and far below the suite's timeout.
const shutdownBound = 30 * time.Second

// within runs f and fails the test if it has not returned after d (f's
// goroutine is then left behind: the test has failed anyway).
func within(t *testing.T, what string, d time.Duration, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s did not return within %v", what, d)
	}
}

// TestSignalShutdown runs the real binary and sends SIGTERM: it must exit 0
// within 5 seconds, through the graceful path (the watchdog that ends a
// hung shutdown logs, and that log line fails the test).
func TestSignalShutdown(t *testing.T) {
	bin := conductorBinary(t)
	cmd := exec.Command(bin, "--addr", "127.0.0.1", "--port", "0", "--state-dir", filepath.Join(t.TempDir(), "state"))
	cmd.Env = append(os.Environ(), "CONDUCTOR_CONFIG_PATH="+filepath.Join(t.TempDir(), "none.json"), "CONDUCTOR_LOG_LEVEL=INFO")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	sc := bufio.NewScanner(stderr)
	listening := false
	for !listening && sc.Scan() {
		var line map[string]any
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("log line is not JSON: %q", sc.Text())
		}
		listening = line["message"] == "conductor listening"
	}
	if !listening {
		t.Fatal("never logged that it listens")
	}
	// The lines after SIGTERM: a hung shutdown shows in them.
	var after []string
	tail := make(chan struct{})
	go func() {
		defer close(tail)
		for sc.Scan() {
			after = append(after, sc.Text())
		}
	}()
	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	// Wait closes the pipe, so it waits for the reader to reach the end
	// the process's exit gives it.
	go func() { <-tail; done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v", err)
		}
	case <-time.After(6 * time.Second):
		t.Fatal("did not exit within 5 s of SIGTERM")
	}
	for _, l := range after {
		var line map[string]any
		if err := json.Unmarshal([]byte(l), &line); err != nil {
			t.Fatalf("log line is not JSON: %q", l)
		}
		if lv := line["level"]; lv == "warn" || lv == "error" {
			t.Errorf("shutdown logged at %v: %v", lv, line["message"])
		}
	}
	t.Logf("exited %v after SIGTERM", time.Since(start).Round(time.Millisecond))
}

// TestStopStackRunsNewestFirst: the one stop order undoes newest first,
// runs every step even after one fails, names the failed steps in its
// error, and leaves nothing to run twice.
func TestStopStackRunsNewestFirst(t *testing.T) {
	var order []string
	var s stopStack
	for _, name := range []string{"first", "second", "third"} {
		s.push(name, func(context.Context) error {
			order = append(order, name)
			if name == "second" {
				return errors.New("disk full")
			}
			return nil
		})
	}
	err := s.run(context.Background())
	if want := []string{"third", "second", "first"}; !slices.Equal(order, want) {
		t.Errorf("stopped %v, want %v", order, want)
	}
	if err == nil || err.Error() != "second: disk full" {
		t.Errorf("error %v, want %q", err, "second: disk full")
	}
	if err := s.run(context.Background()); err != nil || len(order) != 3 {
		t.Errorf("a second run stopped again: %v, %v", order, err)
	}
}

// stallRequest opens a connection to addr and sends the start of a request
// whose body never comes: the HTTP server counts it in flight until its
// read timeout (30 s), far longer than a shutdown may take.
func stallRequest(t *testing.T, addr string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := io.WriteString(conn, "POST /query HTTP/1.1\r\nHost: x\r\nContent-Type: application/msgpack\r\nContent-Length: 100\r\n\r\n\x83"); err != nil {
		t.Fatal(err)
	}
	return conn
}

// TestCloseBoundedWithStalledRequest: close returns while a request is
// still in flight (its connection is still open when close is back), so a
// client that never finishes its request cannot hold a shutdown.
func TestCloseBoundedWithStalledRequest(t *testing.T) {
	e := startApp(t)
	conn := stallRequest(t, e.app.ln.Addr().String())
	// The server has the connection once it counts it among its open ones:
	// wait until a second, idle connection's request is answered, which
	// the server handles after accepting the first.
	e.get("/services")
	within(t, "app.close with a stalled request", shutdownBound, func() {
		if err := e.app.close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	// Had close waited for the request, the server would have closed the
	// connection on its read timeout first.
	_ = conn.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	_, err := conn.Read(make([]byte, 1))
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("the stalled connection after close: %v, want it still open", err)
	}
}

// TestFinalSnapshotFailureExitsNonZero: when the last snapshot cannot be
// written the process says so and exits with status 1, so an orchestrator
// sees that state was lost.
func TestFinalSnapshotFailureExitsNonZero(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	p := startConductor(t, dir, "--snapshot-interval", "0")
	// A directory where the snapshot file goes: the rename that would
	// replace it fails, even for root.
	if err := os.MkdirAll(filepath.Join(dir, snapshot.FileName, "occupied"), 0o700); err != nil {
		t.Fatal(err)
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(shutdownBound):
		t.Fatal("no exit after SIGTERM")
	}
	var ee *exec.ExitError
	if !errors.As(p.err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("exit %v, want status 1", p.err)
	}
	if log := p.logText(); !strings.Contains(log, "last index snapshot") {
		t.Errorf("the exit does not name the snapshot:\n%s", log)
	}
}

// TestSecondSignalEndsShutdownAtOnce: a second SIGTERM during a shutdown
// held up by a stalled request ends the process without waiting for the
// drain, with status 1.
func TestSecondSignalEndsShutdownAtOnce(t *testing.T) {
	p := startConductor(t, filepath.Join(t.TempDir(), "state"))
	stallRequest(t, strings.TrimPrefix(p.base, "http://"))
	// The stalled connection is the server's once a later request on
	// another connection has been answered.
	if status, _ := p.do("GET", "/services", nil); status != 200 {
		t.Fatalf("GET /services: %d", status)
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	eventtest.WaitFor(t, "the shutdown to start", shutdownBound, func() bool { return strings.Contains(p.logText(), `"shutting down"`) })
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(shutdownBound):
		t.Fatal("no exit after the second SIGTERM")
	}
	var ee *exec.ExitError
	if !errors.As(p.err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("exit %v, want status 1", p.err)
	}
	log := p.logText()
	if !strings.Contains(log, "second signal during shutdown") {
		t.Errorf("no second-signal line:\n%s", log)
	}
	// It did not wait for the drain: the drain's end would have logged.
	if strings.Contains(log, "still in flight") || strings.Contains(log, `"shut down"`) {
		t.Errorf("the shutdown ran on after the second signal:\n%s", log)
	}
}
