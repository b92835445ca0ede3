package codec

import (
	"math"
	"unsafe"

	"github.com/mooncake-conductor-go/conductor/internal/msgp"
)

// The request decoder reads MessagePack with msgp.Reader, the one reader
// the event decoders use too, rather than with msgpack.Decoder: strict
// schemas need the exact wire type of every value before it is read (a
// float where an int belongs is invalid_type, not a conversion), string
// limits must be checked before a string is copied, and /query must not
// allocate per field. The body is validated as exactly one well-formed
// object first, so schema code never sees truncated input. What is here
// is the contract's error model on top of the reader.

// cursor is the reader positioned in a request body, with the decode mode:
// a checked cursor reads a body that was not validated as a whole, and
// before each value it is about to read the caller asks ahead() to
// validate just that value. /query decodes this way so its token array is
// walked once instead of twice; see DecodeQuery.
type cursor struct {
	msgp.Reader
	checked bool
}

// errUnchecked ends a checked decode at the first malformed byte; the
// caller then decodes the body the validated way, which names the error.
var errUnchecked = &Error{Reason: InvalidMsgpack, Index: NoIndex, Msg: "malformed MessagePack"}

// ahead validates the next value when the cursor is checked.
func (c *cursor) ahead() *Error {
	if c.checked && c.CheckNext() != nil {
		return errUnchecked
	}
	return nil
}


// open validates body as one MessagePack object and positions a cursor on
// the request map, returning its entry count.
func open(body []byte) (cursor, int, *Error) {
	if len(body) == 0 {
		return cursor{}, 0, Errorf(InvalidMsgpack, "", "empty body")
	}
	if err := msgp.Validate(body); err != nil {
		return cursor{}, 0, Errorf(InvalidMsgpack, "", "body is not one MessagePack object: %v", err)
	}
	var c cursor
	c.Reset(body)
	if k := c.Kind(); k != msgp.Map {
		return cursor{}, 0, Errorf(InvalidType, "", "request body must be a map, got %s", k)
	}
	n, _ := c.MapLen() // validated: the header is whole
	return c, n, nil
}

// openChecked is open without validating the body: the cursor is checked,
// and any failure, malformed or not, is for the caller to redo with open.
func openChecked(body []byte) (cursor, int, *Error) {
	k, n, hdr, err := msgp.Header(body, 0)
	if err != nil || k != msgp.Map || n > uint64(len(body)) {
		return cursor{}, 0, errUnchecked
	}
	c := cursor{checked: true}
	c.Reset(body)
	c.SetPos(hdr)
	return c, int(n), nil
}

// key reads a map key; schemas only have string keys.
func (c *cursor) key(prefix string) ([]byte, *Error) {
	if k := c.Kind(); k != msgp.Str {
		return nil, Errorf(InvalidType, prefix, "map keys must be strings, got %s", k)
	}
	b, err := c.Str()
	if err != nil {
		return nil, errUnchecked
	}
	return b, nil
}

// view returns a string sharing memory with the body. It is only valid while
// the body is; /query uses it so that decoding copies nothing but tokens.
func view(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

// strView reads a string field without copying, enforcing a byte limit
// before touching the payload.
func (c *cursor) strView(field string, limit int) (string, *Error) {
	if k := c.Kind(); k != msgp.Str {
		return "", Errorf(InvalidType, field, "%s must be a string, got %s", field, k)
	}
	b, err := c.Str() // a view: nothing is copied before the limit is checked
	if err != nil {
		return "", errUnchecked
	}
	if len(b) > limit {
		return "", Errorf(OutOfRange, field, "%s is %d bytes, the limit is %d", field, len(b), limit)
	}
	return view(b), nil
}

// str reads a string field into memory of its own, for values that outlive
// the request (registrations).
func (c *cursor) str(field string, limit int) (string, *Error) {
	s, err := c.strView(field, limit)
	if err != nil {
		return "", err
	}
	return string([]byte(s)), nil
}

// strOrNilView reads a field that is a string or nil; nil reads as "".
func (c *cursor) strOrNilView(field string, limit int) (string, *Error) {
	if c.Kind() == msgp.Nil {
		return "", c.nilValue()
	}
	if k := c.Kind(); k != msgp.Str {
		return "", Errorf(InvalidType, field, "%s must be a string or nil, got %s", field, k)
	}
	return c.strView(field, limit)
}

// intField reads an integer field in [min, max]; larger magnitudes are
// out_of_range, non-integers invalid_type.
func (c *cursor) intField(field string, min, max int64) (int64, *Error) {
	if k := c.Kind(); k != msgp.Int {
		return 0, Errorf(InvalidType, field, "%s must be an integer, got %s", field, k)
	}
	v, ok := msgp.Int64Range(c.int())
	if !ok || v < min || v > max {
		return 0, Errorf(OutOfRange, field, "%s must be in [%d, %d]", field, min, max)
	}
	return v, nil
}

const maxInt32 = math.MaxInt32

// fieldSet tracks which schema fields a map has set, to report duplicates
// and missing required fields.
type fieldSet uint32

func (s *fieldSet) mark(bit int, field string) *Error {
	if *s&(1<<bit) != 0 {
		return Errorf(InvalidValue, field, "%s appears more than once", field)
	}
	*s |= 1 << bit
	return nil
}

func (s fieldSet) has(bit int) bool { return s&(1<<bit) != 0 }

// nilValue consumes the nil the caller checked the kind of.
func (c *cursor) nilValue() *Error {
	if c.Nil() != nil {
		return errUnchecked
	}
	return nil
}

// int reads the integer the caller checked the kind of (validated or
// checked, so it is whole); see msgp.IntAt for u and neg.
func (c *cursor) int() (u uint64, neg bool) {
	u, neg, _ = c.Integer()
	return u, neg
}
