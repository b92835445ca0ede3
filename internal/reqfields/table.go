package reqfields

import (
	"encoding/binary"
	"strings"

	"github.com/mooncake-conductor-go/conductor/internal/msgp"
)

// Most members of a request map are one of a few shapes (a string under a
// byte limit, a string or nil, an integer in a range, block_size) read,
// type-checked and bounded the same way whatever the body. Each schema
// therefore describes its members in a Table (name, shape, limit, where
// the value goes) and one reader, Table.Next, serves them all, as
// internal/events does for event keys; members with rules of their own
// (token_ids, the hash lists, hash_profile, kv_cache_groups) have the
// shape Own and are read by the schema's code, dispatched from the same
// table by their id.

// Shape is how a member's value is read, type-checked and bounded.
type Shape uint8

const (
	// Own: read by the schema itself; Next returns it without marking it
	// seen, so the schema may check things before (the hash lists).
	Own Shape = iota
	// Str: a string under the spec's byte limit.
	Str
	// StrOrNil: a string or nil, which reads as ""; the contract types it
	// "string or nil" and a wrong type is refused in those words.
	StrOrNil
	// OptStr: nil stands for the member's absence; a given value is a Str
	// and refused as one.
	OptStr
	// Int: an integer in [Min, Max]; a larger magnitude is out_of_range.
	Int
	// OptInt: nil stands for the member's absence; a given value is an Int.
	OptInt
	// BlockSize: a positive int32 (Cursor.BlockSize's rules and errors).
	BlockSize
)

// StrLimit names which of the caller's byte limits bounds a string member.
type StrLimit uint8

const (
	// IdentityBytes bounds identities: instance ids, model names, types,
	// endpoints, a hash profile's members.
	IdentityBytes StrLimit = iota
	// NameBytes bounds names that enter hashed bytes (lora_name,
	// cache_salt), which engines hash however long they are.
	NameBytes
	numStrLimits
)

// ByteLimits are the caller's string limits, by StrLimit.
type ByteLimits [numStrLimits]int

// NoSlot marks a member whose value is checked but not kept.
const NoSlot = 0xff

// Spec describes one member: its id (its FieldSet bit) is its index in the
// table.
type Spec struct {
	Name     string
	Shape    Shape
	Limit    StrLimit // Str, StrOrNil, OptStr
	Min, Max int64    // Int, OptInt
	// Slot is where the value goes: an index into Values.Str (string
	// shapes) or Values.Int (integer shapes), or NoSlot.
	Slot uint8

	field string // the name errors give: the table's prefix and Name
}

// Values holds the values a Table's reader kept, by slot. It lives on the
// decoder's stack: the strings are views into the body, or copies when the
// table copies.
type Values struct {
	Str [8]string
	Int [4]int64
	// Given has the bit of each member read with a value other than nil.
	Given FieldSet
}

// Table is one schema's members. A key is looked up by a perfect hash of
// its bytes, read as two machine words (every member name is at most 16
// bytes), and one comparison of those words, as a switch on constant
// strings compares them: no call, no loop.
type Table struct {
	specs    [32]Spec // by id; 32 is a FieldSet's width
	n        int
	prefix   string
	copy     bool
	keyField string // what a key that is not a string is reported under
	mult     uint64 // the hash's multiplier, chosen so no two names collide
	slots    [hashSlots]entry
}

// entry is a member name in the lookup table: its words, its length
// (0: an empty entry) and its id.
type entry struct {
	head, tail uint64
	n, id      uint8
}

// hashBits is log2 of hashSlots, twice a FieldSet's width so that a
// collision-free multiplier is found in a few tries.
const (
	hashBits  = 6
	hashSlots = 1 << hashBits
)

// slot is where a name of n bytes with words head and tail goes.
func (t *Table) slot(head, tail uint64, n int) int {
	x := head ^ tail*0xff51afd7ed558ccd ^ uint64(n)
	return int(x * t.mult >> (64 - hashBits))
}

// maxName is the longest member name a table takes: two words.
const maxName = 16

// nameWords packs a name of at most maxName bytes into two words that,
// for names of one length, are equal exactly when the names are: the
// first and the last 8 bytes (overlapping when shorter than 16), or for
// shorter names the first and the last 4, or the bytes themselves.
func nameWords(b []byte) (head, tail uint64) {
	switch n := len(b); {
	case n >= 8:
		return binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint64(b[n-8:])
	case n >= 4:
		return uint64(binary.LittleEndian.Uint32(b)), uint64(binary.LittleEndian.Uint32(b[n-4:]))
	}
	for i, c := range b {
		head |= uint64(c) << (8 * i)
	}
	return head, 0
}

// NewTable builds the table of specs, each at its id (keyed composite
// literals name the ids). prefix is what errors put before a
// member's name ("hash_profile." for hash_profile's members); copyStrings says
// strings are copied out of the body, for values that outlive the request.
// A malformed table is a programming error and panics.
func NewTable(prefix string, copyStrings bool, specs []Spec) *Table {
	t := &Table{n: len(specs), prefix: prefix, copy: copyStrings, keyField: strings.TrimSuffix(prefix, ".")}
	if len(specs) > len(t.specs) {
		panic("reqfields: more than 32 members do not fit a FieldSet")
	}
	copy(t.specs[:], specs)
	for id := range specs {
		f := &t.specs[id]
		f.field = prefix + f.Name
		if f.Name == "" || len(f.Name) > maxName {
			panic("reqfields: a member name must have 1 to 16 bytes: " + f.Name)
		}
		switch f.Shape {
		case Str, StrOrNil, OptStr:
			if f.Slot != NoSlot && int(f.Slot) >= len(Values{}.Str) || f.Limit >= numStrLimits {
				panic("reqfields: bad string slot or limit for " + f.Name)
			}
		case Int, OptInt, BlockSize:
			if f.Slot != NoSlot && int(f.Slot) >= len(Values{}.Int) {
				panic("reqfields: bad integer slot for " + f.Name)
			}
		}
	}
	// Odd multipliers from a fixed sequence until one places every name in
	// a slot of its own: deterministic, and found in a few tries.
	t.mult = 0x9e3779b97f4a7c15
	for try := 0; try < 1<<20; try++ {
		if t.place() {
			return t
		}
		t.mult += 0x6a09e667f3bcc908 // even: the multiplier stays odd
	}
	panic("reqfields: no collision-free hash for the table's names")
}

