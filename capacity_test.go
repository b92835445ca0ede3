package main

import (
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/contexts"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/hashing/hashcheck"
	src "github.com/mooncake-conductor-go/conductor/internal/sourcetype"
	"github.com/mooncake-conductor-go/conductor/internal/state/durable"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
	"github.com/mooncake-conductor-go/conductor/internal/zmqx"
	"github.com/mooncake-conductor-go/conductor/registry"
	"github.com/mooncake-conductor-go/conductor/subscriber"
)

// TestCapacityAtServiceLimit makes 10,000 registrations, each with a real
// subscriber whose publisher is absent: the first 4,096 (the default cap)
// succeed, the rest are refused without side effects, and unregistering
// them all releases every socket, descriptor and goroutine. The socket and
// descriptor budget (docs/operations.md "Limits") holds at the cap.
func TestCapacityAtServiceLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("capacity")
	}
	ignore := goleak.IgnoreCurrent()
	fdsBefore := openFDs(t)
	n := registry.DefaultMaxServices
	if err := zmqx.ReserveSockets(n * subscriber.SocketsPerSource); err != nil {
		t.Fatal(err)
	}
	ix := index.New(index.Options{})
	checks := hashcheck.NewSet(hashcheck.Options{})
	memOnly, err := durable.Open(durable.Options{Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	cat := contexts.New(ix)
	reg := registry.New(registry.Options{Contexts: cat, Start: sourceFactory{
		log: zerolog.New(io.Discard), contexts: cat, shared: subscriber.NewResources(subscriber.ResourcesOptions{}), checks: checks, state: memOnly,
	}.New})
	seed := "0"
	p, err := hashing.Resolve(hashing.Spec{Strategy: "vllm_v1", Algorithm: "sha256_cbor", IndexProjection: "low64_be", PythonHashSeed: &seed})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	svc := func(i int) registry.Service {
		return registry.Service{Endpoint: fmt.Sprintf("ipc://%s/%d", dir, i), Type: src.VLLM, ModelName: fmt.Sprint("m", i%8),
			TenantID: "default", InstanceID: fmt.Sprint("cap-", i), BlockSize: 16, Profile: p}
	}
	start := time.Now()
	for i := 0; i < n; i++ {
		if _, err := reg.Register(svc(i)); err != nil {
			reg.Close()
			t.Fatalf("registration %d of %d: %v", i, n, err)
		}
	}
	t.Logf("%d registrations in %v, %d descriptors", n, time.Since(start), openFDs(t)-fdsBefore)
	for i := n; i < 10_000; i++ {
		if _, err := reg.Register(svc(i)); err != registry.ErrTooManyServices {
			t.Fatalf("registration %d, over the cap: %v", i, err)
		}
	}
	if got := len(reg.Services()); got != n {
		t.Fatalf("%d services after refusals, want %d", got, n)
	}
	if got := len(checks.Snapshot()); got != n {
		t.Fatalf("%d hash checkers for %d services", got, n)
	}
	start = time.Now()
	for i := 0; i < n; i++ {
		s := svc(i)
		if err := reg.Unregister(s.Key()); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d unregistrations in %v", n, time.Since(start))
	if len(reg.Services()) != 0 || len(ix.Tables()) != 0 || len(checks.Snapshot()) != 0 {
		t.Fatal("state left after unregistering everything")
	}
	// 4,096 sources close their sockets and end their goroutines in the
	// background; on a busy 2-core machine that has taken over 10 s, so the
	// bound is generous: it only stops a leak from hanging the suite. A
	// leak per source would leave thousands of descriptors; libzmq and the
	// runtime keep a few of their own once this many sockets existed (10
	// more than before under -race, 4 without), which the margin allows.
	eventtest.Poll(t, "descriptors to be released", capacityReleaseBound, 50*time.Millisecond,
		func() bool { return openFDs(t) <= fdsBefore+capacityFDMargin })
	eventtest.Poll(t, "the sources' goroutines to end", capacityReleaseBound, 50*time.Millisecond,
		func() bool { return goleak.Find(ignore) == nil })
	goleak.VerifyNone(t, ignore)
}

// capacityReleaseBound is how long TestCapacityAtServiceLimit waits for
// 4,096 unregistered sources to release their descriptors and goroutines.
const capacityReleaseBound = 3 * time.Minute

// capacityFDMargin is how many descriptors more than before the test may
// remain open once every source is gone: far below one per source.
const capacityFDMargin = 32
