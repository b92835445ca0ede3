package index

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestCutSeesEveryWriter: each way of changing a table's engine entries
// copies the stripe for a cut in progress (Table.changing), so a cut begun
// before the change describes the state before it.
func TestCutSeesEveryWriter(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(tb *Table, a OwnerID)
	}{
		{"store", func(tb *Table, a OwnerID) { tb.Store(a, Put{Key: 3, Tier: CPULocal}) }},
		{"store batch", func(tb *Table, a OwnerID) { tb.storeBatch(a, []uint64{4, 5}, []TierMask{1 << Device, 1 << Disk}, nil) }},
		{"put", func(tb *Table, a OwnerID) { tb.Store(a, Put{Key: 6, Tier: Disk, Replace: true}) }},
		{"remove", func(tb *Table, a OwnerID) { tb.Remove(a, Put{Key: 1, Tier: Device}) }},
		{"evict", func(tb *Table, a OwnerID) { tb.Remove(a, Put{Key: 2, Replace: true}) }},
		{"clear owner", func(tb *Table, a OwnerID) { tb.ClearOwner(a, AllEngineTiers) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix := New(Options{Stripes: 4})
			tb := ix.EnsureTable(testCtx)
			a := tb.AddEngineOwner("a", 0)
			tb.Store(a, Put{Key: 1, Tier: Device})
			tb.Store(a, Put{Key: 2, Tier: Disk})
			want := held{{"a", 0}: {1: 1 << Device, 2: 1 << Disk}}
			c := ix.BeginCut()
			tc.change(tb, a)
			got, ok := findCut(c.Finish(), testCtx)
			if !ok {
				t.Fatal("table missing from the cut")
			}
			if diff := cmp.Diff(want, decodeCut(t, got)); diff != "" {
				t.Errorf("cut after %s (-before +cut):\n%s", tc.name, diff)
			}
		})
	}
}
