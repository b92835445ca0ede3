package codec

import (
	"bytes"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

var reasons = map[Reason]bool{
	UnsupportedContentType: true, InvalidMsgpack: true, UnknownField: true, Missing: true,
	InvalidType: true, InvalidValue: true, OutOfRange: true, Unsupported: true, InvalidRegistration: true,
}

func checkErr(t *testing.T, e *Error) {
	t.Helper()
	if e == nil {
		return
	}
	if !reasons[e.Reason] {
		t.Fatalf("reason %q is not one of the contract's", e.Reason)
	}
	if e.Msg == "" {
		t.Fatal("empty error message")
	}
	if e.Index != NoIndex && e.Field == "" {
		t.Fatal("index without field")
	}
	// The envelope must itself be valid MessagePack.
	var v map[string]any
	if err := msgpack.Unmarshal(AppendError(nil, e), &v); err != nil {
		t.Fatalf("error envelope does not decode: %v", err)
	}
}

// FuzzDecodeRequests feeds arbitrary bodies to every request decoder: no
// panic, every rejection is a contract envelope, and validation agrees with
// an independent MessagePack reader about well-formedness.
func FuzzDecodeRequests(f *testing.F) {
	for _, m := range []map[string]any{validRegister(), validQuery(), validUnregister(),
		with(validQuery(), "token_ids", binTokens(1, 2, 3)), withProfile("python_hash_seed", "random")} {
		b, _ := msgpack.Marshal(m)
		f.Add(b)
	}
	f.Add([]byte{0xc1})
	f.Add([]byte{0xdf, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0x91, 0x91, 0x91, 0x91, 0xc0})
	f.Fuzz(func(t *testing.T, body []byte) {
		lim := DefaultLimits()
		_, e := DecodeRegister(body, lim)
		checkErr(t, e)
		_, e = DecodeUnregister(body, lim)
		checkErr(t, e)
		var q QueryRequest
		e = DecodeQuery(body, lim, &q)
		checkErr(t, e)
		if e == nil && len(q.Tokens) > lim.MaxTokens {
			t.Fatal("token limit not enforced")
		}
		// A body our validator accepts must decode with vmihailenco too
		// structurally, consuming the whole body.
		if validate(body) == nil {
			r := bytes.NewReader(body)
			if err := msgpack.NewDecoder(r).Skip(); err != nil || r.Len() != 0 {
				t.Fatalf("validate accepted what msgpack rejects: %v", err)
			}
		}
	})
}
