// Package msgp reads MessagePack in place, for the two decoders of the
// service that cannot afford a general-purpose one: /query requests (codec)
// and engine/master event batches (events). Both need the exact wire type of
// a value before reading it (a float where an integer belongs is a schema
// error, not a conversion), string views instead of copies, and token-id
// arrays decoded or range-checked without a call per element.
//
// The package owns what the two share: the kind of every type byte, header
// and size decoding, validation of one whole value, integer decoding, the
// token-run loops, and Reader, the one reader both decoders read with
// (codec positions it in a request body, events in a batch). Error models stay with the callers: codec maps a
// failure to the contract's error envelope, the event decoder to a counted
// rejection reason. Here every malformed input is just ErrMalformed.
package msgp
