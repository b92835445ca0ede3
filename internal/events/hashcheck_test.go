package events

import (
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/vmihailenco/msgpack/v5"
)

// TestTokensOf checks the hash check's token reader against the ids that
// were encoded: every msgpack integer format, [a, b] pairs between plain
// ids, and a cap that stops mid-array.
func TestTokensOf(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for c := range 300 {
		elems := []any{}
		var flat []int32
		n := rng.IntN(80)
		for range n {
			v := int32(rng.Uint32() >> rng.IntN(32)) // all sizes
			if rng.IntN(4) == 0 {
				v = -v
			}
			if c%2 == 1 && rng.IntN(5) == 0 {
				w := int32(rng.IntN(1 << 20))
				elems = append(elems, []int32{v, w})
				flat = append(flat, v, w)
				continue
			}
			// msgpack encodes by value, smallest format first; int64
			// forces the wide formats too.
			if rng.IntN(3) == 0 {
				elems = append(elems, int64(v))
			} else {
				elems = append(elems, v)
			}
			flat = append(flat, v)
		}
		payload, err := msgpack.Marshal(elems)
		if err != nil {
			t.Fatal(err)
		}
		d := &engineDecoder{payload: payload}
		max := len(flat)
		if c%3 == 0 {
			max = rng.IntN(len(flat) + 1)
		}
		got, ok := d.tokensOf(span{0, int32(len(payload))}, nil, max)
		if !ok {
			t.Fatalf("case %d: not read: %x", c, payload)
		}
		// The ids come out in order; a cap is reached, overshot by at
		// most the second id of a pair.
		if len(got) < min(max, len(flat)) || len(got) > max+1 || len(got) > len(flat) {
			t.Fatalf("case %d: %d ids for max %d of %d", c, len(got), max, len(flat))
		}
		if diff := cmp.Diff(flat[:len(got)], got, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("case %d (max %d) (-want +got):\n%s", c, max, diff)
		}
	}
}
