package codec

import (
	"encoding/binary"
	"errors"
	"math"
)

// The request decoder reads MessagePack through a cursor over the body
// rather than through msgpack.Decoder: strict schemas need the exact wire
// type of every value before it is read (a float where an int belongs is
// invalid_type, not a conversion), string limits must be checked before a
// string is copied, and /query must not allocate per field. The body is
// validated as exactly one well-formed object first, so schema code never
// sees truncated input.

// kind is the family of a MessagePack value.
type kind uint8

const (
	kindInvalid kind = iota
	kindNil
	kindBool
	kindInt // signed or unsigned integer format
	kindFloat
	kindStr
	kindBin
	kindArray
	kindMap
	kindExt
)

func (k kind) String() string {
	return [...]string{"invalid", "nil", "bool", "integer", "float", "string", "binary", "array", "map", "extension"}[k]
}

func kindOf(c byte) kind {
	switch {
	case c <= 0x7f, c >= 0xe0:
		return kindInt
	case c <= 0x8f:
		return kindMap
	case c <= 0x9f:
		return kindArray
	case c <= 0xbf:
		return kindStr
	}
	switch c {
	case 0xc0:
		return kindNil
	case 0xc2, 0xc3:
		return kindBool
	case 0xc4, 0xc5, 0xc6:
		return kindBin
	case 0xc7, 0xc8, 0xc9, 0xd4, 0xd5, 0xd6, 0xd7, 0xd8:
		return kindExt
	case 0xca, 0xcb:
		return kindFloat
	case 0xcc, 0xcd, 0xce, 0xcf, 0xd0, 0xd1, 0xd2, 0xd3:
		return kindInt
	case 0xd9, 0xda, 0xdb:
		return kindStr
	case 0xdc, 0xdd:
		return kindArray
	case 0xde, 0xdf:
		return kindMap
	}
	return kindInvalid // 0xc1 is never used
}

var errMalformed = errors.New("malformed MessagePack")

// header decodes the value header at b[p:]: its kind, the payload length in
// bytes (for str, bin, ext, fixed-width numbers) or the element count (array,
// map), and the header size.
func header(b []byte, p int) (k kind, n uint64, hdr int, err error) {
	if p >= len(b) {
		return kindInvalid, 0, 0, errMalformed
	}
	c := b[p]
	k = kindOf(c)
	need := func(size int) bool { return p+size <= len(b) }
	switch {
	case c <= 0x7f || c >= 0xe0:
		return k, 0, 1, nil
	case c <= 0x8f:
		return k, uint64(c & 0x0f), 1, nil
	case c <= 0x9f:
		return k, uint64(c & 0x0f), 1, nil
	case c <= 0xbf:
		return k, uint64(c & 0x1f), 1, nil
	}
	switch c {
	case 0xc0, 0xc2, 0xc3:
		return k, 0, 1, nil
	case 0xc4, 0xd9:
		if !need(2) {
			return 0, 0, 0, errMalformed
		}
		return k, uint64(b[p+1]), 2, nil
	case 0xc5, 0xda, 0xdc, 0xde:
		if !need(3) {
			return 0, 0, 0, errMalformed
		}
		return k, uint64(binary.BigEndian.Uint16(b[p+1:])), 3, nil
	case 0xc6, 0xdb, 0xdd, 0xdf:
		if !need(5) {
			return 0, 0, 0, errMalformed
		}
		return k, uint64(binary.BigEndian.Uint32(b[p+1:])), 5, nil
	case 0xc7:
		if !need(3) {
			return 0, 0, 0, errMalformed
		}
		return k, uint64(b[p+1]) + 1, 2, nil
	case 0xc8:
		if !need(4) {
			return 0, 0, 0, errMalformed
		}
		return k, uint64(binary.BigEndian.Uint16(b[p+1:])) + 1, 3, nil
	case 0xc9:
		if !need(6) {
			return 0, 0, 0, errMalformed
		}
		return k, uint64(binary.BigEndian.Uint32(b[p+1:])) + 1, 5, nil
	case 0xca:
		return k, 4, 1, nil
	case 0xcb:
		return k, 8, 1, nil
	case 0xcc, 0xd0:
		return k, 1, 1, nil
	case 0xcd, 0xd1:
		return k, 2, 1, nil
	case 0xce, 0xd2:
		return k, 4, 1, nil
	case 0xcf, 0xd3:
		return k, 8, 1, nil
	case 0xd4:
		return k, 2, 1, nil
	case 0xd5:
		return k, 3, 1, nil
	case 0xd6:
		return k, 5, 1, nil
	case 0xd7:
		return k, 9, 1, nil
	case 0xd8:
		return k, 17, 1, nil
	}
	return kindInvalid, 0, 0, errMalformed
}

