// Package subscriber ingests KV-cache events from vLLM, SGLang and Mooncake
// Store master publishers into the prefix index.
//
// Each registered service gets one Subscriber: a goroutine that owns a ZMQ SUB
// socket connected to the publisher, tracks the batch sequence (first message
// is the baseline, gaps are recovered through the publisher's replay endpoint
// when it has one, anything unrecoverable makes the source stale), decodes
// each batch with the decoder of the registered type, and applies its events
// to the index. Everything a source contributed is retracted when it goes
// stale or is stopped, so the index never reports blocks nobody vouches for.
//
// The wire rules implemented here are those of spec/events.md; the names of
// the rules in comments (§1.5, §4.8, …) refer to it.
package subscriber
