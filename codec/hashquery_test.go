package codec

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vmihailenco/msgpack/v5"
)

// orderedBody encodes kvs as one map in the order given (Go maps would
// not keep it, and which of two names comes second is the test).
func orderedBody(t *testing.T, kvs ...any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(nil)
	if err != nil {
		t.Fatal(err)
	}
	b = b[:0]
	b = append(b, 0x80|byte(len(kvs)/2))
	for _, v := range kvs {
		e, err := msgpack.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		b = append(b, e...)
	}
	return b
}

func TestDecodeHashQuery(t *testing.T) {
	lim := DefaultLimits()
	for _, tc := range []struct {
		name string
		body []byte
		want *Error
	}{
		{"seq then block", orderedBody(t, "model", "m", "block_size", 16, "seq_hashes", []uint64{1}, "block_hash", []uint64{1}),
			&Error{Reason: InvalidValue, Field: "block_hash", Index: NoIndex}},
		{"block then seq", orderedBody(t, "block_hash", []uint64{1}, "model", "m", "seq_hashes", []uint64{1}, "block_size", 16),
			&Error{Reason: InvalidValue, Field: "seq_hashes", Index: NoIndex}},
		{"twice", orderedBody(t, "model", "m", "block_size", 16, "seq_hashes", []uint64{1}, "seq_hashes", []uint64{1}),
			&Error{Reason: InvalidValue, Field: "seq_hashes", Index: NoIndex}},
		{"map entry", orderedBody(t, "model", "m", "block_size", 16, "seq_hashes", []any{uint64(1), map[string]int{"a": 1}}),
			&Error{Reason: InvalidType, Field: "seq_hashes", Index: 1}},
		{"nil entry", orderedBody(t, "model", "m", "block_size", 16, "block_hash", []any{nil}),
			&Error{Reason: InvalidType, Field: "block_hash", Index: 0}},
		{"limit in blocks", orderedBody(t, "model", "m", "block_size", 1<<20, "seq_hashes", []uint64{1, 2, 3}),
			&Error{Reason: OutOfRange, Field: "seq_hashes", Index: NoIndex}},
		{"ok", orderedBody(t, "model", "m", "block_size", 16, "block_hash", []any{uint64(1<<64 - 1), []byte{1, 2, 3, 4, 5, 6, 7, 8}}), nil},
	} {
		var q HashQueryRequest
		got := DecodeHashQuery(tc.body, lim, &q)
		if got != nil {
			got = &Error{Reason: got.Reason, Field: got.Field, Index: got.Index}
		}
		if d := cmp.Diff(tc.want, got); d != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, d)
		}
		if tc.want == nil {
			if d := cmp.Diff([]uint64{1<<64 - 1, 0}, q.Values); d != "" || q.Raw == nil || q.Raw[0] != nil || len(q.Raw[1]) != 8 || q.Field != "block_hash" {
				t.Errorf("%s: decoded %+v", tc.name, q)
			}
		}
	}
}
