package etcdreg

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/contexts"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/etcdtest"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
	"github.com/mooncake-conductor-go/conductor/registry"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// Process-wide workers of the libraries, started once.
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
		goleak.IgnoreAnyFunction("github.com/golang/glog.(*fileSink).flushDaemon"),
	)
}

// starts counts source starts and stops per service, so tests can tell a
// subscription that kept running from one that was restarted.
type starts struct {
	mu      sync.Mutex
	started map[registry.ServiceKey]int
	stopped map[registry.ServiceKey]int
	failing map[registry.ServiceKey]int // starts still to fail, per service
}

type src struct {
	s   *starts
	key registry.ServiceKey
}

func (s src) Stop() {
	s.s.mu.Lock()
	s.s.stopped[s.key]++
	s.s.mu.Unlock()
}
func (src) Stale() bool   { return false }
func (src) State() string { return "live" }

func (s *starts) start(svc registry.Service, _ index.OwnerID) (registry.Source, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failing[svc.Key()] > 0 {
		s.failing[svc.Key()]--
		return nil, fmt.Errorf("source of %s cannot start", svc.Key())
	}
	s.started[svc.Key()]++
	return src{s, svc.Key()}, nil
}

func (s *starts) counts() (map[registry.ServiceKey]int, map[registry.ServiceKey]int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return clone(s.started), clone(s.stopped)
}

