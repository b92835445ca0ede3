package codec

import (
	"math"
	"unsafe"
)

// open validates body as one MessagePack object and positions a cursor on
// the request map, returning its entry count.
func open(body []byte) (cursor, int, *Error) {
	if len(body) == 0 {
		return cursor{}, 0, Errorf(InvalidMsgpack, "", "empty body")
	}
	if err := validate(body); err != nil {
		return cursor{}, 0, Errorf(InvalidMsgpack, "", "body is not one MessagePack object: %v", err)
	}
	c := cursor{b: body}
	if k := c.peek(); k != kindMap {
		return cursor{}, 0, Errorf(InvalidType, "", "request body must be a map, got %s", k)
	}
	return c, c.length(), nil
}

// openChecked is open without validating the body: the cursor is checked,
// and any failure, malformed or not, is for the caller to redo with open.
func openChecked(body []byte) (cursor, int, *Error) {
	k, n, hdr, err := header(body, 0)
	if err != nil || k != kindMap || n > uint64(len(body)) {
		return cursor{}, 0, errUnchecked
	}
	return cursor{b: body, p: hdr, checked: true}, int(n), nil
}

// key reads a map key; schemas only have string keys.
func (c *cursor) key(prefix string) ([]byte, *Error) {
	if k := c.peek(); k != kindStr {
		return nil, Errorf(InvalidType, prefix, "map keys must be strings, got %s", k)
	}
	return c.bytes(), nil
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
	if k := c.peek(); k != kindStr {
		return "", Errorf(InvalidType, field, "%s must be a string, got %s", field, k)
	}
	if n := c.payloadLen(); n > limit {
		return "", Errorf(OutOfRange, field, "%s is %d bytes, the limit is %d", field, n, limit)
	}
	return view(c.bytes()), nil
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
	if c.peek() == kindNil {
		c.p++
		return "", nil
	}
	if k := c.peek(); k != kindStr {
		return "", Errorf(InvalidType, field, "%s must be a string or nil, got %s", field, k)
	}
	return c.strView(field, limit)
}

// intField reads an integer field in [min, max]; larger magnitudes are
// out_of_range, non-integers invalid_type.
func (c *cursor) intField(field string, min, max int64) (int64, *Error) {
	if k := c.peek(); k != kindInt {
		return 0, Errorf(InvalidType, field, "%s must be an integer, got %s", field, k)
	}
	v, ok := int64Range(c.integer())
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
