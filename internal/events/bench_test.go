package events

import (
	"fmt"
	"testing"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
	"github.com/vmihailenco/msgpack/v5"
)

type nopReporter struct{}

func (nopReporter) Report(int, Result, Reason) {}

// BenchmarkMooncakeStoreRemove measures a master batch of 32 stored and 32
// removed objects (vLLM keys): binding-table upkeep dominates, one shared
// reference per object.
func BenchmarkMooncakeStoreRemove(b *testing.B) { benchStoreRemove(b, "pool-a-sub", nil) }

// BenchmarkMooncakeReleasedStoreRemove is the same batches as the released
// master packs them: the context from the registration, and each removal
// looked up in both shared tiers.
func BenchmarkMooncakeReleasedStoreRemove(b *testing.B) {
	benchStoreRemove(b, "pool-r-sub", unstamped())
}

func benchStoreRemove(b *testing.B, reg string, mod func(map[string]any)) {
	x := newTester(b, eventtest.LoadManifest(b), reg, "vllm-a")
	d := x.dec.(*mooncakeDecoder)
	sink := nopShared{}
	lookup := d.lookup
	d.lookup = func(ctx index.ContextKey) (SharedSink, *hashing.Profile, bool) {
		_, p, ok := lookup(ctx)
		return sink, p, ok
	}
	runStoreRemove(b, d, mod)
}

type nopShared struct{}

func (nopShared) Acquire(*index.SharedRef) bool       { return true }
func (nopShared) Release(*index.SharedRef)            {}
func (nopShared) Adjust(*index.SharedRef, int64) bool { return true }

// BenchmarkMooncakeStoreRemoveIndexed is BenchmarkMooncakeStoreRemove
// against a real table of a bounded index, so each binding's reference is
// taken and released, and accounted, in the index.
func BenchmarkMooncakeStoreRemoveIndexed(b *testing.B) {
	x := newTester(b, eventtest.LoadManifest(b), "pool-a-sub", "vllm-a")
	d := x.dec.(*mooncakeDecoder)
	ix := index.New(index.Options{MemoryLimit: 64 << 20})
	defer ix.Close()
	lookup := d.lookup
	d.lookup = func(ctx index.ContextKey) (SharedSink, *hashing.Profile, bool) {
		_, p, ok := lookup(ctx)
		if !ok {
			return nil, nil, false
		}
		return ix.EnsureTable(ctx), p, true
	}
	runStoreRemove(b, d, nil)
}

// runStoreRemove decodes and applies, per iteration, a batch storing 32
// objects in cpu and one removing them, each event shaped by mod
// (mcEventMap), and reports events per second.
func runStoreRemove(b *testing.B, d *mooncakeDecoder, mod func(map[string]any)) {
	var rep nopReporter
	var stored, removed []any
	for i := range 32 {
		key := fmt.Sprintf("deploy@test-model@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@%064x", i+1)
		stored = append(stored, mcEventMap("stored", "cpu", key, mod))
		removed = append(removed, mcEventMap("removed", "cpu", key, mod))
	}
	p1, _ := msgpack.Marshal([]any{uint64(1000), stored, 0})
	p2, _ := msgpack.Marshal([]any{uint64(1000), removed, 0})
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		for _, p := range [][]byte{p1, p2} {
			if rej := d.Decode(p); rej != ReasonNone {
				b.Fatal(rej)
			}
			applyTo(d, rep)
		}
	}
	b.StopTimer()
	if len(d.bindings) != 0 {
		b.Fatalf("%d bindings left", len(d.bindings))
	}
	b.ReportMetric(float64(b.N*64)/b.Elapsed().Seconds(), "events/s")
}
