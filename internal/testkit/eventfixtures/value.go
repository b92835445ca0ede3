package eventfixtures

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"unicode/utf16"
)

// The fixtures are built from a small value model that both encoders share,
// because the payload bytes and their JSON view in the manifest must say the
// same thing:
//
//	nil, bool, string, int/int64/uint64, float64  scalars
//	[]byte (as bin)                                MessagePack bin
//	slices of anything else                        arrays
//	omap                                           a map in insertion order
//	rawMap                                         a map written as ordered
//	                                               pairs (duplicate or
//	                                               non-string keys)
//
// Map order matters: it is the publishers' packing order, and the JSON files
// are compared byte for byte.

type kv struct {
	k string
	v any
}

// omap is a map with string keys that keeps insertion order.
type omap []kv

// m builds an omap from alternating keys and values.
func m(pairs ...any) omap {
	if len(pairs)%2 != 0 {
		panic("m: odd number of arguments")
	}
	o := make(omap, 0, len(pairs)/2)
	for i := 0; i < len(pairs); i += 2 {
		o = append(o, kv{pairs[i].(string), pairs[i+1]})
	}
	return o
}

// with returns a copy of o where each key/value pair replaces the value of
// an existing key in place or, for a new key, is appended: the order a dict
// update gives.
func (o omap) with(pairs ...any) omap {
	out := append(omap(nil), o...)
	for i := 0; i < len(pairs); i += 2 {
		k, v := pairs[i].(string), pairs[i+1]
		found := false
		for j := range out {
			if out[j].k == k {
				out[j].v, found = v, true
				break
			}
		}
		if !found {
			out = append(out, kv{k, v})
		}
	}
	return out
}

// without returns a copy of o without key k.
func (o omap) without(k string) omap {
	out := make(omap, 0, len(o))
	for _, e := range o {
		if e.k != k {
			out = append(out, e)
		}
	}
	return out
}

// rawMap is a map given as ordered pairs whose keys may repeat or be
// non-strings.
type rawMap [][2]any

// pyNaN is the NaN CPython's float("nan") produces; Go's math.NaN sets a
// different payload bit, and the payload bytes must match.
var pyNaN = math.Float64frombits(0x7ff8000000000000)

// packMsgpack encodes v with the smallest format for every integer, string,
// bin, array and map length and float64 for floats: the choices of Python's
// msgpack (use_bin_type=True), msgspec and msgpack-c alike.
func packMsgpack(v any) []byte {
	var b bytes.Buffer
	pack(&b, v)
	return b.Bytes()
}

func pack(b *bytes.Buffer, v any) {
	switch x := v.(type) {
	case nil:
		b.WriteByte(0xc0)
	case bool:
		if x {
			b.WriteByte(0xc3)
		} else {
			b.WriteByte(0xc2)
		}
	case int:
		packInt(b, int64(x))
	case int64:
		packInt(b, x)
	case uint64:
		packUint(b, x)
	case float64:
		b.WriteByte(0xcb)
		binary.Write(b, binary.BigEndian, math.Float64bits(x))
	case string:
		n := len(x)
		switch {
		case n < 32:
			b.WriteByte(0xa0 | byte(n))
		case n < 1<<8:
			b.Write([]byte{0xd9, byte(n)})
		case n < 1<<16:
			b.WriteByte(0xda)
			binary.Write(b, binary.BigEndian, uint16(n))
		default:
			b.WriteByte(0xdb)
			binary.Write(b, binary.BigEndian, uint32(n))
		}
		b.WriteString(x)
	case []byte:
		n := len(x)
		switch {
		case n < 1<<8:
			b.Write([]byte{0xc4, byte(n)})
		case n < 1<<16:
			b.WriteByte(0xc5)
			binary.Write(b, binary.BigEndian, uint16(n))
		default:
			b.WriteByte(0xc6)
			binary.Write(b, binary.BigEndian, uint32(n))
		}
		b.Write(x)
	case omap:
		packHead(b, len(x), 0x80, 0xde, 0xdf)
		for _, e := range x {
			pack(b, e.k)
			pack(b, e.v)
		}
	case rawMap:
		packHead(b, len(x), 0x80, 0xde, 0xdf)
		for _, p := range x {
			pack(b, p[0])
			pack(b, p[1])
		}
	default:
		rv := reflect.ValueOf(v)
		if rv.Kind() != reflect.Slice {
			panic(fmt.Sprintf("pack: unsupported %T", v))
		}
		packHead(b, rv.Len(), 0x90, 0xdc, 0xdd)
		for i := 0; i < rv.Len(); i++ {
			pack(b, rv.Index(i).Interface())
		}
	}
}

func packHead(b *bytes.Buffer, n int, fix, b16, b32 byte) {
	switch {
	case n < 16:
		b.WriteByte(fix | byte(n))
	case n < 1<<16:
		b.WriteByte(b16)
		binary.Write(b, binary.BigEndian, uint16(n))
	default:
		b.WriteByte(b32)
		binary.Write(b, binary.BigEndian, uint32(n))
	}
}

