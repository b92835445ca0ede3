package events

import (
	"github.com/mooncake-conductor-go/conductor/internal/msgp"
)

// Every event family is a map with named keys, and most keys are one of a
// few shapes (a string, a string or nil, an integer or nil, …) read and
// type-checked the same way whatever the family. Each decoder therefore
// describes its keys in a table (name, shape, where the value goes) and
// one reader serves them all; only keys with rules of their own (hashes,
// extra_keys, dp_rank) are read by the decoder itself.

// shape is how a key's value is read and type-checked. A value of the wrong
// type rejects the event with EvWrongType and is skipped.
type shape uint8

const (
	shapeOwn     shape = iota // read by the decoder itself
	shapeStr                  // a string; nil is the wrong type
	shapeOptStr               // a string or nil (kept as empty)
	shapeInt                  // an integer within int64; nil is the wrong type
	shapeOptInt               // an integer within int64, or nil
	shapeUint                 // a non-negative integer; nil is the wrong type
	shapeOptUint              // a non-negative integer, or nil
	shapeTokens               // token ids (nil allowed): range-checked, never kept
)

// noSlot marks a key whose value is type-checked but not kept.
const noSlot = 0xff

// fieldSpec describes one recognized key: its field id (a bit in the
// event's seen and non-nil masks) is its index in the table.
type fieldSpec struct {
	name  string
	shape shape
	slot  uint8 // index into the event's strs, ints or uints, by shape; noSlot if not kept
}

// fieldTable maps the keys of one event family to their specs. Keys are
// looked up by length first: no hashing, and each length has one or two
// candidates.
type fieldTable struct {
	specs []fieldSpec
	byLen [32][]uint8
}

func newFieldTable(specs []fieldSpec) *fieldTable {
	if len(specs) > 32 {
		panic("events: more than 32 fields do not fit the seen masks")
	}
	t := &fieldTable{specs: specs}
	for id, f := range specs {
		if f.name == "" {
			continue // an id the family does not use
		}
		if len(f.name) >= len(t.byLen) {
			panic("events: field name too long for the table: " + f.name)
		}
		t.byLen[len(f.name)] = append(t.byLen[len(f.name)], uint8(id))
	}
	return t
}

// lookup returns the field id of key; known is false for keys the family
// does not define, which are skipped (forward compatibility).
func (t *fieldTable) lookup(key []byte) (id uint8, known bool) {
	if len(key) >= len(t.byLen) {
		return 0, false
	}
	for _, id := range t.byLen[len(key)] {
		if t.specs[id].name == string(key) {
			return id, true
		}
	}
	return 0, false
}

// values holds the kept values of one event, by slot.
type values struct {
	strs  [10][]byte
	ints  [4]int64
	uints [3]uint64
}

// readShaped reads the value of a key whose shape is not shapeOwn into v.
// pairs allows [a, b] token pairs (SGLang EAGLE bigram keys).
func readShaped(r *msgp.Reader, f *fieldSpec, v *values, ev rejecter, pairs bool) error {
	k, err := r.Peek()
	if err != nil {
		return err
	}
	switch f.shape {
	case shapeStr, shapeOptStr:
		if k == msgp.Nil && f.shape == shapeOptStr {
			return r.Nil()
		}
		if k != msgp.Str {
			ev.fail(EvWrongType)
			return r.Skip()
		}
		b, err := r.Str()
		if err != nil {
			return err
		}
		if f.slot != noSlot {
			v.strs[f.slot] = b
		}
		return nil
	case shapeInt, shapeOptInt:
		if k == msgp.Nil {
			if f.shape == shapeInt {
				ev.fail(EvWrongType)
			}
			return r.Nil()
		}
		if k != msgp.Int {
			ev.fail(EvWrongType)
			return r.Skip()
		}
		u, neg, err := r.Integer()
		if err != nil {
			return err
		}
		n, ok := msgp.Int64Range(u, neg)
		if !ok {
			ev.fail(EvWrongType)
		}
		if f.slot != noSlot {
			v.ints[f.slot] = n
		}
		return nil
	case shapeUint, shapeOptUint:
		if k == msgp.Nil && f.shape == shapeOptUint {
			return r.Nil()
		}
		if k != msgp.Int {
			ev.fail(EvWrongType)
			return r.Skip()
		}
		u, neg, err := r.Integer()
		if err != nil {
			return err
		}
		if neg {
			ev.fail(EvWrongType)
		}
		if f.slot != noSlot {
			v.uints[f.slot] = u
		}
		return nil
	case shapeTokens:
		if k == msgp.Nil {
			return r.Nil()
		}
		if k != msgp.Array {
			ev.fail(EvWrongType)
			return r.Skip()
		}
		return readTokenArray(r, pairs, ev)
	}
	panic("events: readShaped called for a key the decoder reads itself")
}
