// Package subscriber ingests KV-cache events from vLLM, SGLang and Mooncake
// Store master publishers into the prefix index.
//
// Each registered service gets one Subscriber: a goroutine that owns a ZMQ SUB
// socket connected to the publisher, tracks the batch sequence (first message
// is the baseline, gaps are recovered through the publisher's replay endpoint
// when it has one, a publisher restart is a new epoch that drops the old
// process's entries, anything else unrecoverable makes the source stale,
// and a stale source recovers by itself after a hold-off), decodes
// each batch with the decoder of the registered type, and applies its events
// to the index. Everything a source contributed is retracted when it goes
// stale or is stopped, so the index never reports blocks nobody vouches for.
// The payload decoders themselves, with their rules, are package events.
//
// The transport rules implemented here are described in docs/events.md;
// comments cite its sections (docs/events.md#recovery, …).
//
// Layout: a Subscriber composes one type per concern, each owning its
// state: session (session.go: sockets, connection monitor, reconnections,
// healing a lost session; link.go: the publisher connection as the state
// shows it, disconnected or not a ZMQ publisher), receiver (receive.go, recv_cgo.go), sequence
// (sequence.go, epoch.go: the state machine, stale states, publisher
// restarts), recovery (recover.go: replay and what is buffered meanwhile),
// applier (apply.go: the decoder, index writes, the gate) and resumption
// (resume.go: a restore from a snapshot). What the process's subscribers
// share (counters, the monitor budget, the C batch free list, the C heap
// trimmer) is a Resources value the app creates.
//
// Data flows one way: the subscriber calls the decoders, which write the
// index, and the durable state's stage (DurableConfig: the gate, the
// restore handle); none of them imports this package.
//
// Concurrency: a Subscriber's goroutine is the only user of its decoder and
// the only writer of its sequence state and index entries, so none of them
// needs a lock; State, Stale and LastSeq read atomics that are published
// only after the effects they describe. Stop wakes the goroutine through an
// inproc PAIR socket polled next to the SUB (and the replay DEALER during a
// recovery), so it returns promptly whatever the goroutine is waiting on.
//
// Receiving: live messages are taken from libzmq many at a time by one cgo
// call (recv_cgo.go) and read in place until the next receive, instead of
// one cgo round trip and one Go copy per frame; whatever must outlive that
// (messages held during a replay) is copied. The SUB queue is long
// (defaultRcvHWM), so a burst queues here rather than overflowing a
// publisher's send queue, and the C heap is trimmed when a burst has
// drained (zmqx.Trimmer), so RSS follows the index rather than the
// largest burst.
//
// Decoding: a batch is decoded completely (events.Decoder) before any of
// its events touches the index, because the batch dp_rank follows the
// events on the wire and a malformed tail must reject the whole envelope.
//
// Observability: every dropped message, rejected envelope or batch, and
// ignored or rejected event is counted in Counters by source type and
// Reason; warnings are rate limited and never include token ids.
package subscriber
