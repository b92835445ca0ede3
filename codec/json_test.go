package codec

import (
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vmihailenco/msgpack/v5"
)

// TestAppendJSON: every format the encoders write comes out as the same
// JSON value, map order kept; other input is refused.
func TestAppendJSON(t *testing.T) {
	long := strings.Repeat("é", 40) // str8
	tests := []struct {
		name string
		in   []byte
		want string
	}{
		{"error envelope", AppendError(nil, &Error{Reason: InvalidValue, Field: "strategy", Index: 3, Msg: "bad \"x\"\n<tag>"}),
			`{"error":"bad \"x\"\n\u003ctag\u003e","reason":"invalid_value","field":"strategy","index":3}`},
		{"status", AppendStatus(nil, "ready", 2), `{"status":"ready","stale_sources":2}`},
		{"ints", func() []byte {
			b := appendArrayLen(nil, 9)
			for _, v := range []int64{0, 127, 128, 300, 70000, 1 << 40, -1, -100, math.MinInt64} {
				b = appendInt(b, v)
			}
			return b
		}(), `[0,127,128,300,70000,1099511627776,-1,-100,-9223372036854775808]`},
		{"uint64", []byte{0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, `18446744073709551615`},
		{"int16 and int32", []byte{0x92, 0xd1, 0xff, 0x00, 0xd2, 0x80, 0, 0, 0}, `[-256,-2147483648]`},
		{"nil and bools", []byte{0x93, 0xc0, 0xc2, 0xc3}, `[null,false,true]`},
		{"str8 and map order", appendStr(appendStr(appendInt(appendStr(appendMapLen(nil, 2), "z"), 1), "a"), long),
			`{"z":1,"a":"` + long + `"}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := AppendJSON(nil, tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, string(got)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if !json.Valid(got) {
				t.Errorf("invalid JSON %s", got)
			}
		})
	}
	for _, bad := range [][]byte{nil, {0xca, 0, 0, 0, 0}, {0xc4, 1, 0}, {0x81, 0x01, 0x01}, {0x92, 0x01}, {0xa3, 'a'}, {0x01, 0x01}, {0xcd, 0x01}} {
		if _, err := AppendJSON(nil, bad); err == nil {
			t.Errorf("% x: accepted", bad)
		}
	}
}

// TestAppendJSONMatchesDecoder: the JSON parses to what an independent
// MessagePack reader decodes from the same body.
func TestAppendJSONMatchesDecoder(t *testing.T) {
	body := AppendUnregistered(nil, "a|default|0", "b|default|1")
	var want any
	if err := msgpack.Unmarshal(body, &want); err != nil {
		t.Fatal(err)
	}
	js, err := AppendJSON(nil, body)
	if err != nil {
		t.Fatal(err)
	}
	var got any
	if err := json.Unmarshal(js, &got); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-msgpack +json):\n%s", diff)
	}
}
