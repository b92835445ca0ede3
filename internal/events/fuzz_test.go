package events

import (
	"testing"

	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
)

// FuzzApplyBatch feeds arbitrary payloads to every decoder: nothing may
// panic, a rejected envelope must leave the index untouched, and retracting
// afterwards must balance every shared reference. Seeds are all fixtures.
func FuzzApplyBatch(f *testing.F) {
	m := eventtest.LoadManifest(f)
	for i := range m.Fixtures {
		fx := &m.Fixtures[i]
		if fx.PayloadFile != "" {
			f.Add(uint8(i%3), eventtest.Payload(f, fx))
		}
	}
	regs := []struct{ reg, also string }{{"vllm-a", ""}, {"sglang-a", ""}, {"pool-a-sub", "vllm-a"}}
	f.Fuzz(func(t *testing.T, which uint8, payload []byte) {
		r := regs[int(which)%len(regs)]
		var also []string
		if r.also != "" {
			also = []string{r.also}
		}
		x := newTester(t, m, r.reg, also...)
		x.applyBatch(1, payload)
		x.applyBatch(2, payload) // state carried over (bindings) must stay consistent
		if x.envRejected == 2 {
			if ops := append(x.engine.Snapshot(), x.shared.Snapshot()...); len(ops) != 0 {
				t.Fatalf("rejected envelope changed the index: %v", ops)
			}
		}
		x.retract()
		if bal := eventtest.SharedBalance(x.shared.Snapshot()); len(bal) != 0 {
			t.Fatalf("unbalanced shared references after retract: %v", bal)
		}
	})
}
