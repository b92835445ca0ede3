package main

import (
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
	"go.uber.org/goleak"
)

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	return len(ents)
}

// TestRegistrationStorm registers many services whose publishers do not
// exist, hammers the same keys with concurrent register/unregister calls,
// then unregisters everything: the API keeps answering, the final state is
// empty, and no goroutine, socket or descriptor is left behind.
func TestRegistrationStorm(t *testing.T) {
	if testing.Short() {
		t.Skip("storm")
	}
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, append([]goleak.Option{ignore}, fasthttpGlobals...)...) })
	e := startApp(t)
	fdsBefore := openFDs(t)
	// Scale is TestCapacityAtServiceLimit's job (4,096 sources); this
	// one's is the HTTP path under a storm, concurrent churn of the same
	// keys and a clean end. Each absent publisher costs libzmq's I/O thread
	// ten connection attempts a second, which makes registrations slower
	// the more there are, so more than a few hundred add time, not paths.
	const many = 256
	dir := t.TempDir()
	start := time.Now()
	for i := 0; i < many; i++ {
		if status, out := e.post("/register", vllmRegistration(fmt.Sprintf("bulk-%d", i), fmt.Sprintf("ipc://%s/%d.sock", dir, i))); status != 200 {
			t.Fatalf("register %d: %d %v", i, status, out)
		}
	}
	t.Logf("registered %d services in %v", many, time.Since(start))
	if got := e.get("/services")["count"]; fmt.Sprint(got) != fmt.Sprint(many) {
		t.Fatalf("count %v", got)
	}

	// Concurrent register/unregister of the same few keys.
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				id := fmt.Sprintf("churn-%d", i%3)
				ep := fmt.Sprintf("ipc://%s/churn-%d.sock", dir, i%3)
				if status, out := e.post("/register", vllmRegistration(id, ep)); status != 200 && status != 400 {
					t.Errorf("churn register: %d %v", status, out)
				}
				if status, out := e.post("/unregister", map[string]any{"instance_id": id, "dp_rank": 0}); status != 200 && status != 404 {
					t.Errorf("churn unregister: %d %v", status, out)
				}
			}
		}(w)
	}
	wg.Wait()

	start = time.Now()
	for i := 0; i < many; i++ {
		if status, out := e.post("/unregister", map[string]any{"instance_id": fmt.Sprintf("bulk-%d", i), "dp_rank": 0}); status != 200 {
			t.Fatalf("unregister %d: %d %v", i, status, out)
		}
	}
	t.Logf("unregistered %d services in %v", many, time.Since(start))
	if got := e.get("/services"); fmt.Sprint(got["count"]) != "0" {
		t.Fatalf("services left: %v", got)
	}
	if gv := e.get("/global_view"); fmt.Sprint(gv["context_count"]) != "0" {
		t.Fatalf("contexts left: %v", gv)
	}
	// libzmq closes descriptors asynchronously in its I/O thread.
	eventtest.Eventually(t, "descriptors to be released", func() bool { return openFDs(t) <= fdsBefore+8 })
}
