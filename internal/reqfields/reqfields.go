// Package reqfields reads the members of a MessagePack request map
// strictly, under the Conductor contract's error model: each value's wire
// type is checked before it is read, limits before anything is copied, a
// repeated member is refused, and every failure is an *Error with one of
// the contract's reasons, the member's name and, for an array element, its
// index. It sits below the HTTP codec (codec/, which decodes /query and
// the other bodies with it) and below what reads a /register body outside
// HTTP (internal/registration, which internal/state/regstore uses for its
// records), so neither depends on the other (docs/architecture.md).
package reqfields

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/mooncake-conductor-go/conductor/internal/msgp"
)

// Reason is the closed set of machine-readable causes the contract allows in
// a 400 body; routers switch on it, so no other value may ever be sent.
type Reason string

// The contract's reasons, in its order.
const (
	UnsupportedContentType Reason = "unsupported_content_type"
	InvalidMsgpack         Reason = "invalid_msgpack"
	UnknownField           Reason = "unknown_field"
	Missing                Reason = "missing"
	InvalidType            Reason = "invalid_type"
	InvalidValue           Reason = "invalid_value"
	OutOfRange             Reason = "out_of_range"
	Unsupported            Reason = "unsupported"
	InvalidRegistration    Reason = "invalid_registration"
)

// NoIndex marks an Error that does not concern one array element.
const NoIndex = -1

// Error is a validation failure, rendered as the contract's 400 body
// {error, reason, field?, index?}. Field names the offending member (a
// member of hash_profile by its own name, "algorithm"); Index names the
// offending element of an array field, or is NoIndex.
type Error struct {
	Reason Reason
	Field  string
	Index  int
	Msg    string
}

func (e *Error) Error() string {
	switch {
	case e.Field != "" && e.Index != NoIndex:
		return fmt.Sprintf("%s: %s[%d]: %s", e.Reason, e.Field, e.Index, e.Msg)
	case e.Field != "":
		return fmt.Sprintf("%s: %s: %s", e.Reason, e.Field, e.Msg)
	}
	return fmt.Sprintf("%s: %s", e.Reason, e.Msg)
}

// Errorf builds an Error about one field (field may be empty).
func Errorf(reason Reason, field string, format string, args ...any) *Error {
	return &Error{Reason: reason, Field: field, Index: NoIndex, Msg: fmt.Sprintf(format, args...)}
}

// ElemErrorf builds an Error about element index of an array field.
func ElemErrorf(reason Reason, field string, index int, format string, args ...any) *Error {
	return &Error{Reason: reason, Field: field, Index: index, Msg: fmt.Sprintf(format, args...)}
}

// The request decoder reads MessagePack with msgp.Reader, the one reader
// the event decoders use too, rather than with msgpack.Decoder: strict
// schemas need the exact wire type of every value before it is read (a
// float where an int belongs is invalid_type, not a conversion), string
// limits must be checked before a string is copied, and /query must not
// allocate per field. The body is validated as exactly one well-formed
// object first, so schema code never sees truncated input. What is here
// is the contract's error model on top of the reader.

// Cursor is the reader positioned in a request body, with the decode mode:
// a checked cursor reads a body that was not validated as a whole, and
// before each value it is about to read the caller asks Ahead() to
// validate just that value. /query decodes this way so its token array is
// walked once instead of twice; see codec.DecodeQuery.
type Cursor struct {
	msgp.Reader
	Checked bool
}

// ErrUnchecked ends a checked decode at the first malformed byte; the
// caller then decodes the body the validated way, which names the error.
var ErrUnchecked = &Error{Reason: InvalidMsgpack, Index: NoIndex, Msg: "malformed MessagePack"}

// Ahead validates the next value when the cursor is checked. It is small
// enough to inline, so an unchecked decode pays a test, not a call.
func (c *Cursor) Ahead() *Error {
	if c.Checked {
		return c.checkNext()
	}
	return nil
}

//go:noinline
func (c *Cursor) checkNext() *Error {
	if c.CheckNext() != nil {
		return ErrUnchecked
	}
	return nil
}

// Open validates body as one MessagePack object and positions a cursor on
// the request map, returning its entry count.
func Open(body []byte) (Cursor, int, *Error) {
	if len(body) == 0 {
		return Cursor{}, 0, Errorf(InvalidMsgpack, "", "empty body")
	}
	if err := msgp.Validate(body); err != nil {
		return Cursor{}, 0, Errorf(InvalidMsgpack, "", "body is not one MessagePack object: %v", err)
	}
	var c Cursor
	c.Reset(body)
	if k := c.Kind(); k != msgp.Map {
		return Cursor{}, 0, Errorf(InvalidType, "", "request body must be a map, got %s", k)
	}
	n, _ := c.MapLen() // validated: the header is whole
	return c, n, nil
}

