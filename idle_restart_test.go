package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mooncake-conductor-go/conductor/internal/testkit/etcdtest"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
)

// A conductor restart must not forget what idle engines hold: vLLM does not
// announce blocks it already has, so a restored source with a replay
// endpoint confirms its position by asking that endpoint right after it
// subscribes (docs/state.md#what-survives-a-restart). These tests publish
// nothing after the restart unless they say so.

// holdsThrough checks, at every poll until the catch-up timeout (counted
// from when p listened, which is after the restore) and the two seconds the
// durable state takes to act on it have passed, that every prompt answers as
// m says: the condition is checked over the whole window, not once after a
// sleep.
func holdsThrough(t *testing.T, p *proc, since time.Time, timeout time.Duration, m model, engines []*engine, prompts int) {
	t.Helper()
	for {
		over := time.Since(since) >= timeout+2*time.Second
		for _, e := range engines {
			for i := 0; i < prompts; i++ {
				_, a := p.do("POST", "/query", map[string]any{"model": "deepseek", "block_size": 16, "token_ids": prompt(engineIndex(e.name), i), "instance_id": e.name})
				if got, want := device(a, e.name), m.expect(e.name, i); got != want {
					t.Fatalf("%s prompt %d: device %d, want %d (%v after the restart)", e.name, i, got, want, time.Since(since))
				}
			}
		}
		if over {
			return
		}
	}
}

// (a) Idle engines that stayed up: their restored hits are confirmed by
// their replay endpoints within moments of the restart and kept past the
// catch-up timeout, which used to drop them as lagging.
func TestIdleEnginesKeepHitsAcrossRestart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	p := startConductor(t, dir, "--snapshot-interval", "0")
	engines := []*engine{newEngine(t, "e1", 1000), newEngine(t, "e2", 1000)}
	m := registerAll(t, p, engines)
	storeAll(t, engines, m, 1, 6)
	checkAll(t, p, m, engines, 6, "before the restart")
	p.stop()

	const timeout = time.Second
	p2 := startConductor(t, dir, "--snapshot-interval", "0", "--catch-up-timeout", timeout.String())
	since := time.Now()
	eventtest.Eventually(t, "both sources confirmed in order without a live message", func() bool {
		return p2.metric(`conductor_restore_sources{outcome="in_order"}`) == 2
	})
	if status, out := p2.do("GET", "/readyz", nil); status != 200 {
		t.Errorf("/readyz once confirmed: %d %v", status, out)
	}
	holdsThrough(t, p2, since, timeout, m, engines, 6)
	for _, o := range []string{"lagging", "cold", "restarted", "replay"} {
		if got := p2.metric(`conductor_restore_sources{outcome="` + o + `"}`); got != 0 {
			t.Errorf("%s %v", o, got)
		}
	}
	if log := p2.logText(); !strings.Contains(log, "restored position confirmed by the publisher's replay endpoint") {
		t.Errorf("no line says how the sources were confirmed:\n%s", log)
	}
	// The streams go on in order.
	storeAll(t, engines, m, 6, 7)
	checkAll(t, p2, m, engines, 7, "after the streams went on")
}

// (b) An engine that restarted while the conductor was down (a new process
// with a new replay buffer) and is idle since: its old blocks go and what
// the new process published is indexed, from its own buffer, without a
// live message; the engine beside it that stayed up keeps its hits. Both
// when the new process published more batches than the old one (another
// record at the restored number) and fewer (nothing there yet).
func TestEngineRestartedWhileConductorDownIdle(t *testing.T) {
	for _, tc := range []struct {
		name string
		n    int // batches the new process published
	}{{"past the old number", 12}, {"short of the old number", 2}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "state")
			p := startConductor(t, dir, "--snapshot-interval", "0")
			engines := []*engine{newEngine(t, "e1", 1000), newEngine(t, "e2", 1000)}
			m := registerAll(t, p, engines)
			storeAll(t, engines, m, 1, 6)
			checkAll(t, p, m, engines, 6, "before the restart")
			p.stop()

			e1 := engines[0]
			e1.restart()
			m["e1"] = map[int]bool{}
			for i := 20; i < 20+tc.n; i++ {
				e1.send(storedEvent(t, prompt(1, i)))
				m["e1"][i] = true
			}
			const timeout = time.Second
			p2 := startConductor(t, dir, "--snapshot-interval", "0", "--catch-up-timeout", timeout.String())
			since := time.Now()
			eventtest.Eventually(t, "settled without a live message", func() bool {
				return p2.metric(`conductor_restore_sources{outcome="restarted"}`) == 1 &&
					p2.metric(`conductor_restore_sources{outcome="in_order"}`) == 1
			})
			holdsThrough(t, p2, since, timeout, m, engines, 20+tc.n)
			if got := p2.metric(`conductor_publisher_restarts_total{service="e1|default|0",type="vLLM"}`); got != 1 {
				t.Errorf("publisher restarts %v", got)
			}
			if got := p2.metric(`conductor_restore_sources{outcome="lagging"}`); got != 0 {
				t.Errorf("lagging %v", got)
			}
		})
	}
}

