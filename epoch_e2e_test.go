package main

import (
	"path/filepath"
	"testing"
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
	eventually(t, "the restored source settled", func() bool {
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