func clone(m map[registry.ServiceKey]int) map[registry.ServiceKey]int {
	out := make(map[registry.ServiceKey]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// replica is one registry with its shared store.
type replica struct {
	reg    *registry.Registry
	ix     *index.Index
	store  *Store
	cli    *clientv3.Client
	starts *starts
}

func client(t *testing.T, endpoint string) *clientv3.Client {
	t.Helper()
	cli, err := NewClient(ClientConfig{Endpoints: []string{endpoint}})
	if err != nil {
		t.Fatal(err)
	}
	return cli
}

func newReplica(t *testing.T, endpoint string, static ...registry.Service) *replica {
	t.Helper()
	st := &starts{started: map[registry.ServiceKey]int{}, stopped: map[registry.ServiceKey]int{}}
	ix := index.New(index.Options{})
	cat := contexts.New(ix)
	reg := registry.New(registry.Options{Contexts: cat, Start: st.start})
	for _, s := range static {
		if _, err := reg.Apply(s); err != nil {
			t.Fatal(err)
		}
	}
	cli := client(t, endpoint)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	store, err := Open(ctx, Options{Client: cli, Registry: reg, Static: static, Timeout: 2 * time.Second, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	reg.SetStore(store)
	r := &replica{reg: reg, ix: ix, store: store, cli: cli, starts: st}
	t.Cleanup(r.close)
	return r
}

func (r *replica) close() {
	if r.store == nil {
		return
	}
	r.store.Close()
	r.reg.Close()
	r.ix.Close()
	r.cli.Close()
	r.store = nil
}

func (r *replica) keys() []string {
	var out []string
	for _, s := range r.reg.Services() {
		out = append(out, string(s.Key()))
	}
	return out
}

func profile(t *testing.T, seed string) hashing.Profile {
	t.Helper()
	p, err := hashing.Resolve(hashing.Spec{Strategy: "vllm_v1", Algorithm: "sha256_cbor", IndexProjection: "low64_be", PythonHashSeed: &seed})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func svc(t *testing.T, instance string, port int) registry.Service {
	return registry.Service{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", port), Type: sourcetype.VLLM, ModelName: "m", TenantID: "default",
		InstanceID: instance, BlockSize: 16, Profile: profile(t, "0")}
}

// waitFor polls cond until it holds, failing after a generous deadline.

func sameKeys(rs []*replica, want []string) func() bool {
	return func() bool {
		for _, r := range rs {
			if !cmp.Equal(r.keys(), want) {
				return false
			}
		}
		return true
	}
}

func TestRegisterReachesEveryReplica(t *testing.T) {
	etcd := etcdtest.Start(t)
	rs := []*replica{newReplica(t, etcd.Endpoint()), newReplica(t, etcd.Endpoint()), newReplica(t, etcd.Endpoint())}
	a, b := svc(t, "a", 5000), svc(t, "b", 5001)
	for _, s := range []registry.Service{a, b} {
		changed, err := rs[0].reg.Register(s)
		if err != nil || !changed {
			t.Fatalf("register %s: changed %v, %v", s.Key(), changed, err)
		}
	}
	// The deciding replica has applied it when Register returns.
	if got := rs[0].keys(); !cmp.Equal(got, []string{"a|default|0", "b|default|0"}) {
		t.Fatalf("replica 1 right after Register: %v", got)
	}
	eventtest.Eventually(t, "both on every replica", sameKeys(rs, []string{"a|default|0", "b|default|0"}))

	// The same rules as one node, decided on the shared set from any replica.
	if changed, err := rs[1].reg.Register(a); err != nil || changed {
		t.Fatalf("identical registration: changed %v, %v", changed, err)
	}
	other := a
	other.BlockSize = 32
	var ce *registry.ConflictError
	if _, err := rs[2].reg.Register(other); !errors.As(err, &ce) {
		t.Fatalf("other configuration for the key: %v", err)
	}
	if _, err := rs[2].reg.Register(svc(t, "c", 5000)); !errors.As(err, &ce) {
		t.Fatalf("endpoint of another service: %v", err)
	}

	if err := rs[2].reg.Unregister(a.Key()); err != nil {
		t.Fatal(err)
	}
	if err := rs[1].reg.Unregister(a.Key()); !errors.Is(err, registry.ErrNotFound) {
		t.Fatalf("unregister unknown: %v", err)
	}
	eventtest.Eventually(t, "a gone everywhere", sameKeys(rs, []string{"b|default|0"}))
	for i, r := range rs {
		started, stopped := r.starts.counts()
		if started[a.Key()] != 1 || stopped[a.Key()] != 1 || started[b.Key()] != 1 || stopped[b.Key()] != 0 {
			t.Fatalf("replica %d: started %v, stopped %v", i+1, started, stopped)
		}
	}

	// A replica that starts later reads the shared set.
	late := newReplica(t, etcd.Endpoint())
	if got := late.keys(); !cmp.Equal(got, []string{"b|default|0"}) {
		t.Fatalf("late replica: %v", got)
	}
}

// TestConcurrentConflicts: registrations that exclude each other, sent at
// once to two replicas, have exactly one winner, the same on both.
func TestConcurrentConflicts(t *testing.T) {
	etcd := etcdtest.Start(t)
	rs := []*replica{newReplica(t, etcd.Endpoint()), newReplica(t, etcd.Endpoint())}
	for round := 0; round < 20; round++ {
		// Two services on one endpoint: at most one may hold it.
		port := 6000 + round
		s := []registry.Service{svc(t, fmt.Sprintf("x%d", round), port), svc(t, fmt.Sprintf("y%d", round), port)}
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i := range 2 {
			wg.Go(func() { _, errs[i] = rs[i].reg.Register(s[i]) })
		}
		wg.Wait()
		winners := 0
		for _, err := range errs {
			var ce *registry.ConflictError
			switch {
			case err == nil:
				winners++
			case !errors.As(err, &ce):
				t.Fatalf("round %d: %v", round, err)
			}
		}
		if winners != 1 {
			t.Fatalf("round %d: %d winners (%v)", round, winners, errs)
		}
	}
	eventtest.Eventually(t, "both replicas agree", func() bool {
		a, b := rs[0].keys(), rs[1].keys()
		return len(a) == 20 && cmp.Equal(a, b)
	})
}

// TestEtcdAway: while etcd is down, changes answer ErrNotRecorded after a
// bounded wait and running subscriptions keep running; once it is back,
// changes work again and nothing that did not change was restarted.
func TestEtcdAway(t *testing.T) {
	etcd := etcdtest.Start(t)
	rs := []*replica{newReplica(t, etcd.Endpoint()), newReplica(t, etcd.Endpoint())}
	a := svc(t, "a", 5000)
	if _, err := rs[0].reg.Register(a); err != nil {
		t.Fatal(err)
	}
	eventtest.Eventually(t, "a everywhere", sameKeys(rs, []string{"a|default|0"}))

	etcd.Stop()
	if _, err := rs[1].reg.Register(svc(t, "b", 5001)); !errors.Is(err, registry.ErrNotRecorded) {
		t.Fatalf("register while etcd is down: %v", err)
	}
	if err := rs[1].reg.Unregister(a.Key()); !errors.Is(err, registry.ErrNotRecorded) {
		t.Fatalf("unregister while etcd is down: %v", err)
	}
	for _, r := range rs {
		if !cmp.Equal(r.keys(), []string{"a|default|0"}) {
			t.Fatalf("registrations changed while etcd was down: %v", r.keys())
		}
	}
	for _, op := range []string{"register", "unregister"} {
		if got := testutil.ToFloat64(rs[1].store.stats.failures.WithLabelValues(op)); got != 1 {
			t.Errorf("%s failures counted: %v", op, got)
		}
	}
	etcd.Restart()

	c := svc(t, "c", 5002)
	eventtest.Eventually(t, "registration after etcd is back", func() bool {
		_, err := rs[1].reg.Register(c)
		return err == nil
	})
	eventtest.Eventually(t, "c everywhere", sameKeys(rs, []string{"a|default|0", "c|default|0"}))
	for i, r := range rs {
		started, stopped := r.starts.counts()
		if started[a.Key()] != 1 || stopped[a.Key()] != 0 {
			t.Fatalf("replica %d restarted an unchanged subscription: started %v, stopped %v", i+1, started, stopped)
		}
	}
}

// TestCompactedWatchRelists: a replica whose watch fell behind a
// compaction re-reads the set and applies only the differences.
func TestCompactedWatchRelists(t *testing.T) {
	etcd := etcdtest.Start(t)
	writer := newReplica(t, etcd.Endpoint())
	behind := newReplica(t, etcd.Endpoint())
	keep, drop, add := svc(t, "keep", 5000), svc(t, "drop", 5001), svc(t, "add", 5002)
	for _, s := range []registry.Service{keep, drop} {
		if _, err := writer.reg.Register(s); err != nil {
			t.Fatal(err)
		}
	}
	eventtest.Eventually(t, "both on the second replica", sameKeys([]*replica{behind}, []string{"drop|default|0", "keep|default|0"}))

	// Stop the second replica's watch, change the set, compact it away.
	behind.store.Close()
	if err := writer.reg.Unregister(drop.Key()); err != nil {
		t.Fatal(err)
	}
	if _, err := writer.reg.Register(add); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := writer.cli.Get(ctx, "compact-marker")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := writer.cli.Compact(ctx, resp.Header.Revision); err != nil {
		t.Fatal(err)
	}
	// Resume the watch from where it stopped, as after a long outage.
	s := behind.store
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.done = make(chan struct{})
	go s.watch()

	eventtest.Eventually(t, "the set re-read", sameKeys([]*replica{behind}, []string{"add|default|0", "keep|default|0"}))
	// The relist applies the set before it records the revision it read, so
	// the keys can match a moment before the gauge moves.
	eventtest.Eventually(t, "the relist's revision recorded", func() bool {
		return testutil.ToFloat64(s.stats.revision) >= float64(writer.store.Revision())
	})
	started, stopped := behind.starts.counts()
	want := map[registry.ServiceKey]int{keep.Key(): 1, drop.Key(): 1, add.Key(): 1}
	if !cmp.Equal(started, want) || !cmp.Equal(stopped, map[registry.ServiceKey]int{drop.Key(): 1}) {
		t.Fatalf("started %v, stopped %v", started, stopped)
	}
	if got := testutil.ToFloat64(s.stats.relists); got != 1 {
		t.Errorf("relists counted: %v", got)
	}
}

// TestFailedApplyRetriedOnRelist: a shared registration whose source could
// not start on one replica is applied there by the next relist, although
// its body did not change, instead of staying missing on that replica.
func TestFailedApplyRetriedOnRelist(t *testing.T) {
	etcd := etcdtest.Start(t)
	writer := newReplica(t, etcd.Endpoint())
	other := newReplica(t, etcd.Endpoint())
	x := svc(t, "x", 5003)
	other.starts.mu.Lock()
	other.starts.failing = map[registry.ServiceKey]int{x.Key(): 1}
	other.starts.mu.Unlock()
	if _, err := writer.reg.Register(x); err != nil {
		t.Fatal(err)
	}
	eventtest.Eventually(t, "the failed apply recorded on the other replica", func() bool {
		other.store.mu.Lock()
		defer other.store.mu.Unlock()
		return other.store.results[x.Key()].err != nil
	})
	if got := other.keys(); len(got) != 0 {
		t.Fatalf("the other replica holds %v after its start failed", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := other.store.relist(ctx); err != nil {
		t.Fatal(err)
	}
	if got := other.keys(); !cmp.Equal(got, []string{"x|default|0"}) {
		t.Errorf("after a relist the other replica holds %v", got)
	}
}

// TestStaticStaysLocal: the config file's registrations are not written
// to etcd, shared ones are checked against them, and unregistering one
// removes it from this replica only.
func TestStaticStaysLocal(t *testing.T) {
	etcd := etcdtest.Start(t)
	st := svc(t, "static", 5000)
	r1 := newReplica(t, etcd.Endpoint(), st)
	r2 := newReplica(t, etcd.Endpoint())
	if changed, err := r1.reg.Register(st); err != nil || changed {
		t.Fatalf("re-registering the file's service: changed %v, %v", changed, err)
	}
	var ce *registry.ConflictError
	if _, err := r1.reg.Register(svc(t, "other", 5000)); !errors.As(err, &ce) {
		t.Fatalf("endpoint of the file's service: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := r1.cli.Get(ctx, DefaultPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 0 {
		t.Fatalf("etcd holds %v keys (%v)", resp.Count, err)
	}
	if len(r2.keys()) != 0 {
		t.Fatalf("second replica: %v", r2.keys())
	}
	if err := r1.reg.Unregister(st.Key()); err != nil || len(r1.keys()) != 0 {
		t.Fatalf("unregister the file's service: %v, left %v", err, r1.keys())
	}
}

// BenchmarkRegistrationVisible measures how long a registration made on
// one replica takes to be applied on all three (reports p50/p99).
func BenchmarkRegistrationVisible(b *testing.B) {
	etcd := etcdtest.Start(b)
	rs := make([]*replica, 3)
	for i := range rs {
		rs[i] = newReplicaB(b, etcd.Endpoint())
	}
	seed := "0"
	p, _ := hashing.Resolve(hashing.Spec{Strategy: "vllm_v1", Algorithm: "sha256_cbor", IndexProjection: "low64_be", PythonHashSeed: &seed})
	var lat []time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		s := registry.Service{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", 10000+i), Type: sourcetype.VLLM, ModelName: "m", TenantID: "default",
			InstanceID: fmt.Sprintf("bench%d", i), BlockSize: 16, Profile: p}
		t0 := time.Now()
		if _, err := rs[i%3].reg.Register(s); err != nil {
			b.Fatal(err)
		}
		for _, r := range rs {
			for r.store.Revision() < rs[i%3].store.Revision() {
				time.Sleep(20 * time.Microsecond)
			}
		}
		lat = append(lat, time.Since(t0))
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

func newReplicaB(b *testing.B, endpoint string) *replica {
	st := &starts{started: map[registry.ServiceKey]int{}, stopped: map[registry.ServiceKey]int{}}
	ix := index.New(index.Options{})
	cat := contexts.New(ix)
	reg := registry.New(registry.Options{Contexts: cat, Start: st.start, MaxServices: 1 << 20})
	cli, err := NewClient(ClientConfig{Endpoints: []string{endpoint}})
	if err != nil {
		b.Fatal(err)
	}
	store, err := Open(context.Background(), Options{Client: cli, Registry: reg, Logger: zerolog.Nop(), MaxServices: 1 << 20})
	if err != nil {
		b.Fatal(err)
	}
	reg.SetStore(store)
	r := &replica{reg: reg, ix: ix, store: store, cli: cli, starts: st}
	b.Cleanup(r.close)
	return r
}

// TestAdvertisedPeers: a replica's advertised URL is listed for others
// (never for itself) while it runs and withdrawn when it closes.
func TestAdvertisedPeers(t *testing.T) {
	etcd := etcdtest.Start(t)
	a, b := newReplica(t, etcd.Endpoint()), newReplica(t, etcd.Endpoint())
	a.store.Advertise("http://a:1")
	b.store.Advertise("http://b:1")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	list := func(self string) []string {
		p, err := Peers(ctx, a.cli, "", self)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	eventtest.Eventually(t, "both advertised", func() bool { return cmp.Equal(list(""), []string{"http://a:1", "http://b:1"}) })
	if got := list("http://b:1"); !cmp.Equal(got, []string{"http://a:1"}) {
		t.Fatalf("peers of b: %v", got)
	}
	b.close()
	if got := list(""); !cmp.Equal(got, []string{"http://a:1"}) {
		t.Fatalf("after b closed: %v", got)
	}
}
