package reqfields

import (
	"github.com/mooncake-conductor-go/conductor/internal/msgp"
)

// Most members of a request map are one of a few shapes (a string under a
// byte limit, a string or nil, an integer in a range, block_size) read,
// type-checked and bounded the same way whatever the body. Each schema
// therefore describes its members in a Table (name, shape, limit, where
// the value goes) and one reader, Table.Read, serves them all, as
// internal/events does for event keys; members with rules of their own
// (token_ids, the hash lists, hash_profile, kv_cache_groups) have the
// shape Own and are read by the schema's code, dispatched from the same
// table by their id.

// Shape is how a member's value is read, type-checked and bounded.
type Shape uint8

const (
	// Own: read by the schema itself; Read reports it without marking it
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

// Table is one schema's members. Keys are looked up by length first, then
// compared: no hashing, and each length has one to three candidates.
type Table struct {
	specs  []Spec
	prefix string
	copy   bool
	byLen  [32][]uint8
}

// NewTable builds the table of specs, each at its id (keyed composite
// literals name the ids). prefix is what errors put before a
// member's name ("hash_profile." for hash_profile's members); copy says
// strings are copied out of the body, for values that outlive the request.
// A malformed table is a programming error and panics.
func NewTable(prefix string, copy bool, specs []Spec) *Table {
	if len(specs) > 32 {
		panic("reqfields: more than 32 members do not fit a FieldSet")
	}
	t := &Table{specs: specs, prefix: prefix, copy: copy}
	for id := range t.specs {
		f := &t.specs[id]
		f.field = prefix + f.Name
		if len(f.Name) >= len(t.byLen) {
			panic("reqfields: member name too long for the table: " + f.Name)
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
		t.byLen[len(f.Name)] = append(t.byLen[len(f.Name)], uint8(id))
	}
	return t
}

// Lookup returns the id of member key, or false for a key the schema does
// not define.
func (t *Table) Lookup(key []byte) (id int, known bool) {
	if len(key) >= len(t.byLen) {
		return 0, false
	}
	for _, id := range t.byLen[len(key)] {
		if t.specs[id].Name == string(key) {
			return int(id), true
		}
	}
	return 0, false
}

// Field is the name errors give member id.
func (t *Table) Field(id int) string { return t.specs[id].field }

// Unknown is the error for a key the schema does not define.
func (t *Table) Unknown(key []byte) *Error {
	f := t.prefix + string(key)
	return Errorf(UnknownField, f, "unknown field %q", f)
}

// Read reads the value of member key: an unknown key is unknown_field; an
// Own member is only reported (own true), for the schema to mark and
// read; any other is marked seen in seen (a repeat is refused before its
// value's type is looked at), checked by its shape and limit, and kept in
// v at its slot.
func (t *Table) Read(c *Cursor, key []byte, seen *FieldSet, v *Values, lim *ByteLimits) (id int, own bool, e *Error) {
	id, known := t.Lookup(key)
	if !known {
		return 0, false, t.Unknown(key)
	}
	f := &t.specs[id]
	if f.Shape == Own {
		return id, true, nil
	}
	if e = seen.Mark(id, f.field); e != nil {
		return id, false, e
	}
	switch f.Shape {
	case StrOrNil:
		if k := c.Kind(); k != msgp.Str {
			if k == msgp.Nil {
				return id, false, c.NilValue()
			}
			return id, false, Errorf(InvalidType, f.field, "%s must be a string or nil, got %s", f.field, k)
		}
		return id, false, t.str(c, id, f, v, lim)
	case OptStr:
		if c.Kind() == msgp.Nil {
			return id, false, c.NilValue()
		}
		return id, false, t.str(c, id, f, v, lim)
	case Str:
		return id, false, t.str(c, id, f, v, lim)
	case OptInt:
		if c.Kind() == msgp.Nil {
			return id, false, c.NilValue()
		}
		fallthrough
	case Int:
		n, e := c.IntField(f.field, f.Min, f.Max)
		if e == nil {
			v.keepInt(id, f, n)
		}
		return id, false, e
	case BlockSize:
		n, e := c.BlockSize()
		if e == nil {
			v.keepInt(id, f, int64(n))
		}
		return id, false, e
	}
	panic("reqfields: member " + f.Name + " has no shape")
}

func (t *Table) str(c *Cursor, id int, f *Spec, v *Values, lim *ByteLimits) *Error {
	s, e := c.StrView(f.field, lim[f.Limit])
	if e != nil {
		return e
	}
	if t.copy {
		s = string([]byte(s))
	}
	v.Given |= 1 << id
	if f.Slot != NoSlot {
		v.Str[f.Slot] = s
	}
	return nil
}

func (v *Values) keepInt(id int, f *Spec, n int64) {
	v.Given |= 1 << id
	if f.Slot != NoSlot {
		v.Int[f.Slot] = n
	}
}
