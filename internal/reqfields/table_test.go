package reqfields

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vmihailenco/msgpack/v5"
)

// TestTableNext: the one reader's rules for each shape, as the request
// schemas rely on them: a repeated member is refused before its value is
// looked at, each shape's type check and limit, nil where a shape allows
// it, where the value is kept, and an Own member reported unmarked.
func TestTableNext(t *testing.T) {
	tab := NewTable("p.", false, []Spec{
		0: {Name: "s", Shape: Str, Limit: IdentityBytes, Slot: 0},
		1: {Name: "sn", Shape: StrOrNil, Limit: NameBytes, Slot: 1},
		2: {Name: "os", Shape: OptStr, Limit: IdentityBytes, Slot: 2},
		3: {Name: "i", Shape: Int, Min: 1, Max: 10, Slot: 0},
		4: {Name: "oi", Shape: OptInt, Min: 0, Max: 5, Slot: NoSlot},
		5: {Name: "block_size", Shape: BlockSize, Slot: 1},
		6: {Name: "own", Shape: Own},
	})
	lims := ByteLimits{IdentityBytes: 3, NameBytes: 5}
	type result struct {
		Err   *Error
		Own   bool
		Str   [8]string
		Int   [4]int64
		Given FieldSet
	}
	for _, tc := range []struct {
		name  string
		pairs []any // key, value, key, value...
		want  result
	}{
		{"strings kept", []any{"s", "abc", "sn", "abcde", "os", "x"},
			result{Str: [8]string{"abc", "abcde", "x"}, Given: 0b111}},
		{"string over its limit", []any{"s", "abcd"},
			result{Err: &Error{OutOfRange, "p.s", NoIndex, "p.s is 4 bytes, the limit is 3"}}},
		{"string or nil: nil reads as empty, not given", []any{"sn", nil},
			result{}},
		{"string or nil: wrong type in its words", []any{"sn", 1},
			result{Err: &Error{InvalidType, "p.sn", NoIndex, "p.sn must be a string or nil, got integer"}}},
		{"optional string: wrong type as a string", []any{"os", 1},
			result{Err: &Error{InvalidType, "p.os", NoIndex, "p.os must be a string, got integer"}}},
		{"string: nil is the wrong type", []any{"s", nil},
			result{Err: &Error{InvalidType, "p.s", NoIndex, "p.s must be a string, got nil"}}},
		{"integers kept, an optional one checked only", []any{"i", 10, "oi", 5, "block_size", 16},
			result{Int: [4]int64{10, 16}, Given: 0b111000}},
		{"integer out of range", []any{"i", 0},
			result{Err: &Error{OutOfRange, "p.i", NoIndex, "p.i must be in [1, 10]"}}},
		{"optional integer nil", []any{"oi", nil}, result{}},
		{"optional integer: wrong type", []any{"oi", "1"},
			result{Err: &Error{InvalidType, "p.oi", NoIndex, "p.oi must be an integer, got string"}}},
		{"block_size zero", []any{"block_size", 0},
			result{Err: &Error{InvalidValue, "block_size", NoIndex, "block_size must be positive"}}},
		{"repeat refused before the type check", []any{"i", 2, "i", "x"},
			result{Int: [4]int64{2}, Given: 0b1000, Err: &Error{InvalidValue, "p.i", NoIndex, "p.i appears more than once"}}},
		{"own reported, not marked, then the rest read", []any{"own", 1, "s", "a"},
			result{Own: true, Str: [8]string{"a"}, Given: 0b1}},
		{"key not a string", []any{1, 1},
			result{Err: &Error{InvalidType, "p", NoIndex, "map keys must be strings, got integer"}}},
		{"unknown", []any{"zz", 1},
			result{Err: &Error{UnknownField, "p.zz", NoIndex, `unknown field "p.zz"`}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var body []byte
			for i := 0; i < len(tc.pairs); i += 2 {
				k, _ := msgpack.Marshal(tc.pairs[i])
				v, _ := msgpack.Marshal(tc.pairs[i+1])
				body = append(append(body, k...), v...)
			}
			body = append([]byte{0x80 | byte(len(tc.pairs)/2)}, body...)
			c, n, e := Open(body)
			if e != nil {
				t.Fatal(e)
			}
			var seen FieldSet
			var v Values
			var got result
			for got.Err == nil {
				id, e := tab.Next(&c, &n, &seen, &v, &lims)
				got.Err = e
				if e != nil || id == Done {
					break
				}
				got.Own = true
				if seen.Has(id) {
					t.Error("an Own member was marked seen")
				}
				if err := c.Skip(); err != nil {
					t.Fatal(err)
				}
			}
			got.Str, got.Int, got.Given = v.Str, v.Int, v.Given
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestNewTableRefuses: a table that cannot be read (a slot past Values, a
// name too long to index) is a programming error, caught when the table
// is built.
func TestNewTableRefuses(t *testing.T) {
	for name, specs := range map[string][]Spec{
		"string slot":  {{Name: "a", Shape: Str, Slot: 8}},
		"integer slot": {{Name: "a", Shape: Int, Slot: 4}},
		"limit":        {{Name: "a", Shape: Str, Limit: numStrLimits}},
		"long name":    {{Name: string(make([]byte, maxName+1)), Shape: Own}},
		"empty name":   {{Name: "", Shape: Own}},
		"named twice":  {{Name: "a", Shape: Own}, {Name: "a", Shape: Own}},
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Error("NewTable accepted the table")
				}
			}()
			NewTable("", false, specs)
		})
	}
}

// TestTableLookup: every name of a table finds its own id, whatever its
// length (the word packing has three cases), and a key one byte off, one
// byte short or one byte long finds nothing.
func TestTableLookup(t *testing.T) {
	var specs []Spec
	for _, name := range []string{"a", "ab", "abc", "abcd", "abce", "lora_id", "tenant_id", "lora_name",
		"token_ids", "block_size", "cache_salt", "instance_id", "replay_endpoint", "kv_cache_groups",
		"python_hash_seed", "index_projection"} {
		specs = append(specs, Spec{Name: name, Shape: Own})
	}
	tab := NewTable("", false, specs)
	for id, f := range specs {
		if got, ok := tab.Lookup([]byte(f.Name)); !ok || got != id {
			t.Errorf("Lookup(%q) = %d, %v; want %d", f.Name, got, ok, id)
		}
		near := [][]byte{[]byte(f.Name[:len(f.Name)-1]), []byte(f.Name + "x")}
		for i := range f.Name {
			k := []byte(f.Name)
			k[i] ^= 0x20
			near = append(near, k)
		}
		for _, k := range near {
			if got, ok := tab.Lookup(k); ok && specs[got].Name != string(k) {
				t.Errorf("Lookup(%q) found %q", k, specs[got].Name)
			}
		}
	}
}

// TestTableFull: a table of as many members as a FieldSet holds gets a
// collision-free hash, and each name finds its id.
func TestTableFull(t *testing.T) {
	specs := make([]Spec, 32)
	for i := range specs {
		specs[i] = Spec{Name: fmt.Sprintf("member_%02d", i), Shape: Own}
	}
	tab := NewTable("", false, specs)
	for id, f := range specs {
		if got, ok := tab.Lookup([]byte(f.Name)); !ok || got != id {
			t.Errorf("Lookup(%q) = %d, %v; want %d", f.Name, got, ok, id)
		}
	}
}
