package msgp

import (
	"encoding/binary"
	"math"
	"testing"

	"pgregory.net/rapid"
)

// groupElem is one packed element for TestDecodeGroupMatchesReference and
// what decodeGroup must make of it: taken (with its value) or left to the
// general path.
type groupElem struct {
	packed []byte
	value  int32
	taken  bool
}

// drawGroupElem packs a random integer in a random format, or a byte that
// is no integer at all, near the formats' boundaries as often as not.
func drawGroupElem(t *rapid.T) groupElem {
	edge := func(vals ...int64) int64 { return rapid.SampledFrom(vals).Draw(t, "edge") }
	switch rapid.IntRange(0, 11).Draw(t, "format") {
	case 0: // positive fixint
		v := rapid.Int64Range(0, 0x7f).Draw(t, "v")
		return groupElem{[]byte{byte(v)}, int32(v), true}
	case 1: // negative fixint
		v := rapid.Int64Range(-32, -1).Draw(t, "v")
		return groupElem{[]byte{byte(int8(v))}, 0, false}
	case 2: // uint8
		v := rapid.OneOf(rapid.Int64Range(0, 0xff), rapid.Just(edge(0, 0x7f, 0x80, 0xff))).Draw(t, "v")
		return groupElem{[]byte{0xcc, byte(v)}, int32(v), true}
	case 3: // uint16
		v := rapid.OneOf(rapid.Int64Range(0, 0xffff), rapid.Just(edge(0, 0xff, 0x100, 0xffff))).Draw(t, "v")
		return groupElem{binary.BigEndian.AppendUint16([]byte{0xcd}, uint16(v)), int32(v), true}
	case 4: // uint32, over the int32 range too
		v := rapid.OneOf(rapid.Int64Range(0, math.MaxUint32), rapid.Just(edge(0, 0xffff, 0x10000, math.MaxInt32, math.MaxInt32+1, math.MaxUint32))).Draw(t, "v")
		return groupElem{binary.BigEndian.AppendUint32([]byte{0xce}, uint32(v)), int32(v), v <= math.MaxInt32}
	case 5: // int32, negative too
		v := rapid.OneOf(rapid.Int64Range(math.MinInt32, math.MaxInt32), rapid.Just(edge(math.MinInt32, -1, 0, 1, math.MaxInt32))).Draw(t, "v")
		return groupElem{binary.BigEndian.AppendUint32([]byte{0xd2}, uint32(int32(v))), int32(v), v >= 0}
	case 6: // int8
		return groupElem{[]byte{0xd0, byte(rapid.Uint8().Draw(t, "v"))}, 0, false}
	case 7: // int16
		return groupElem{binary.BigEndian.AppendUint16([]byte{0xd1}, rapid.Uint16().Draw(t, "v")), 0, false}
	case 8: // uint64
		return groupElem{binary.BigEndian.AppendUint64([]byte{0xcf}, rapid.Uint64Range(0, 1<<40).Draw(t, "v")), 0, false}
	case 9: // int64
		return groupElem{binary.BigEndian.AppendUint64([]byte{0xd3}, uint64(rapid.Int64().Draw(t, "v"))), 0, false}
	default: // not an integer: nil, a string, an array, a never-used byte, …
		return groupElem{[]byte{rapid.SampledFrom([]byte{0xc0, 0xc1, 0xc2, 0xa1, 0x90, 0xdc, 0xca, 0xcb}).Draw(t, "b")}, 0, false}
	}
}

// TestDecodeGroupMatchesReference: decodeGroup takes exactly the elements
// in the formats it covers, with their values, stops at the first other one
// (leaving the position there for the general path), never decodes more
// than 16, and reads nothing the caller's groupReach check did not cover
// (the body ends right after that reach).
func TestDecodeGroupMatchesReference(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		elems := rapid.SliceOfN(rapid.Custom(drawGroupElem), 1, 20).Draw(t, "elems")
		lead := rapid.IntRange(0, 9).Draw(t, "lead")
		b := make([]byte, lead)
		for _, e := range elems {
			b = append(b, e.packed...)
		}
		// Pad to exactly groupReach past the start, with bytes that are
		// themselves valid elements, so that reading past an element that
		// should have stopped the loop would go unnoticed by length alone.
		for len(b) < lead+groupReach {
			b = append(b, 0x05)
		}
		n := rapid.IntRange(0, 20).Draw(t, "n")
		d := make([]int32, n)
		gotP, gotK := decodeGroup(b[:len(b):len(b)], lead, d, &tokenFormat)

		wantP, wantK := lead, 0
		for wantK < min(n, 16) {
			var e groupElem
			if wantK < len(elems) {
				e = elems[wantK]
			} else { // the padding: positive fixint 5
				e = groupElem{[]byte{0x05}, 5, true}
			}
			if !e.taken {
				break
			}
			if d[wantK] != e.value {
				t.Fatalf("element %d decoded as %d, want %d", wantK, d[wantK], e.value)
			}
			wantP += len(e.packed)
			wantK++
		}
		if gotP != wantP || gotK != wantK {
			t.Fatalf("decodeGroup stopped at byte %d after %d ids, want byte %d after %d", gotP, gotK, wantP, wantK)
		}
	})
}
