package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mooncake-conductor-go/conductor/internal/etcdreg"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/etcdtest"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
)

// These tests run three replicas of the real binary on loopback, sharing
// their registrations through a real etcd (in this process), with real
// ZMQ publishers: a registration made on one replica reaches all; a
// replica killed and replaced by one that bootstraps from a peer answers
// like the others; etcd restarting costs no subscription.

func startReplica(t *testing.T, etcd *etcdtest.Server, args ...string) *proc {
	t.Helper()
	return startConductor(t, filepath.Join(t.TempDir(), "state"),
		append([]string{"--etcd-endpoints", etcd.Endpoint(), "--snapshot-interval", "0", "--catch-up-timeout", "60s"}, args...)...)
}

// serviceKeys is a replica's /services as service keys with their states.
func serviceKeys(t *testing.T, p *proc) []string {
	t.Helper()
	status, out := p.do("GET", "/services", nil)
	if status != 200 {
		t.Fatalf("/services: %d %v", status, out)
	}
	var keys []string
	for _, s := range out.(map[string]any)["services"].([]any) {
		m := s.(map[string]any)
		keys = append(keys, fmt.Sprintf("%v", m["InstanceID"]))
	}
	return keys
}

// probeAll publishes until every replica shows the engine's probe prompt.
func probeAll(t *testing.T, ps []*proc, e *engine, m model, n int) {
	t.Helper()
	tk := prompt(engineIndex(e.name), n)
	eventtest.Eventually(t, "subscription of "+e.name+" on every replica", func() bool {
		e.send(storedEvent(t, tk))
		for _, p := range ps {
			_, a := p.do("POST", "/query", map[string]any{"model": "deepseek", "block_size": 16, "token_ids": tk})
			if device(a, e.name) != 64 {
				return false
			}
		}
		return true
	})
	if m[e.name] == nil {
		m[e.name] = map[int]bool{}
	}
	m[e.name][n] = true
}

// publishRange has every engine store prompts from to to-1, removing the
// one two back every third prompt, and records the result in m.
func publishRange(t *testing.T, engines []*engine, m model, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		for _, e := range engines {
			e.send(storedEvent(t, prompt(engineIndex(e.name), i)))
			m[e.name][i] = true
			if i%3 == 0 {
				e.send(removedEvent(t, prompt(engineIndex(e.name), i-2)))
				m[e.name][i-2] = false
			}
		}
	}
}

