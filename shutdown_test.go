package main

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mooncake-conductor-go/conductor/internal/eventtest"
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
	within(t, "app.close with queries in flight", shutdownBound, e.app.close)
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
