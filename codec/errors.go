// Package codec turns MessagePack request bodies into typed requests under
// strict schemas, and typed responses back into MessagePack, so that the
// HTTP layer never touches wire bytes itself. The strict reading of a
// request map and its errors are internal/reqfields'; the /register body's
// schema is internal/registration's, which the state store reads its
// records with too (docs/architecture.md).
package codec

import "github.com/mooncake-conductor-go/conductor/internal/reqfields"

// Reason is the closed set of machine-readable causes the contract allows in
// a 400 body; routers switch on it, so no other value may ever be sent.
type Reason = reqfields.Reason

// The contract's reasons, in its order.
const (
	UnsupportedContentType = reqfields.UnsupportedContentType
	InvalidMsgpack         = reqfields.InvalidMsgpack
	UnknownField           = reqfields.UnknownField
	Missing                = reqfields.Missing
	InvalidType            = reqfields.InvalidType
	InvalidValue           = reqfields.InvalidValue
	OutOfRange             = reqfields.OutOfRange
	Unsupported            = reqfields.Unsupported
	InvalidRegistration    = reqfields.InvalidRegistration
)

// NoIndex marks an Error that does not concern one array element.
const NoIndex = reqfields.NoIndex

// Error is a validation failure, rendered as the contract's 400 body
// {error, reason, field?, index?}.
type Error = reqfields.Error

// Errorf builds an Error about one field (field may be empty).
func Errorf(reason Reason, field string, format string, args ...any) *Error {
	return reqfields.Errorf(reason, field, format, args...)
}

// elemErrorf builds an Error about element index of an array field.
func elemErrorf(reason Reason, field string, index int, format string, args ...any) *Error {
	return reqfields.ElemErrorf(reason, field, index, format, args...)
}