func packInt(b *bytes.Buffer, i int64) {
	switch {
	case i >= 0:
		packUint(b, uint64(i))
	case i >= -32:
		b.WriteByte(byte(i))
	case i >= math.MinInt8:
		b.Write([]byte{0xd0, byte(i)})
	case i >= math.MinInt16:
		b.WriteByte(0xd1)
		binary.Write(b, binary.BigEndian, int16(i))
	case i >= math.MinInt32:
		b.WriteByte(0xd2)
		binary.Write(b, binary.BigEndian, int32(i))
	default:
		b.WriteByte(0xd3)
		binary.Write(b, binary.BigEndian, i)
	}
}

func packUint(b *bytes.Buffer, u uint64) {
	switch {
	case u < 128:
		b.WriteByte(byte(u))
	case u < 1<<8:
		b.Write([]byte{0xcc, byte(u)})
	case u < 1<<16:
		b.WriteByte(0xcd)
		binary.Write(b, binary.BigEndian, uint16(u))
	case u < 1<<32:
		b.WriteByte(0xce)
		binary.Write(b, binary.BigEndian, uint32(u))
	default:
		b.WriteByte(0xcf)
		binary.Write(b, binary.BigEndian, u)
	}
}

// jsonView renders a payload for the manifest: bin becomes {"$bin": hex},
// a rawMap {"$pairs": [[k, v], …]} and NaN {"$float": "nan"}.
func jsonView(v any) any {
	switch x := v.(type) {
	case []byte:
		return m("$bin", hex.EncodeToString(x))
	case rawMap:
		pairs := make([]any, len(x))
		for i, p := range x {
			pairs[i] = []any{jsonView(p[0]), jsonView(p[1])}
		}
		return m("$pairs", pairs)
	case float64:
		if math.IsNaN(x) {
			return m("$float", "nan")
		}
		return x
	case omap:
		out := make(omap, len(x))
		for i, e := range x {
			out[i] = kv{e.k, jsonView(e.v)}
		}
		return out
	case nil, bool, string, int, int64, uint64:
		return v
	}
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Slice {
		panic(fmt.Sprintf("jsonView: unsupported %T", v))
	}
	out := make([]any, rv.Len())
	for i := range out {
		out[i] = jsonView(rv.Index(i).Interface())
	}
	return out
}

// marshalJSON writes v the way the fixture files have always been laid
// out: one-space indentation, one value per line, ", " never used, "": "
// after keys, non-ASCII escaped as \uXXXX, a trailing newline.
func marshalJSON(v any) []byte {
	var b bytes.Buffer
	writeJSON(&b, v, 0)
	b.WriteByte('\n')
	return b.Bytes()
}

func writeJSON(b *bytes.Buffer, v any, level int) {
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(x))
	case string:
		writeJSONString(b, x)
	case int:
		b.WriteString(strconv.Itoa(x))
	case int64:
		b.WriteString(strconv.FormatInt(x, 10))
	case uint64:
		b.WriteString(strconv.FormatUint(x, 10))
	case float64:
		b.WriteString(pyFloat(x))
	case omap:
		if len(x) == 0 {
			b.WriteString("{}")
			return
		}
		b.WriteString("{")
		for i, e := range x {
			if i > 0 {
				b.WriteByte(',')
			}
			newline(b, level+1)
			writeJSONString(b, e.k)
			b.WriteString(": ")
			writeJSON(b, e.v, level+1)
		}
		newline(b, level)
		b.WriteString("}")
	default:
		rv := reflect.ValueOf(v)
		if rv.Kind() != reflect.Slice {
			panic(fmt.Sprintf("writeJSON: unsupported %T", v))
		}
		if rv.Len() == 0 {
			b.WriteString("[]")
			return
		}
		b.WriteString("[")
		for i := 0; i < rv.Len(); i++ {
			if i > 0 {
				b.WriteByte(',')
			}
			newline(b, level+1)
			writeJSON(b, rv.Index(i).Interface(), level+1)
		}
		newline(b, level)
		b.WriteString("]")
	}
}

func newline(b *bytes.Buffer, level int) {
	b.WriteByte('\n')
	for i := 0; i < level; i++ {
		b.WriteByte(' ')
	}
}

func writeJSONString(b *bytes.Buffer, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			switch {
			case r < 0x20 || (r >= 0x7f && r < 0x10000):
				fmt.Fprintf(b, `\u%04x`, r)
			case r >= 0x10000:
				hi, lo := utf16.EncodeRune(r)
				fmt.Fprintf(b, `\u%04x\u%04x`, hi, lo)
			default:
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}

// pyFloat formats a finite float as Python's repr does for the magnitudes
// the fixtures use: shortest round-trip digits, ".0" on integral values.
func pyFloat(f float64) string {
	if math.IsNaN(f) || math.IsInf(f, 0) || math.Abs(f) >= 1e16 || (f != 0 && math.Abs(f) < 1e-4) {
		panic(fmt.Sprintf("pyFloat: %v is outside the supported range", f))
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if f == math.Trunc(f) {
		s += ".0"
	}
	return s
}
