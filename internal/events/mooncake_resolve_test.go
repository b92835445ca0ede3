package events

import (
	"fmt"
	"testing"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
	"github.com/vmihailenco/msgpack/v5"
)

// TestMooncakeResolvesContextOncePerBatch: a master batch looks each
// context it names up once, however many objects it stores there, and
// holds no table once applied; a batch whose context has no registration
// with the source's profile fails every stored event.
func TestMooncakeResolvesContextOncePerBatch(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mod     func(map[string]any)
		wantOK  bool
		profile func(*hashing.Profile) // changes what the catalogue answers
	}{
		{name: "stamped events, one context", wantOK: true},
		{name: "released master, the registration's context", mod: unstamped(), wantOK: true},
		{name: "registered with another profile", profile: func(p *hashing.Profile) { p.Seed = "another" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := newTester(t, eventtest.LoadManifest(t), "pool-a-sub", "vllm-a")
			d := x.dec.(*mooncakeDecoder)
			lookup, lookups := d.lookup, 0
			d.lookup = func(ctx index.ContextKey) (SharedSink, *hashing.Profile, bool) {
				lookups++
				_, p, ok := lookup(ctx)
				if ok && tc.profile != nil {
					c := *p
					tc.profile(&c)
					p = &c
				}
				return nopShared{}, p, ok
			}
			var stored []any
			for i := range 32 {
				key := fmt.Sprintf("deploy@test-model@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@%064x", i+1)
				stored = append(stored, mcEventMap("stored", "cpu", key, tc.mod))
			}
			payload, err := msgpack.Marshal([]any{uint64(1000), stored, 0})
			if err != nil {
				t.Fatal(err)
			}
			for batch := 1; batch <= 2; batch++ {
				if rej := d.Decode(payload); rej != ReasonNone {
					t.Fatal(rej)
				}
				d.Apply()
				if lookups != batch {
					t.Errorf("after batch %d: %d lookups, want one per batch", batch, lookups)
				}
				if len(d.resolved) != 0 {
					t.Errorf("after batch %d: %d resolved contexts still held", batch, len(d.resolved))
				}
				for i := range d.events {
					res, reason := d.Outcome(i)
					if failed := res != Applied || reason != ReasonNone; failed == tc.wantOK {
						t.Errorf("batch %d event %d: %v %v, want applied %v", batch, i, res, reason, tc.wantOK)
					}
				}
			}
		})
	}
}
