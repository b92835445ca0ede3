package msgp

import (
	"encoding/binary"
	"errors"
)

// ErrMalformed is every failure to read: a truncated value, a length past
// the end, the unused type byte 0xc1, or trailing bytes after one object.
var ErrMalformed = errors.New("malformed MessagePack")

// Header decodes the value header at b[p:]: its kind, the payload length in
// bytes (for str, bin, ext, fixed-width numbers) or the element count (array,
// map), and the header size.
func Header(b []byte, p int) (k Kind, n uint64, hdr int, err error) {
	if p >= len(b) {
		return Invalid, 0, 0, ErrMalformed
	}
	c := b[p]
	k = KindOf(c)
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
			return 0, 0, 0, ErrMalformed
		}
		return k, uint64(b[p+1]), 2, nil
	case 0xc5, 0xda, 0xdc, 0xde:
		if !need(3) {
			return 0, 0, 0, ErrMalformed
		}
		return k, uint64(binary.BigEndian.Uint16(b[p+1:])), 3, nil
	case 0xc6, 0xdb, 0xdd, 0xdf:
		if !need(5) {
			return 0, 0, 0, ErrMalformed
		}
		return k, uint64(binary.BigEndian.Uint32(b[p+1:])), 5, nil
	case 0xc7:
		if !need(3) {
			return 0, 0, 0, ErrMalformed
		}
		return k, uint64(b[p+1]) + 1, 2, nil
	case 0xc8:
		if !need(4) {
			return 0, 0, 0, ErrMalformed
		}
		return k, uint64(binary.BigEndian.Uint16(b[p+1:])) + 1, 3, nil
	case 0xc9:
		if !need(6) {
			return 0, 0, 0, ErrMalformed
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
	return Invalid, 0, 0, ErrMalformed
}

// ScalarSize is the whole encoded size of every fixed-size scalar (integers,
// floats, nil, booleans, fixext) by its first byte, and 0 for every other
// value. Skip steps over token arrays with it: a table lookup costs the
// same for every integer format, where a branch per format mispredicts on
// token ids whose formats interleave (fixint, uint16 and uint32 alternate
// across a 150K vocabulary).
var ScalarSize = func() (t [256]uint8) {
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

// Validate reports whether b holds exactly one well-formed MessagePack
// object.
func Validate(b []byte) error {
	if len(b) == 0 {
		return ErrMalformed
	}
	p, err := Skip(b, 0)
	if err != nil {
		return err
	}
	if p != len(b) {
		return errTrailing
	}
	return nil
}

// Skip checks that b[p:] starts with one well-formed value and returns the
// position after it. It walks iteratively with a count of values still owed,
// so nesting depth costs nothing and a hostile body cannot overflow the
// stack.
func Skip(b []byte, p int) (int, error) {
	owed := uint64(1)
	for owed > 0 {
		if p >= len(b) {
			return p, ErrMalformed
		}
		if s := int(ScalarSize[b[p]]); s != 0 {
			p += s
			if p > len(b) {
				return p, ErrMalformed
			}
			owed--
			continue
		}
		k, n, hdr, err := Header(b, p)
		if err != nil {
			return p, err
		}
		owed--
		p += hdr
		switch k {
		case Array:
			owed += n
		case Map:
			owed += 2 * n
		default:
			if n > uint64(len(b)-p) {
				return p, ErrMalformed
			}
			p += int(n)
		}
		// Every owed value takes at least one byte.
		if owed > uint64(len(b)-p) {
			return p, ErrMalformed
		}
	}
	return p, nil
}

// errTrailing keeps its own text: codec puts it in the error message.
var errTrailing = errors.New("trailing bytes after the MessagePack object")
