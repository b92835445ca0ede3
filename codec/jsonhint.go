package codec

import "fmt"

// A router or a person trying the API by hand often sends JSON: the
// Content-Type is then wrong, or it is right and the body is not
// MessagePack. Either way the reason stays the contract's
// (unsupported_content_type or invalid_msgpack, whichever the body got);
// only the message changes, to say what to do instead
// (docs/api.md#errors).

// LooksLikeJSON reports whether body's first byte that is not JSON
// whitespace opens a JSON object or array. Such a body is never a
// MessagePack request: '{' and '[' are positive fixints, so a map cannot
// start with them.
func LooksLikeJSON(body []byte) bool {
	for _, b := range body {
		switch b {
		case ' ', '\t', '\n', '\r':
			continue
		case '{', '[':
			return true
		}
		return false
	}
	return false
}

// JSONHint returns e with its message replaced by one that says the API
// reads MessagePack only and that JSON is read by the command line, when
// e is one of the two reasons a JSON body gets (unsupported_content_type,
// invalid_msgpack) and json says the request was JSON (LooksLikeJSON of
// the body, or a JSON Content-Type). cli is the subcommand that sends this
// route's requests from JSON ("query"). Any other e is returned as it is.
func JSONHint(e *Error, json bool, cli string) *Error {
	if e == nil || !json {
		return e
	}
	var msg string
	switch e.Reason {
	case UnsupportedContentType:
		msg = "Content-Type must contain application/msgpack: the API reads MessagePack only"
	case InvalidMsgpack:
		msg = "body looks like JSON, not MessagePack: the API reads MessagePack only"
	default:
		return e
	}
	return &Error{Reason: e.Reason, Field: e.Field, Index: e.Index,
		Msg: fmt.Sprintf("%s; JSON is read only by the command line (conductor %s < request.json)", msg, cli)}
}
