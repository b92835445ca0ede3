// Package codec turns MessagePack request bodies into typed requests under
// strict schemas, and typed responses back into MessagePack, so that the
// HTTP layer never touches wire bytes itself.
package codec

import "fmt"

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

func elemErrorf(reason Reason, field string, index int, format string, args ...any) *Error {
	return &Error{Reason: reason, Field: field, Index: index, Msg: fmt.Sprintf(format, args...)}
}
