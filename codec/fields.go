package codec

import (
	"github.com/mooncake-conductor-go/conductor/internal/reqfields"
)

// The request decoders read bodies through reqfields.Cursor (the contract's
// error model on top of msgp.Reader); these are its names in this package.

// cursor is a reqfields.Cursor: the reader positioned in a request body,
// with the decode mode (checked: each value is validated just before it is
// read; see DecodeQuery).
type cursor struct{ reqfields.Cursor }

// errUnchecked ends a checked decode at the first malformed byte; the
// caller then decodes the body the validated way, which names the error.
var errUnchecked = reqfields.ErrUnchecked

// maxInt32 is the bound of the contract's int32 fields.
const maxInt32 = reqfields.MaxInt32

// fieldSet tracks which members a map has set.
type fieldSet struct{ reqfields.FieldSet }

func (s *fieldSet) mark(bit int, field string) *Error { return s.Mark(bit, field) }
func (s fieldSet) has(bit int) bool                   { return s.Has(bit) }

// open validates body as one MessagePack map and positions a cursor on its
// first key (reqfields.Open).
func open(body []byte) (cursor, int, *Error) {
	c, n, e := reqfields.Open(body)
	return cursor{c}, n, e
}

// openChecked is open without validating the body (reqfields.OpenChecked).
func openChecked(body []byte) (cursor, int, *Error) {
	c, n, e := reqfields.OpenChecked(body)
	return cursor{c}, n, e
}

func (c *cursor) ahead() *Error             { return c.Ahead() }
func (c *cursor) int() (u uint64, neg bool) { return c.Int() }
