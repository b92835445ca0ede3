package codec

import (
	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/msgp"
	"github.com/mooncake-conductor-go/conductor/registry"
)

// kv_cache_groups is an extension of /register that upstream routers never
// send (docs/hybrid.md#declaration): an array, by group index, of
// {kind, block_size, sliding_window?, chunk_size?}. The schema is checked
// here, with the offending element's index; the rules are the registry's.

const (
	kgKind = iota
	kgBlockSize
	kgWindow
	kgChunk
)

const groupsField = "kv_cache_groups"

func decodeGroups(c *cursor, lim Limits) ([]registry.GroupDecl, *Error) {
	if k := c.Kind(); k != msgp.Array {
		return nil, Errorf(InvalidType, groupsField, "kv_cache_groups must be an array, got %s", k)
	}
	n, err := c.ArrayLen()
	if err != nil {
		return nil, errUnchecked
	}
	if n > index.MaxGroups {
		return nil, Errorf(OutOfRange, groupsField, "kv_cache_groups has %d groups, the limit is %d", n, index.MaxGroups)
	}
	out := make([]registry.GroupDecl, n)
	for i := range out {
		if k := c.Kind(); k != msgp.Map {
			return nil, elemErrorf(InvalidType, groupsField, i, "a group must be a map, got %s", k)
		}
		m, err := c.MapLen()
		if err != nil {
			return nil, errUnchecked
		}
		var seen fieldSet
		d := &out[i]
		for j := 0; j < m; j++ {
			k, e := c.key(groupsField)
			if e != nil {
				e.Index = i
				return nil, e
			}
			var v int64
			switch string(k) {
			case "kind":
				if e = seen.mark(kgKind, groupsField+".kind"); e == nil {
					d.Kind, e = c.str(groupsField+".kind", lim.MaxIdentityBytes)
				}
			case "block_size":
				if e = seen.mark(kgBlockSize, groupsField+".block_size"); e == nil {
					v, e = c.intField(groupsField+".block_size", 1, registry.MaxGroupTokens)
					d.BlockSize = int(v)
				}
			case "sliding_window":
				if e = seen.mark(kgWindow, groupsField+".sliding_window"); e == nil && !c.skipNil(&e) {
					v, e = c.intField(groupsField+".sliding_window", 1, registry.MaxGroupTokens)
					d.SlidingWindow = int(v)
				}
			case "chunk_size":
				if e = seen.mark(kgChunk, groupsField+".chunk_size"); e == nil && !c.skipNil(&e) {
					v, e = c.intField(groupsField+".chunk_size", 1, registry.MaxGroupTokens)
					d.ChunkSize = int(v)
				}
			default:
				f := groupsField + "." + string(k)
				return nil, elemErrorf(UnknownField, f, i, "unknown field %q", f)
			}
			if e != nil {
				e.Index = i
				return nil, e
			}
		}
		for _, req := range []struct {
			bit   int
			field string
		}{{kgKind, "kind"}, {kgBlockSize, "block_size"}} {
			if !seen.has(req.bit) {
				return nil, elemErrorf(Missing, groupsField+"."+req.field, i, "%s.%s is required", groupsField, req.field)
			}
		}
	}
	return out, nil
}

// skipNil consumes a nil value and reports whether there was one (*e set
// when it could not be read).
func (c *cursor) skipNil(e **Error) bool {
	if c.Kind() == msgp.Nil {
		*e = c.nilValue()
		return true
	}
	return false
}