func TestReplicasShareRegistrationsAndBootstrapFromPeer(t *testing.T) {
	etcd := etcdtest.Start(t)
	ps := []*proc{startReplica(t, etcd), startReplica(t, etcd), startReplica(t, etcd)}
	engines := []*engine{newEngine(t, "e1", 100000), newEngine(t, "e2", 100000)}
	m := model{}

	// Registered through replica 1 only: all three subscribe.
	for _, e := range engines {
		e.register(ps[0])
	}
	for _, e := range engines {
		probeAll(t, ps, e, m, 0)
	}
	publish := func(from, to int) { publishRange(t, engines, m, from, to) }
	publish(1, 40)
	for i, p := range ps {
		checkAll(t, p, m, engines, 40, fmt.Sprintf("replica %d", i+1))
	}

	// Two conflicting registrations (one endpoint, two services) sent at
	// once to two replicas: one wins, and every replica agrees which.
	var wg sync.WaitGroup
	statuses := make([]int, 2)
	for i := range 2 {
		wg.Go(func() {
			statuses[i], _ = ps[i].do("POST", "/register", vllmRegistration(fmt.Sprintf("c%d", i), "tcp://127.0.0.1:1"))
		})
	}
	wg.Wait()
	if !cmp.Equal(statuses, []int{200, 400}) && !cmp.Equal(statuses, []int{400, 200}) {
		t.Fatalf("conflicting registrations answered %v", statuses)
	}
	winner := "c0"
	if statuses[1] == 200 {
		winner = "c1"
	}
	want := []string{winner, "e1", "e2"}
	eventtest.Eventually(t, "the same registrations on every replica", func() bool {
		for _, p := range ps {
			if !cmp.Equal(serviceKeys(t, p), want) {
				return false
			}
		}
		return true
	})
	if status, out := ps[2].do("POST", "/unregister", map[string]any{"instance_id": winner, "tenant_id": "default", "dp_rank": 0}); status != 200 {
		t.Fatalf("unregister %s: %d %v", winner, status, out)
	}
	eventtest.Eventually(t, "the unregistration on every replica", func() bool {
		for _, p := range ps {
			if !cmp.Equal(serviceKeys(t, p), []string{"e1", "e2"}) {
				return false
			}
		}
		return true
	})

	// SIGKILL replica 2, keep publishing, start a replacement that
	// bootstraps from replica 1: once ready it answers like the others.
	ps[1].kill()
	publish(40, 80)
	fresh := startReplica(t, etcd, "--bootstrap-from", "http://127.0.0.1:1,"+ps[0].base)
	n := publishUntilReady(t, fresh, publish, 80)
	if !strings.Contains(fresh.logText(), "index snapshot loaded from peer") {
		t.Fatalf("the replacement did not load a peer snapshot:\n%s", fresh.logText())
	}
	if got := fresh.metric(`conductor_restore_sources{outcome="restored"}`); got != 2 {
		t.Errorf("sources restored from the peer: %v", got)
	}
	live := []*proc{ps[0], ps[2], fresh}
	for i, p := range live {
		checkAll(t, p, m, engines, n, fmt.Sprintf("live replica %d", i+1))
	}
	prompts := make([][]int32, 0, 2*n)
	for _, e := range engines {
		for i := 0; i < n; i++ {
			prompts = append(prompts, prompt(engineIndex(e.name), i))
		}
	}
	ref := ps[0].answers(prompts)
	for _, p := range live[1:] {
		if d := cmp.Diff(ref, p.answers(prompts)); d != "" {
			t.Fatalf("replica answers differ (-replica 1 +other):\n%s", d)
		}
	}

	// etcd restarts: changes answer 503 meanwhile, subscriptions keep
	// running, and registrations work again once it is back.
	etcd.Stop()
	publish(n, n+10)
	e3 := newEngine(t, "e3", 100000)
	reg := vllmRegistration(e3.name, e3.endpoint)
	if status, out := ps[0].do("POST", "/register", reg); status != 503 {
		t.Fatalf("register while etcd is down: %d %v", status, out)
	}
	if got := ps[0].metric(`conductor_etcd_failures_total{op="register"}`); got != 1 {
		t.Errorf("etcd failures counted: %v", got)
	}
	for i, p := range live {
		checkAll(t, p, m, engines, n+10, fmt.Sprintf("replica %d while etcd is down", i+1))
	}
	etcd.Restart()
	eventtest.Eventually(t, "a registration once etcd is back", func() bool {
		status, _ := fresh.do("POST", "/register", reg)
		return status == 200
	})
	probeAll(t, live, e3, m, 0)
	publish(n+10, n+20)
	for i, p := range live {
		checkAll(t, p, m, engines, n+20, fmt.Sprintf("replica %d after etcd restarted", i+1))
		if got := metricSum(p.scrape(), "conductor_sequence_gaps_total{"); p != fresh && got != 0 {
			t.Errorf("replica %d saw %v sequence gaps: a subscription was dropped", i+1, got)
		}
	}
}

// publishUntilReady publishes one more prompt per step, from next on, until
// p answers /readyz 200, and returns the first prompt not published. A
// source restored from a snapshot is ready once a live message shows how
// far its stream has moved since the cut, and the replica's SUB socket
// joins after it listens: a fixed batch sent at once may all be lost.
func publishUntilReady(t *testing.T, p *proc, publish func(from, to int), next int) int {
	t.Helper()
	eventtest.Eventually(t, "/readyz 200 while publishing", func() bool {
		publish(next, next+1)
		next++
		status, _ := p.do("GET", "/readyz", nil)
		return status == 200
	})
	return next
}

