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
		{"seq then block_hashes", orderedBody(t, "model", "m", "seq_hashes", []uint64{1}, "block_size", 16, "block_hashes", []uint64{1}),
			&Error{Reason: InvalidValue, Field: "block_hashes", Index: NoIndex}},
		{"block_hashes then block", orderedBody(t, "block_hashes", []uint64{1}, "block_hash", []uint64{1}, "model", "m", "block_size", 16),
			&Error{Reason: InvalidValue, Field: "block_hash", Index: NoIndex}},
		{"block_hashes then seq", orderedBody(t, "model", "m", "block_hashes", []uint64{1}, "block_size", 16, "seq_hashes", []uint64{}),
			&Error{Reason: InvalidValue, Field: "seq_hashes", Index: NoIndex}},
		{"block_hashes twice", orderedBody(t, "model", "m", "block_size", 16, "block_hashes", []uint64{1}, "block_hashes", []uint64{1}),
			&Error{Reason: InvalidValue, Field: "block_hashes", Index: NoIndex}},
		{"block_hashes entry", orderedBody(t, "model", "m", "block_size", 16, "block_hashes", []any{uint64(1), "2"}),
			&Error{Reason: InvalidType, Field: "block_hashes", Index: 1}},
		{"twice", orderedBody(t, "model", "m", "block_size", 16, "seq_hashes", []uint64{1}, "seq_hashes", []uint64{1}),
			&Error{Reason: InvalidValue, Field: "seq_hashes", Index: NoIndex}},
		{"map entry", orderedBody(t, "model", "m", "block_size", 16, "seq_hashes", []any{uint64(1), map[string]int{"a": 1}}),
			&Error{Reason: InvalidType, Field: "seq_hashes", Index: 1}},
		{"nil entry", orderedBody(t, "model", "m", "block_size", 16, "block_hash", []any{nil}),
			&Error{Reason: InvalidType, Field: "block_hash", Index: 0}},
		{"limit in blocks", orderedBody(t, "model", "m", "block_size", 1<<20, "seq_hashes", []uint64{1, 2, 3}),
			&Error{Reason: OutOfRange, Field: "seq_hashes", Index: NoIndex}},
		{"ok", orderedBody(t, "model", "m", "block_size", 16, "block_hash", []any{uint64(1<<64 - 1), []byte{1, 2, 3, 4, 5, 6, 7, 8}}), nil},
		{"ok block_hashes", orderedBody(t, "model", "m", "block_size", 16, "block_hashes", []any{uint64(1<<64 - 1), []byte{1, 2, 3, 4, 5, 6, 7, 8}}), nil},
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
			if d := cmp.Diff([]uint64{1<<64 - 1, 0}, q.Values); d != "" || q.Raw == nil || q.Raw[0] != nil || len(q.Raw[1]) != 8 || (q.Field != "block_hash" && q.Field != "block_hashes") {
				t.Errorf("%s: decoded %+v", tc.name, q)
			}
		}
	}
}

// TestDecodeHashQueryField: the list's name is reported as it was given,
// whichever of the three it was, so errors found later (the projection of
// a binary entry) name it too.
func TestDecodeHashQueryField(t *testing.T) {
	for _, name := range []string{"seq_hashes", "block_hash", "block_hashes"} {
		var q HashQueryRequest
		if e := DecodeHashQuery(orderedBody(t, name, []uint64{7, 8}, "model", "m", "block_size", 16), DefaultLimits(), &q); e != nil {
			t.Fatalf("%s: %v", name, e)
		}
		if q.Field != name || !cmp.Equal(q.Values, []uint64{7, 8}) {
			t.Errorf("%s: decoded field %q values %v", name, q.Field, q.Values)
		}
	}
}

func TestLooksLikeJSON(t *testing.T) {
	for _, tc := range []struct {
		body string
		want bool
	}{
		{`{"model": "m"}`, true},
		{"[1, 2]", true},
		{" \t\r\n{}", true},
		{"{", true},
		{"", false},
		{"   ", false},
		{"model=m", false},
		{"\x81\xa5model\xa1m", false},
		{"\x00{", false},
		{"\"m\"", false},
	} {
		if got := LooksLikeJSON([]byte(tc.body)); got != tc.want {
			t.Errorf("LooksLikeJSON(%q) = %v, want %v", tc.body, got, tc.want)
		}
	}
}

func TestJSONHint(t *testing.T) {
	const tail = "; JSON is read only by the command line (conductor query < request.json)"
	for _, tc := range []struct {
		name string
		in   *Error
		json bool
		want *Error
	}{
		{"content type", Errorf(UnsupportedContentType, "", "Content-Type must contain application/msgpack"), true,
			Errorf(UnsupportedContentType, "", "Content-Type must contain application/msgpack: the API reads MessagePack only"+tail)},
		{"not msgpack", Errorf(InvalidMsgpack, "", "body is not one MessagePack object: trailing bytes"), true,
			Errorf(InvalidMsgpack, "", "body looks like JSON, not MessagePack: the API reads MessagePack only"+tail)},
		{"not json", Errorf(InvalidMsgpack, "", "empty body"), false, Errorf(InvalidMsgpack, "", "empty body")},
		{"other reason", Errorf(InvalidType, "", "request body must be a map, got int"), true, Errorf(InvalidType, "", "request body must be a map, got int")},
		{"nil", nil, true, nil},
	} {
		if d := cmp.Diff(tc.want, JSONHint(tc.in, tc.json, "query")); d != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, d)
		}
	}
}