// OpenChecked is Open without validating the body: the cursor is checked,
// and any failure, malformed or not, is for the caller to redo with open.
func OpenChecked(body []byte) (Cursor, int, *Error) {
	k, n, hdr, err := msgp.Header(body, 0)
	if err != nil || k != msgp.Map || n > uint64(len(body)) {
		return Cursor{}, 0, ErrUnchecked
	}
	c := Cursor{Checked: true}
	c.Reset(body)
	c.SetPos(hdr)
	return c, int(n), nil
}

// Key reads a map key; schemas only have string keys.
func (c *Cursor) Key(prefix string) ([]byte, *Error) {
	if k := c.Kind(); k != msgp.Str {
		return nil, Errorf(InvalidType, prefix, "map keys must be strings, got %s", k)
	}
	b, err := c.Str()
	if err != nil {
		return nil, ErrUnchecked
	}
	return b, nil
}

// View returns a string sharing memory with the body. It is only valid while
// the body is; /query uses it so that decoding copies nothing but tokens.
func View(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

// StrView reads a string field without copying, enforcing a byte limit
// before touching the payload.
func (c *Cursor) StrView(field string, limit int) (string, *Error) {
	if k := c.Kind(); k != msgp.Str {
		return "", Errorf(InvalidType, field, "%s must be a string, got %s", field, k)
	}
	b, err := c.Str() // a view: nothing is copied before the limit is checked
	if err != nil {
		return "", ErrUnchecked
	}
	if len(b) > limit {
		return "", Errorf(OutOfRange, field, "%s is %d bytes, the limit is %d", field, len(b), limit)
	}
	return View(b), nil
}

// StrCopy reads a string field into memory of its own, for values that outlive
// the request (registrations).
func (c *Cursor) StrCopy(field string, limit int) (string, *Error) {
	s, err := c.StrView(field, limit)
	if err != nil {
		return "", err
	}
	return string([]byte(s)), nil
}

// StrOrNilView reads a field that is a string or nil; nil reads as "".
func (c *Cursor) StrOrNilView(field string, limit int) (string, *Error) {
	if c.Kind() == msgp.Nil {
		return "", c.NilValue()
	}
	if k := c.Kind(); k != msgp.Str {
		return "", Errorf(InvalidType, field, "%s must be a string or nil, got %s", field, k)
	}
	return c.StrView(field, limit)
}

// IntField reads an integer field in [min, max]; larger magnitudes are
// out_of_range, non-integers invalid_type.
func (c *Cursor) IntField(field string, min, max int64) (int64, *Error) {
	if k := c.Kind(); k != msgp.Int {
		return 0, Errorf(InvalidType, field, "%s must be an integer, got %s", field, k)
	}
	v, ok := msgp.Int64Range(c.Int())
	if !ok || v < min || v > max {
		return 0, Errorf(OutOfRange, field, "%s must be in [%d, %d]", field, min, max)
	}
	return v, nil
}

// MaxInt32 is the bound of the contract's int32 fields.
const MaxInt32 = math.MaxInt32

// FieldSet tracks which schema fields a map has set, to report duplicates
// and missing required fields.
type FieldSet uint32

// Mark records field (bit) as set, refusing it if it already was.
func (s *FieldSet) Mark(bit int, field string) *Error {
	if *s&(1<<bit) != 0 {
		return Errorf(InvalidValue, field, "%s appears more than once", field)
	}
	*s |= 1 << bit
	return nil
}

// Has reports whether field bit was set.
func (s FieldSet) Has(bit int) bool { return s&(1<<bit) != 0 }

// NilValue consumes the nil the caller checked the kind of.
func (c *Cursor) NilValue() *Error {
	if c.Nil() != nil {
		return ErrUnchecked
	}
	return nil
}

// Int reads the integer the caller checked the kind of (validated or
// checked, so it is whole); see msgp.IntAt for u and neg.
func (c *Cursor) Int() (u uint64, neg bool) {
	u, neg, _ = c.Integer()
	return u, neg
}

// SkipNil consumes a nil value and reports whether there was one (*e set
// when it could not be read).
func (c *Cursor) SkipNil(e **Error) bool {
	if c.Kind() == msgp.Nil {
		*e = c.NilValue()
		return true
	}
	return false
}

// BlockSize reads block_size, which /register and the lookups share: a
// positive int32.
func (c *Cursor) BlockSize() (int, *Error) {
	if k := c.Kind(); k != msgp.Int {
		return 0, Errorf(InvalidType, "block_size", "block_size must be an integer, got %s", k)
	}
	v, ok := msgp.Int64Range(c.Int())
	if ok && v <= 0 {
		// The contract's own example answers invalid_value here.
		return 0, Errorf(InvalidValue, "block_size", "block_size must be positive")
	}
	if !ok || v > MaxInt32 {
		return 0, Errorf(OutOfRange, "block_size", "block_size must be at most %d", MaxInt32)
	}
	return int(v), nil
}