// startAdvertised starts a replica that advertises its own URL in etcd,
// as a deployment does with --advertise-url: the port is chosen first so
// the URL can be given (the later --port overrides startConductor's).
func startAdvertised(t *testing.T, etcd *etcdtest.Server, args ...string) *proc {
	t.Helper()
	_, port, err := net.SplitHostPort(freeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	url := "http://127.0.0.1:" + port
	p := startReplica(t, etcd, append([]string{"--port", port, "--advertise-url", url}, args...)...)
	if p.base != url {
		t.Fatalf("replica listens on %s, advertises %s", p.base, url)
	}
	return p
}

// awaitAdvertised waits until etcd lists every URL in want among the
// advertised peers.
func awaitAdvertised(t *testing.T, etcd *etcdtest.Server, want ...string) {
	t.Helper()
	cli, err := etcdreg.NewClient(etcdreg.ClientConfig{Endpoints: []string{etcd.Endpoint()}})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	eventtest.Eventually(t, fmt.Sprintf("%v advertised in etcd", want), func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		peers, err := etcdreg.Peers(ctx, cli, "", "")
		if err != nil {
			return false
		}
		for _, u := range want {
			if !slices.Contains(peers, u) {
				return false
			}
		}
		return true
	})
}

// logLine returns the first JSON log line with message msg, decoded.
func logLine(t *testing.T, p *proc, msg string) map[string]any {
	t.Helper()
	for _, l := range strings.Split(p.logText(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["message"] == msg {
			return m
		}
	}
	t.Fatalf("no log line %q:\n%s", msg, p.logText())
	return nil
}

// A replica started with neither --bootstrap-from nor a state directory
// of its own finds its peers through etcd, where replicas advertise their
// URL under a lease, and loads a peer's snapshot: a peer that died still
// has its lease for a while and is offered too, so it must be skipped.
// Once ready, the new replica answers exactly like the peer.
func TestReplicaBootstrapsFromPeerFoundInEtcd(t *testing.T) {
	etcd := etcdtest.Start(t)
	peer, doomed := startAdvertised(t, etcd), startAdvertised(t, etcd)
	engines := []*engine{newEngine(t, "e1", 100000)}
	m := model{}
	engines[0].register(peer)
	probeAll(t, []*proc{peer, doomed}, engines[0], m, 0)
	publish := func(from, to int) { publishRange(t, engines[:1], m, from, to) }
	publish(1, 40)
	checkAll(t, peer, m, engines, 40, "peer")
	awaitAdvertised(t, etcd, peer.base, doomed.base)
	doomed.kill() // its lease outlives it by up to etcdreg.PeerTTL

	fresh := startAdvertised(t, etcd)
	n := publishUntilReady(t, fresh, publish, 40)
	if got := logLine(t, fresh, "bootstrap peers found in etcd")["peers"]; !slices.Contains(got.([]any), any(peer.base)) {
		t.Errorf("peers found in etcd %v, want %s among them", got, peer.base)
	}
	if got := logLine(t, fresh, "index snapshot loaded from peer")["peer"]; got != peer.base {
		t.Errorf("snapshot loaded from %v, want %s", got, peer.base)
	}
	for _, tc := range []struct {
		series string
		want   float64
	}{
		{`conductor_restore_origin{origin="peer"}`, 1},
		{`conductor_restore_origin{origin="state_dir"}`, 0},
		{`conductor_restore_sources{outcome="restored"}`, 1},
	} {
		if got := fresh.metric(tc.series); got != tc.want {
			t.Errorf("%s = %v, want %v", tc.series, got, tc.want)
		}
	}
	checkAll(t, fresh, m, engines, n, "the bootstrapped replica")
	prompts := make([][]int32, n)
	for i := range prompts {
		prompts[i] = prompt(engineIndex(engines[0].name), i)
	}
	if d := cmp.Diff(peer.answers(prompts), fresh.answers(prompts)); d != "" {
		t.Fatalf("answers differ (-peer +bootstrapped):\n%s", d)
	}
}