// scalarSize is the whole encoded size of every fixed-size scalar (integers,
// floats, nil, booleans, fixext) by its first byte, and 0 for every other
// value. validate steps over token arrays with it: a table lookup costs the
// same for every integer format, where a branch per format mispredicts on
// token ids whose formats interleave (fixint, uint16 and uint32 alternate
// across a 150K vocabulary).
var scalarSize = func() (t [256]uint8) {
	for c := 0; c < 256; c++ {
		switch {
		case c <= 0x7f, c >= 0xe0, c == 0xc0, c == 0xc2, c == 0xc3:
			t[c] = 1
		case c == 0xcc, c == 0xd0:
			t[c] = 2
		case c == 0xcd, c == 0xd1, c == 0xd4:
			t[c] = 3
		case c == 0xd5:
			t[c] = 4
		case c == 0xca, c == 0xce, c == 0xd2:
			t[c] = 5
		case c == 0xd6:
			t[c] = 6
		case c == 0xcb, c == 0xcf, c == 0xd3:
			t[c] = 9
		case c == 0xd7:
			t[c] = 10
		case c == 0xd8:
			t[c] = 18
		}
	}
	return t
}()

// validate reports whether b holds exactly one well-formed MessagePack
// object.
func validate(b []byte) error {
	if len(b) == 0 {
		return errMalformed
	}
	p, err := skip(b, 0)
	if err != nil {
		return err
	}
	if p != len(b) {
		return errors.New("trailing bytes after the MessagePack object")
	}
	return nil
}

// skip checks that b[p:] starts with one well-formed value and returns the
// position after it. It walks iteratively with a count of values still owed,
// so nesting depth costs nothing and a hostile body cannot overflow the
// stack.
func skip(b []byte, p int) (int, error) {
	owed := uint64(1)
	for owed > 0 {
		if p >= len(b) {
			return p, errMalformed
		}
		if s := int(scalarSize[b[p]]); s != 0 {
			p += s
			if p > len(b) {
				return p, errMalformed
			}
			owed--
			continue
		}
		k, n, hdr, err := header(b, p)
		if err != nil {
			return p, err
		}
		owed--
		p += hdr
		switch k {
		case kindArray:
			owed += n
		case kindMap:
			owed += 2 * n
		default:
			if n > uint64(len(b)-p) {
				return p, errMalformed
			}
			p += int(n)
		}
		// Every owed value takes at least one byte.
		if owed > uint64(len(b)-p) {
			return p, errMalformed
		}
	}
	return p, nil
}

// cursor reads values from a validated body. Its methods assume the value at
// the cursor has the kind the caller checked with peek.
//
// A checked cursor reads a body that was not validated as a whole: before
// each value it is about to read, the caller asks ahead() to validate just
// that value. /query decodes this way so its token array is walked once
// instead of twice; see DecodeQuery.
type cursor struct {
	b       []byte
	p       int
	checked bool
}

// errUnchecked ends a checked decode at the first malformed byte; the
// caller then decodes the body the validated way, which names the error.
var errUnchecked = &Error{Reason: InvalidMsgpack, Index: NoIndex, Msg: "malformed MessagePack"}

// ahead validates the next value when the cursor is checked.
func (c *cursor) ahead() *Error {
	if !c.checked {
		return nil
	}
	if _, err := skip(c.b, c.p); err != nil {
		return errUnchecked
	}
	return nil
}

func (c *cursor) peek() kind { return kindOf(c.b[c.p]) }

// length reads an array or map header.
func (c *cursor) length() int {
	_, n, hdr, _ := header(c.b, c.p)
	c.p += hdr
	return int(n)
}

// bytes reads a str or bin payload as a view into the body.
func (c *cursor) bytes() []byte {
	_, n, hdr, _ := header(c.b, c.p)
	start := c.p + hdr
	c.p = start + int(n)
	return c.b[start:c.p:c.p]
}

// payloadLen is the byte length of the str or bin at the cursor, read
// without consuming it so limits are checked before anything is copied.
func (c *cursor) payloadLen() int {
	_, n, _, _ := header(c.b, c.p)
	return int(n)
}

// integer reads any integer format. neg reports a negative value, in which
// case v holds it as int64 bits; otherwise v is the unsigned value.
func (c *cursor) integer() (v uint64, neg bool) {
	b := c.b[c.p:]
	t := b[0]
	switch {
	case t <= 0x7f:
		c.p++
		return uint64(t), false
	case t >= 0xe0:
		c.p++
		return uint64(int64(int8(t))), true
	}
	switch t {
	case 0xcc:
		c.p += 2
		return uint64(b[1]), false
	case 0xcd:
		c.p += 3
		return uint64(binary.BigEndian.Uint16(b[1:])), false
	case 0xce:
		c.p += 5
		return uint64(binary.BigEndian.Uint32(b[1:])), false
	case 0xcf:
		c.p += 9
		return binary.BigEndian.Uint64(b[1:]), false
	case 0xd0:
		c.p += 2
		s := int64(int8(b[1]))
		return uint64(s), s < 0
	case 0xd1:
		c.p += 3
		s := int64(int16(binary.BigEndian.Uint16(b[1:])))
		return uint64(s), s < 0
	case 0xd2:
		c.p += 5
		s := int64(int32(binary.BigEndian.Uint32(b[1:])))
		return uint64(s), s < 0
	case 0xd3:
		c.p += 9
		s := int64(binary.BigEndian.Uint64(b[1:]))
		return uint64(s), s < 0
	}
	panic("codec: integer called on a non-integer")
}

// int64Range reports whether an integer read by integer fits in int64.
func int64Range(v uint64, neg bool) (int64, bool) {
	if neg {
		return int64(v), true
	}
	if v > math.MaxInt64 {
		return 0, false
	}
	return int64(v), true
}
