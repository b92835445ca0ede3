package durable

import (
	"testing"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
)

// TestStandardEngineStartsCold: an engine registered with the standard
// hash keeps its registration across a restart but not its entries or
// position: the engine-hash map its removals need is not in the snapshot,
// and restored blocks could never be removed (docs/state.md).
func TestStandardEngineStartsCold(t *testing.T) {
	dir := t.TempDir()
	p, err := hashing.Resolve(hashing.Spec{Strategy: "rfc1527", Algorithm: "xxh3_64"})
	if err != nil {
		t.Fatal(err)
	}
	w := mustOpen(t, dir)
	a := service(t, "a", 0, "tcp://h:1")
	a.Profile = p
	if _, err := w.reg.Register(a); err != nil {
		t.Fatal(err)
	}
	w.apply(a.Key(), 5, 1, 2, 3)
	w.close()

	w2 := mustOpen(t, dir)
	defer w2.close()
	svcs := w2.reg.Services()
	if len(svcs) != 1 || svcs[0].Profile != p {
		t.Fatalf("services after restart: %+v", svcs)
	}
	if r := w2.sources[a.Key()].resume; r != nil {
		t.Errorf("resume position %+v, want none (cold)", r)
	}
	var res index.QueryResult
	w2.tables[a.Key()].Query(&chain{keys: []uint64{1, 2, 3}}, "a", &res)
	if len(res.Instances) != 1 || res.Instances[0].Max.Device != 0 {
		t.Errorf("restored answer %+v, want nothing restored", res.Instances)
	}
}