// (c) An engine registered with the standard hash (rfc1527) keeps its
// blocks across a restart, with the engine-hash map its removals need: it
// answers /query_by_hash with the standard keys after the restart, idle,
// and a removal naming the engine's own hash still finds its block.
func TestStandardHashEngineRestored(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	p := startConductor(t, dir, "--snapshot-interval", "0")
	e := newEngine(t, "std-v", 1000)
	reg := stdRegistration("vLLM", e.name, e.endpoint)
	reg["replay_endpoint"] = e.replayEP
	if status, out := p.do("POST", "/register", reg); status != 200 {
		t.Fatalf("register: %d %v", status, out)
	}
	// The engine's own hashes are arbitrary numbers (another
	// PYTHONHASHSEED); the index keys blocks by the standard hash.
	stored := func(hashes []uint64, parent any, from int) map[string]any {
		return map[string]any{"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
			"token_ids": seqTokens(from, 16*len(hashes)), "block_size": 16, "lora_id": nil, "medium": "GPU",
			"lora_name": nil, "extra_keys": make([]any, len(hashes))}
	}
	byHash := func(p *proc) int64 {
		status, a := p.do("POST", "/query_by_hash", map[string]any{"model": "std", "block_size": 16, "seq_hashes": stdVectors})
		if status != 200 {
			t.Fatalf("/query_by_hash: %d %v", status, a)
		}
		return tierCount(a, e.name, "device")
	}
	eventtest.Eventually(t, "the engine's blocks indexed", func() bool {
		e.send(stored([]uint64{11, 12}, nil, 1), stored([]uint64{13, 14}, uint64(12), 33))
		return byHash(p) == 64
	})
	p.stop()

	const timeout = time.Second
	p2 := startConductor(t, dir, "--snapshot-interval", "0", "--catch-up-timeout", timeout.String())
	since := time.Now()
	// In order, or through replay when a batch of the loop above came
	// after the shutdown snapshot's cut.
	eventtest.Eventually(t, "confirmed without a live message", func() bool {
		return p2.metric(`conductor_restore_sources{outcome="in_order"}`)+p2.metric(`conductor_restore_sources{outcome="replay"}`) == 1
	})
	for time.Since(since) < timeout+2*time.Second {
		if got := byHash(p2); got != 64 {
			t.Fatalf("/query_by_hash after the restart: %d tokens, want 64", got)
		}
	}
	if log := p2.logText(); strings.Contains(log, "no longer registered") {
		t.Errorf("the log says the registered engine is gone:\n%s", log)
	}
	// The restored map: a removal by the engine's hash of the third
	// block leaves the first two.
	e.send(map[string]any{"type": "BlockRemoved", "block_hashes": []uint64{13}, "medium": "GPU"})
	eventtest.Eventually(t, "the restored block removed by its engine hash", func() bool { return byHash(p2) == 32 })
}

// (d) A replica bootstrapped from a live peer beside idle publishers (one
// with a replay endpoint, one without) takes the peer's positions as
// confirmed: it is ready at once (the catch-up timeout is a minute) and
// answers exactly like its peer. A publisher restart after that is still
// a new epoch on it.
func TestReplicaFromPeerBesideIdlePublishers(t *testing.T) {
	etcd := etcdtest.Start(t)
	peer := startReplica(t, etcd)
	withReplay, without := newEngine(t, "e1", 1000), newEngine(t, "e2", 1000)
	engines := []*engine{withReplay, without}
	withReplay.register(peer)
	if status, out := peer.do("POST", "/register", vllmRegistration(without.name, without.endpoint)); status != 200 {
		t.Fatalf("register: %d %v", status, out)
	}
	m := model{}
	for _, e := range engines {
		probe(t, peer, e, m, 0)
	}
	storeAll(t, engines, m, 1, 12)
	checkAll(t, peer, m, engines, 12, "peer")

	fresh := startReplica(t, etcd, "--bootstrap-from", peer.base)
	eventtest.Eventually(t, "the bootstrapped replica ready", func() bool {
		status, _ := fresh.do("GET", "/readyz", nil)
		return status == 200
	})
	if got := fresh.metric(`conductor_restore_sources{outcome="peer"}`); got != 2 {
		t.Errorf("positions taken from the peer: %v\n%s", got, fresh.logText())
	}
	var prompts [][]int32
	for _, e := range engines {
		for i := 0; i < 12; i++ {
			prompts = append(prompts, prompt(engineIndex(e.name), i))
		}
	}
	ref := peer.answers(prompts)
	if d := cmp.Diff(ref, fresh.answers(prompts)); d != "" {
		t.Fatalf("answers differ as soon as ready (-peer +bootstrapped):\n%s", d)
	}
	if got := device(ref[3], "e1"); got != 64 {
		t.Fatalf("the peer's answer %v: the reference holds nothing", ref[3])
	}

	// The engine with replay restarts and announces one prompt: both
	// replicas drop the old process's blocks.
	withReplay.restart()
	m["e1"] = map[int]bool{}
	eventtest.Eventually(t, "the new process indexed on both", func() bool {
		withReplay.send(storedEvent(t, prompt(1, 30)))
		m["e1"][30] = true
		for _, p := range []*proc{peer, fresh} {
			_, a := p.do("POST", "/query", map[string]any{"model": "deepseek", "block_size": 16, "token_ids": prompt(1, 30), "instance_id": "e1"})
			if device(a, "e1") != 64 {
				return false
			}
		}
		return true
	})
	for i, p := range []*proc{peer, fresh} {
		checkAll(t, p, m, engines, 31, fmt.Sprintf("replica %d after the publisher restarted", i+1))
	}
	if got := fresh.metric(`conductor_publisher_restarts_total{service="e1|default|0",type="vLLM"}`); got != 1 {
		t.Errorf("restarts seen by the bootstrapped replica: %v", got)
	}
}
