// Package events decodes the KV-cache event batches that vLLM, SGLang and
// the Mooncake Store master publish, and applies their events to the
// prefix index.
//
// Every publisher type has one decoder, and all of them implement Decoder:
// decode one payload completely (an envelope that is malformed anywhere is
// rejected whole), then apply its events in order against the sinks the
// decoder was built with, reporting each event as applied, ignored,
// rejected or no-op with a Reason. The wire rules are described in
// docs/events.md; comments cite its sections (docs/events.md#bindings, …).
//
// Files: vllm.go and sglang.go hold what sets the two engine families apart
// (their keys, key rules, hash forms and checks) as rules tables over the
// shared engine decoder (engine.go); mooncake.go decodes master events and
// keeps the source's object bindings, one shared reference each;
// objectkey.go parses the connectors' object keys; fields.go reads the
// keys every family shares by shape; envelope.go and read.go the envelope
// and event maps. Payloads are read in place with internal/msgp, so
// strings are views into the payload and steady-state decoding does not
// allocate.
//
// The package knows nothing of sockets or sequence numbers: the subscriber
// receives payloads, orders them and calls a Decoder, and tests feed
// decoders directly.
package events
