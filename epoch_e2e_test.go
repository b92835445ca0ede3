package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
)

// restart makes the fake engine a new process on the same endpoints: a
// fresh sequence and an empty replay buffer.
func (e *engine) restart() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.seq = 0
	clear(e.history)
}

// The conductor is stopped, the engine restarts and publishes more batches
// than its predecessor ever did (so its numbers look like a continuation),
// then the conductor starts again from its snapshot: the old process's
// restored entries must not come back as hits (no phantom), and the new
// process's whole stream, replayed from its own buffer, is indexed.
func TestPublisherRestartedWhileConductorDownNoPhantom(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	p := startConductor(t, dir)
	e := newEngine(t, "e1", 100000)
	m := model{}
	e.register(p)
	probe(t, p, e, m, 0)
	for i := 1; i < 10; i++ {
		e.send(storedEvent(t, prompt(1, i)))
		m["e1"][i] = true
	}
	checkAll(t, p, m, []*engine{e}, 10, "before the restarts")
	p.stop()

	e.restart()
	fresh := model{"e1": {}}
	for i := 20; i < 40; i++ { // 20 batches: past the old process's last number
		e.send(storedEvent(t, prompt(1, i)))
		fresh["e1"][i] = true
	}
	p2 := startConductor(t, dir)
	eventtest.Eventually(t, "the restored source settled", func() bool {
		e.send(storedEvent(t, prompt(1, 40)))
		fresh["e1"][40] = true
		status, _ := p2.do("GET", "/readyz", nil)
		return status == 200
	})
	checkAll(t, p2, fresh, []*engine{e}, 41, "after the publisher's restart")
	if got := p2.metric(`conductor_restore_sources{outcome="restarted"}`); got != 1 {
		t.Errorf("restored sources settled as restarted: %v", got)
	}
	if got := p2.metric(`conductor_publisher_restarts_total{service="e1|default|0",type="vLLM"}`); got != 1 {
		t.Errorf("publisher restarts: %v\n%s", got, p2.logText())
	}
}

// skip consumes a sequence number without delivering it: a lost batch.
func (e *engine) skip() {
	e.mu.Lock()
	e.seq++
	e.mu.Unlock()
}

// --stale-recovery end to end, on an engine registered without a replay
// endpoint: a lost batch makes the source stale and drops its entries;
// under auto it is indexed again by itself, under off only once it is
// registered again.
func TestStaleRecoveryModes(t *testing.T) {
	for _, mode := range []string{"auto", "off"} {
		t.Run(mode, func(t *testing.T) {
			p := startConductor(t, filepath.Join(t.TempDir(), "state"), "--stale-recovery", mode)
			e := newEngine(t, "e1", 10)
			register := func() {
				if status, out := p.do("POST", "/register", vllmRegistration(e.name, e.endpoint)); status != 200 {
					t.Fatalf("register: %d %v", status, out)
				}
			}
			register()
			m := model{}
			probe(t, p, e, m, 0)
			e.send(storedEvent(t, prompt(1, 1)))
			m["e1"][1] = true
			checkAll(t, p, m, []*engine{e}, 2, "before the gap")

			e.skip()
			e.send(storedEvent(t, prompt(1, 2))) // reveals the gap: stale
			eventtest.Eventually(t, "stale", func() bool { return p.metric("conductor_stale_sources") == 1 })
			checkAll(t, p, model{"e1": {}}, []*engine{e}, 3, "stale: entries dropped")

			if mode == "off" {
				if !strings.Contains(p.logText(), "its entries are retracted until it is registered again") {
					t.Fatalf("off: no stale line naming re-registration:\n%s", p.logText())
				}
				register() // identical: restarts the stale source
			}
			eventtest.Eventually(t, "indexed again", func() bool {
				e.send(storedEvent(t, prompt(1, 3)))
				_, a := p.do("POST", "/query", map[string]any{"model": "deepseek", "block_size": 16, "token_ids": prompt(1, 3), "instance_id": "e1"})
				return device(a, "e1") == 64
			})
			want := 0.0
			if mode == "auto" {
				want = 1
			}
			if got := p.metric(`conductor_stale_recoveries_total{service="e1|default|0",type="vLLM"}`); got != want {
				t.Errorf("stale recoveries %v, want %v", got, want)
			}
			if got := p.metric("conductor_stale_sources"); got != 0 {
				t.Errorf("stale sources %v", got)
			}
		})
	}
}