// place fills the lookup table under t.mult, reporting whether no two
// names collided.
func (t *Table) place() bool {
	t.slots = [hashSlots]entry{}
	for id := 0; id < t.n; id++ {
		name := []byte(t.specs[id].Name)
		head, tail := nameWords(name)
		e := &t.slots[t.slot(head, tail, len(name))]
		if e.n != 0 {
			if string(name) == t.specs[e.id].Name {
				panic("reqfields: member " + string(name) + " named twice")
			}
			return false
		}
		*e = entry{head, tail, uint8(len(name)), uint8(id)}
	}
	return true
}

// Lookup returns the id of member key, or false for a key the schema does
// not define.
func (t *Table) Lookup(key []byte) (id int, known bool) {
	if uint(len(key)-1) >= maxName { // empty (which an empty entry would match) or too long
		return 0, false
	}
	head, tail := nameWords(key)
	e := &t.slots[t.slot(head, tail, len(key))]
	if int(e.n) != len(key) || e.head != head || e.tail != tail {
		return 0, false
	}
	return int(e.id), true
}

// Field is the name errors give member id.
func (t *Table) Field(id int) string { return t.specs[id&31].field }

// Unknown is the error for a key the schema does not define.
func (t *Table) Unknown(key []byte) *Error {
	f := t.prefix + string(key)
	return Errorf(UnknownField, f, "unknown field %q", f)
}

// Done is what Next returns once the map has no members left.
const Done = -1

// Next reads the map's members, left of them still to read, until one
// with rules of its own: it returns that member's id, its value not yet
// read and the member not marked seen, for the schema to mark and read;
// Done when none are left; or the first error. Each other member is read
// here: an unknown key is unknown_field; the member is marked seen in
// seen (a repeat is refused before its value's type is looked at),
// checked by its shape and limit, and kept in v at its slot. On a checked
// cursor each key and each value read here is validated first; an Own
// member's value is the schema's to validate. The loop is here rather than
// in each schema so that a member costs no call of its own: /query's
// members cost what the hand-written switch did (BENCHMARKS.md).
func (t *Table) Next(c *Cursor, left *int, seen *FieldSet, v *Values, lim *ByteLimits) (id int, e *Error) {
	// left and seen are kept in registers and stored back on the way out
	// with a member or Done; after an error the decode is over.
	n, set := *left, *seen
	for ; n > 0; n-- {
		if e := c.Ahead(); e != nil {
			return 0, e
		}
		key, e := c.Key(t.keyField)
		if e != nil {
			return 0, e
		}
		if uint(len(key)-1) >= maxName { // empty (which an empty entry would match) or too long
			return 0, t.Unknown(key)
		}
		head, tail := nameWords(key) // Lookup, inline
		ent := &t.slots[t.slot(head, tail, len(key))]
		if int(ent.n) != len(key) || ent.head != head || ent.tail != tail {
			return 0, t.Unknown(key)
		}
		id := int(ent.id)
		f := &t.specs[id&31] // ids are below 32: no bounds check
		if f.Shape == Own {
			*left, *seen = n-1, set
			return id, nil
		}
		if e := c.Ahead(); e != nil {
			return 0, e
		}
		bit := FieldSet(1) << (id & 31)
		if set&bit != 0 {
			return 0, set.Mark(id, f.field) // the repeat's error
		}
		set |= bit
		switch f.Shape {
		case Str, StrOrNil, OptStr:
			if k := c.Kind(); k != msgp.Str {
				if k == msgp.Nil && f.Shape != Str {
					if e := c.NilValue(); e != nil {
						return 0, e
					}
					continue
				}
				if f.Shape == StrOrNil {
					return 0, Errorf(InvalidType, f.field, "%s must be a string or nil, got %s", f.field, k)
				}
			}
			str, e := c.StrView(f.field, lim[f.Limit])
			if e != nil {
				return 0, e
			}
			if t.copy {
				str = string([]byte(str))
			}
			v.Given |= bit
			if f.Slot != NoSlot {
				v.Str[f.Slot] = str
			}
		case Int, OptInt, BlockSize:
			var val int64
			switch {
			case f.Shape == OptInt && c.Kind() == msgp.Nil:
				if e := c.NilValue(); e != nil {
					return 0, e
				}
				continue
			case f.Shape == BlockSize:
				var b int
				b, e = c.BlockSize()
				val = int64(b)
			default:
				val, e = c.IntField(f.field, f.Min, f.Max)
			}
			if e != nil {
				return 0, e
			}
			v.Given |= bit
			if f.Slot != NoSlot {
				v.Int[f.Slot] = val
			}
		default:
			panic("reqfields: member " + f.Name + " has no shape")
		}
	}
	*left, *seen = 0, set
	return Done, nil
}
