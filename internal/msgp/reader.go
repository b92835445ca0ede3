package msgp

import (
	"encoding/binary"
	"math"
)

// Reader reads a payload that was not validated beforehand, one value at a
// time, checking every length against the bytes left: event batches are
// decoded this way because a malformed tail must reject the batch only
// after the events before it were read. Strings are views into the
// payload; nothing is copied or allocated.
type Reader struct {
	buf []byte
	p   int
}

// Reset starts reading b.
func (r *Reader) Reset(b []byte) { r.buf, r.p = b, 0 }

// Pos is the offset of the next value.
func (r *Reader) Pos() int { return r.p }

// Remaining is the number of bytes not read yet.
func (r *Reader) Remaining() int { return len(r.buf) - r.p }

// Peek returns the kind of the next value without consuming it.
func (r *Reader) Peek() (Kind, error) {
	if r.p >= len(r.buf) {
		return Invalid, ErrMalformed
	}
	return kinds[r.buf[r.p]], nil
}

// Skip steps over the next value, however deeply nested.
func (r *Reader) Skip() error {
	p, err := Skip(r.buf, r.p)
	if err != nil {
		return err
	}
	r.p = p
	return nil
}

// Nil consumes a nil.
func (r *Reader) Nil() error {
	if r.p >= len(r.buf) || r.buf[r.p] != 0xc0 {
		return ErrMalformed
	}
	r.p++
	return nil
}

// ArrayLen reads an array header and returns its element count.
func (r *Reader) ArrayLen() (int, error) { return r.length(Array) }

// MapLen reads a map header and returns its entry count.
func (r *Reader) MapLen() (int, error) { return r.length(Map) }

func (r *Reader) length(want Kind) (int, error) {
	k, n, hdr, err := Header(r.buf, r.p)
	if err != nil || k != want {
		return 0, ErrMalformed
	}
	r.p += hdr
	return int(n), nil
}

// Str reads a str or bin value as a view into the payload.
func (r *Reader) Str() ([]byte, error) {
	k, n, hdr, err := Header(r.buf, r.p)
	if err != nil || (k != Str && k != Bin) || n > uint64(len(r.buf)-r.p-hdr) {
		return nil, ErrMalformed
	}
	start := r.p + hdr
	r.p = start + int(n)
	return r.buf[start:r.p:r.p], nil
}

// Float reads a float32 or float64 value.
func (r *Reader) Float() (float64, error) {
	b := r.buf[r.p:]
	switch {
	case len(b) >= 5 && b[0] == 0xca:
		r.p += 5
		return float64(math.Float32frombits(binary.BigEndian.Uint32(b[1:]))), nil
	case len(b) >= 9 && b[0] == 0xcb:
		r.p += 9
		return math.Float64frombits(binary.BigEndian.Uint64(b[1:])), nil
	}
	return 0, ErrMalformed
}

// Integer reads an integer of any format; see IntAt for v and neg.
func (r *Reader) Integer() (v uint64, neg bool, err error) {
	if r.p >= len(r.buf) {
		return 0, false, ErrMalformed
	}
	v, neg, size := IntAt(r.buf, r.p)
	if size == 0 {
		return 0, false, ErrMalformed
	}
	r.p += size
	return v, neg, nil
}

// Int32Run consumes up to max consecutive integers; see ScanInt32Run.
func (r *Reader) Int32Run(max int) (n int, inRange bool) {
	r.p, n, inRange = ScanInt32Run(r.buf, r.p, max)
	return n, inRange
}

// Bytes is the whole payload being read.
func (r *Reader) Bytes() []byte { return r.buf }

// SetPos moves to offset p of the payload (a position Pos returned, or
// one past values the caller measured itself, as the token memo does).
func (r *Reader) SetPos(p int) { r.p = p }

// Kind is the kind of the next value, Invalid at the end of the payload:
// for schema code that switches on it, in a payload validated beforehand
// or whose next value CheckNext has checked.
func (r *Reader) Kind() Kind {
	if r.p >= len(r.buf) {
		return Invalid
	}
	return kinds[r.buf[r.p]]
}

// PeekHeader decodes the next value's header without consuming it; see
// Header.
func (r *Reader) PeekHeader() (k Kind, n uint64, hdr int, err error) {
	if r.p >= len(r.buf) {
		return Invalid, 0, 0, ErrMalformed
	}
	return Header(r.buf, r.p)
}

// CheckNext reports whether the next value is well formed, however deeply
// nested, without consuming it.
func (r *Reader) CheckNext() error {
	_, err := Skip(r.buf, r.p)
	return err
}

// TokenRun decodes token ids into dst from index i with DecodeTokenRun's
// fast loops and returns the index it stopped at, the reader moved past
// the ids it took.
func (r *Reader) TokenRun(dst []int32, i int) int {
	r.p, i = DecodeTokenRun(r.buf, r.p, dst, i)
	return i
}
