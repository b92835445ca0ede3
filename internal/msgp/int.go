package msgp

import (
	"encoding/binary"
	"math"
)

// IntAt decodes the integer whose first byte is b[p] and returns its
// encoded size, or size 0 when b[p] starts no integer or the value is cut
// short. neg reports a negative value, whose int64 bits v then holds;
// otherwise v is the unsigned value, whatever the format (a signed format
// may carry a positive value).
func IntAt(b []byte, p int) (v uint64, neg bool, size int) {
	c := b[p]
	switch {
	case c <= 0x7f:
		return uint64(c), false, 1
	case c >= 0xe0:
		return uint64(int64(int8(c))), true, 1
	}
	var n int
	switch c {
	case 0xcc, 0xd0:
		n = 2
	case 0xcd, 0xd1:
		n = 3
	case 0xce, 0xd2:
		n = 5
	case 0xcf, 0xd3:
		n = 9
	default:
		return 0, false, 0
	}
	if p+n > len(b) {
		return 0, false, 0
	}
	q := b[p+1 : p+n]
	var s int64
	switch c {
	case 0xcc:
		return uint64(q[0]), false, n
	case 0xcd:
		return uint64(binary.BigEndian.Uint16(q)), false, n
	case 0xce:
		return uint64(binary.BigEndian.Uint32(q)), false, n
	case 0xcf:
		return binary.BigEndian.Uint64(q), false, n
	case 0xd0:
		s = int64(int8(q[0]))
	case 0xd1:
		s = int64(int16(binary.BigEndian.Uint16(q)))
	case 0xd2:
		s = int64(int32(binary.BigEndian.Uint32(q)))
	default: // 0xd3
		s = int64(binary.BigEndian.Uint64(q))
	}
	return uint64(s), s < 0, n
}

// Int64Range reports whether an integer read by IntAt fits in int64, and
// returns it as one.
func Int64Range(v uint64, neg bool) (int64, bool) {
	if neg {
		return int64(v), true
	}
	if v > math.MaxInt64 {
		return 0, false
	}
	return int64(v), true
}

// Int32Range reports whether an integer read by IntAt fits in int32.
func Int32Range(v uint64, neg bool) bool {
	if neg {
		return int64(v) >= math.MinInt32
	}
	return v <= math.MaxInt32
}
