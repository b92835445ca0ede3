package codec

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"strconv"
)

// AppendJSON appends the JSON form of a response body this package
// encoded: the same shape, with map entries in the same order. It is how
// the read-only endpoints answer a client that asks for JSON (curl, a
// browser) without a second set of encoders that could drift from the
// MessagePack ones. It takes the formats the encoders here write (maps,
// arrays, strings, integers, nil, booleans) and rejects anything else.
func AppendJSON(dst, src []byte) ([]byte, error) {
	dst, p, err := appendJSONValue(dst, src, 0)
	if err == nil && p != len(src) {
		err = errors.New("trailing bytes after the value")
	}
	return dst, err
}

var errJSONInput = errors.New("not a response this package encodes")

func appendJSONValue(dst, b []byte, p int) ([]byte, int, error) {
	if p >= len(b) {
		return dst, p, errJSONInput
	}
	c := b[p]
	// n reads a big-endian length of size bytes after the type byte.
	n := func(size int) (int, bool) {
		if p+1+size > len(b) {
			return 0, false
		}
		switch size {
		case 1:
			return int(b[p+1]), true
		case 2:
			return int(binary.BigEndian.Uint16(b[p+1:])), true
		}
		return int(binary.BigEndian.Uint32(b[p+1:])), true
	}
	switch {
	case c <= 0x7f:
		return strconv.AppendInt(dst, int64(c), 10), p + 1, nil
	case c >= 0xe0:
		return strconv.AppendInt(dst, int64(int8(c)), 10), p + 1, nil
	case c <= 0x8f:
		return appendJSONContainer(dst, b, p+1, int(c&0x0f), true)
	case c <= 0x9f:
		return appendJSONContainer(dst, b, p+1, int(c&0x0f), false)
	case c <= 0xbf:
		return appendJSONString(dst, b, p+1, int(c&0x1f))
	}
	sizes := map[byte]int{0xd9: 1, 0xda: 2, 0xdb: 4, 0xdc: 2, 0xdd: 4, 0xde: 2, 0xdf: 4}
	switch c {
	case 0xc0:
		return append(dst, "null"...), p + 1, nil
	case 0xc2:
		return append(dst, "false"...), p + 1, nil
	case 0xc3:
		return append(dst, "true"...), p + 1, nil
	case 0xcc, 0xcd, 0xce, 0xcf, 0xd0, 0xd1, 0xd2, 0xd3:
		size := 1 << ((c - 0xcc) & 3)
		if p+1+size > len(b) {
			return dst, p, errJSONInput
		}
		var v uint64
		for _, x := range b[p+1 : p+1+size] {
			v = v<<8 | uint64(x)
		}
		if c >= 0xd0 { // signed: sign-extend from size bytes
			shift := 64 - 8*uint(size)
			return strconv.AppendInt(dst, int64(v<<shift)>>shift, 10), p + 1 + size, nil
		}
		return strconv.AppendUint(dst, v, 10), p + 1 + size, nil
	case 0xd9, 0xda, 0xdb:
		l, ok := n(sizes[c])
		if !ok {
			return dst, p, errJSONInput
		}
		return appendJSONString(dst, b, p+1+sizes[c], l)
	case 0xdc, 0xdd, 0xde, 0xdf:
		l, ok := n(sizes[c])
		if !ok {
			return dst, p, errJSONInput
		}
		return appendJSONContainer(dst, b, p+1+sizes[c], l, c >= 0xde)
	}
	return dst, p, errJSONInput
}

func appendJSONString(dst, b []byte, p, n int) ([]byte, int, error) {
	if p+n > len(b) {
		return dst, p, errJSONInput
	}
	q, err := json.Marshal(string(b[p : p+n]))
	if err != nil {
		return dst, p, err
	}
	return append(dst, q...), p + n, nil
}

// appendJSONContainer writes n array elements, or n map entries whose keys
// must be strings.
func appendJSONContainer(dst, b []byte, p, n int, isMap bool) ([]byte, int, error) {
	open, end := byte('['), byte(']')
	if isMap {
		open, end = '{', '}'
	}
	dst = append(dst, open)
	var err error
	for i := range n {
		if i > 0 {
			dst = append(dst, ',')
		}
		if isMap {
			if p >= len(b) || !(b[p] >= 0xa0 && b[p] <= 0xbf || b[p] >= 0xd9 && b[p] <= 0xdb) {
				return dst, p, errJSONInput
			}
			if dst, p, err = appendJSONValue(dst, b, p); err != nil {
				return dst, p, err
			}
			dst = append(dst, ':')
		}
		if dst, p, err = appendJSONValue(dst, b, p); err != nil {
			return dst, p, err
		}
	}
	return append(dst, end), p, nil
}
