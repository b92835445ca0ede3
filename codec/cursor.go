package codec

import (
	"github.com/mooncake-conductor-go/conductor/internal/msgp"
)

// The request decoder reads MessagePack through a cursor over the body
// rather than through msgpack.Decoder: strict schemas need the exact wire
// type of every value before it is read (a float where an int belongs is
// invalid_type, not a conversion), string limits must be checked before a
// string is copied, and /query must not allocate per field. The body is
// validated as exactly one well-formed object first, so schema code never
// sees truncated input. The wire reading itself (kinds, headers, integers,
// token runs) is internal/msgp's, shared with the event decoder; what is
// here is the contract's error model on top.

// kind is the family of a MessagePack value; the short names keep the
// schema code readable.
type kind = msgp.Kind

const (
	kindNil   = msgp.Nil
	kindInt   = msgp.Int
	kindStr   = msgp.Str
	kindBin   = msgp.Bin
	kindArray = msgp.Array
	kindMap   = msgp.Map
)

// header decodes the value header at b[p:]; see msgp.Header.
func header(b []byte, p int) (kind, uint64, int, error) { return msgp.Header(b, p) }

// validate reports whether b holds exactly one well-formed value.
func validate(b []byte) error { return msgp.Validate(b) }

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
	if _, err := msgp.Skip(c.b, c.p); err != nil {
		return errUnchecked
	}
	return nil
}

func (c *cursor) peek() kind { return msgp.KindOf(c.b[c.p]) }

// length reads an array or map header.
func (c *cursor) length() int {
	_, n, hdr, _ := msgp.Header(c.b, c.p)
	c.p += hdr
	return int(n)
}

// bytes reads a str or bin payload as a view into the body.
func (c *cursor) bytes() []byte {
	_, n, hdr, _ := msgp.Header(c.b, c.p)
	start := c.p + hdr
	c.p = start + int(n)
	return c.b[start:c.p:c.p]
}

// payloadLen is the byte length of the str or bin at the cursor, read
// without consuming it so limits are checked before anything is copied.
func (c *cursor) payloadLen() int {
	_, n, _, _ := msgp.Header(c.b, c.p)
	return int(n)
}

// integer reads any integer format. neg reports a negative value, in which
// case v holds it as int64 bits; otherwise v is the unsigned value.
func (c *cursor) integer() (v uint64, neg bool) {
	v, neg, size := msgp.IntAt(c.b, c.p)
	if size == 0 {
		panic("codec: integer called on a non-integer")
	}
	c.p += size
	return v, neg
}

// int64Range reports whether an integer read by integer fits in int64.
func int64Range(v uint64, neg bool) (int64, bool) { return msgp.Int64Range(v, neg) }

// decodeTokenRun decodes token ids into dst from index i with msgp's fast
// loops and returns the index it stopped at, the cursor moved past them.
func decodeTokenRun(c *cursor, dst []int32, i int) int {
	c.p, i = msgp.DecodeTokenRun(c.b, c.p, dst, i)
	return i
}
