package codec

import (
	"bytes"
	"reflect"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/mooncake-conductor-go/conductor/internal/msgp"

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
	hb, _ := msgpack.Marshal(map[string]any{"model": "m", "block_size": 16, "seq_hashes": []any{uint64(1), []byte{1, 2, 3, 4, 5, 6, 7, 8}}})
	f.Add(hb)
	hbs, _ := msgpack.Marshal(map[string]any{"model": "m", "block_size": 16, "block_hashes": []any{uint64(1)}})
	f.Add(hbs)
	f.Add([]byte(` {"model": "m", "block_size": 16, "token_ids": [1]}`))
	f.Add([]byte("[1]"))
	f.Add([]byte{0xc1})
	f.Add([]byte{0xdf, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0x91, 0x91, 0x91, 0x91, 0xc0})
	f.Add(tokenBody(40, false))
	f.Add(tokenBody(40, true))
	f.Add(tokenBodyVocab(40, 32000))
	f.Fuzz(func(t *testing.T, body []byte) {
		lim := DefaultLimits()
		_, e := DecodeRegister(body, lim)
		checkErr(t, e)
		_, e = DecodeUnregister(body, lim)
		checkErr(t, e)
		var hq HashQueryRequest
		e = DecodeHashQuery(body, lim, &hq)
		checkErr(t, e)
		if e == nil && (int64(len(hq.Values))*int64(hq.BlockSize) > int64(lim.MaxTokens) || (hq.Raw != nil && len(hq.Raw) != len(hq.Values))) {
			t.Fatal("hash list limit or shape not enforced")
		}
		var q QueryRequest
		e = DecodeQuery(body, lim, &q)
		checkErr(t, e)
		if e == nil && len(q.Tokens) > lim.MaxTokens {
			t.Fatal("token limit not enforced")
		}
		checkOnePass(t, body, e, &q)
		if LooksLikeJSON(body) {
			// JSON is never a request: it is refused, and the hint keeps
			// the reason and stays a contract envelope.
			if e == nil {
				t.Fatal("a body that looks like JSON decoded as a request")
			}
			h := JSONHint(e, true, "query")
			checkErr(t, h)
			if h.Reason != e.Reason || h.Field != e.Field || h.Index != e.Index {
				t.Fatalf("the hint changed the error's reason or field: %v -> %v", e, h)
			}
		}
		// A body our validator accepts must decode with vmihailenco too
		// structurally, consuming the whole body.
		if msgp.Validate(body) == nil {
			r := bytes.NewReader(body)
			if err := msgpack.NewDecoder(r).Skip(); err != nil || r.Len() != 0 {
				t.Fatalf("validate accepted what msgpack rejects: %v", err)
			}
		}
	})
}

// checkOnePass asserts that DecodeQuery, which reads a body in one checked
// pass, answers exactly what validating the whole body and then reading it
// answers: the same error, or the same request.
func checkOnePass(t *testing.T, body []byte, got *Error, q *QueryRequest) {
	t.Helper()
	var want QueryRequest
	c, n, e := open(body)
	if e == nil {
		_, e = decodeQuery(c, n, DefaultLimits(), &want, nil)
	}
	// reflect.DeepEqual first: the tests call this for every cut and
	// corruption of a body, and go-cmp's reflection with options costs
	// twenty times as much under the race detector; cmp judges (and
	// explains) only what DeepEqual does not find identical.
	if !reflect.DeepEqual(e, got) {
		if diff := cmp.Diff(e, got); diff != "" {
			t.Fatalf("one-pass error differs from validate-then-read (-want +got):\n%s", diff)
		}
	}
	if e == nil && !reflect.DeepEqual(want, *q) {
		if diff := cmp.Diff(want, *q, cmpopts.EquateEmpty(), cmpopts.IgnoreUnexported(QueryRequest{})); diff != "" {
			t.Fatalf("one-pass request differs (-want +got):\n%s", diff)
		}
	}
}

// TestQueryOnePassMatchesValidated cuts and corrupts token bodies in both
// integer layouts at every position, so the one-pass decoder's own bounds
// checks (array header, token runs, the last elements, trailing bytes) meet
// every kind of damage, and compares its answers with the validated reader.
func TestQueryOnePassMatchesValidated(t *testing.T) {
	for _, enc := range []string{"compact", "compact-32k", "int32"} {
		full := tokenBody(64, enc == "int32")
		if enc == "compact-32k" { // uint16 runs
			full = tokenBodyVocab(64, 32000)
		}
		// A second field after the tokens, so damage is not only at the end.
		full[0] = 0x84
		full = append(full, 0xa9, 't', 'e', 'n', 'a', 'n', 't', '_', 'i', 'd', 0xa1, 't')
		for cut := 0; cut <= len(full); cut++ {
			body := full[:cut:cut]
			var q QueryRequest
			checkOnePass(t, body, DecodeQuery(body, DefaultLimits(), &q), &q)
		}
		for pos := 0; pos < len(full); pos++ {
			for _, v := range []byte{0x00, 0x7f, 0x80, 0x90, 0xc0, 0xc1, 0xcc, 0xce, 0xcf, 0xd2, 0xd3, 0xdc, 0xdd, 0xff} {
				body := append([]byte(nil), full...)
				body[pos] = v
				var q QueryRequest
				checkOnePass(t, body, DecodeQuery(body, DefaultLimits(), &q), &q)
			}
		}
		// Trailing bytes.
		body := append(append([]byte(nil), full...), 0x01)
		var q QueryRequest
		checkOnePass(t, body, DecodeQuery(body, DefaultLimits(), &q), &q)
	}
}
