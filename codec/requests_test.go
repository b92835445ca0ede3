package codec

import (
	"encoding/binary"
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/querybody"
	"github.com/mooncake-conductor-go/conductor/registry"
)

func validRegister() map[string]any {
	return map[string]any{
		"endpoint":        "tcp://127.0.0.1:5557",
		"replay_endpoint": "tcp://127.0.0.1:5558",
		"type":            "vLLM",
		"modelname":       "deepseek",
		"lora_name":       "",
		"tenant_id":       "default",
		"instance_id":     "vllm-prefill-node1",
		"block_size":      16,
		"dp_rank":         0,
		"cache_group":     nil,
		"hash_profile": map[string]any{
			"strategy":         "vllm_v1",
			"algorithm":        "sha256_cbor",
			"python_hash_seed": "0",
			"index_projection": "low64_be",
		},
	}
}

func validQuery() map[string]any {
	return map[string]any{
		"model":       "deepseek",
		"lora_name":   "",
		"token_ids":   []int{101, 15, 100, 55, 89},
		"tenant_id":   "default",
		"instance_id": "vllm-prefill-node1",
		"block_size":  16,
		"cache_salt":  "",
	}
}

func validUnregister() map[string]any {
	return map[string]any{"instance_id": "vllm-prefill-node1", "tenant_id": "default", "dp_rank": 0}
}

func pack(t testing.TB, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func with(m map[string]any, k string, v any) map[string]any {
	out := make(map[string]any, len(m))
	for kk, vv := range m {
		out[kk] = vv
	}
	if v == deleteField {
		delete(out, k)
	} else {
		out[k] = v
	}
	return out
}

type deleteMarker struct{}

var deleteField = deleteMarker{}

func withProfile(k string, v any) map[string]any {
	hp := validRegister()["hash_profile"].(map[string]any)
	return with(validRegister(), "hash_profile", with(hp, k, v))
}

// errKey is the comparable part of an Error.
type errKey struct {
	Reason Reason
	Field  string
	Index  int
}

func keyOf(e *Error) *errKey {
	if e == nil {
		return nil
	}
	return &errKey{e.Reason, e.Field, e.Index}
}

func TestDecodeRegisterErrors(t *testing.T) {
	long := strings.Repeat("x", 1025)
	tests := []struct {
		name string
		body []byte
		want *errKey
	}{
		{"valid", pack(t, validRegister()), nil},
		{"empty body", nil, &errKey{InvalidMsgpack, "", NoIndex}},
		{"truncated", pack(t, validRegister())[:20], &errKey{InvalidMsgpack, "", NoIndex}},
		{"trailing bytes", append(pack(t, validRegister()), 0xc0), &errKey{InvalidMsgpack, "", NoIndex}},
		{"reserved byte", []byte{0xc1}, &errKey{InvalidMsgpack, "", NoIndex}},
		{"not a map", pack(t, []int{1}), &errKey{InvalidType, "", NoIndex}},
		{"non-string key", pack(t, map[int]int{1: 2}), &errKey{InvalidType, "", NoIndex}},
		{"unknown field", pack(t, with(validRegister(), "extra", 1)), &errKey{UnknownField, "extra", NoIndex}},
		{"root_digest is not input", pack(t, withProfile("root_digest", "00")), &errKey{UnknownField, "root_digest", NoIndex}},
		{"zero block size", pack(t, with(validRegister(), "block_size", 0)), &errKey{InvalidValue, "block_size", NoIndex}},
		{"negative block size", pack(t, with(validRegister(), "block_size", -16)), &errKey{InvalidValue, "block_size", NoIndex}},
		{"huge block size", pack(t, with(validRegister(), "block_size", uint64(math.MaxUint64))), &errKey{OutOfRange, "block_size", NoIndex}},
		{"negative dp rank", pack(t, with(validRegister(), "dp_rank", -1)), &errKey{OutOfRange, "dp_rank", NoIndex}},
		{"cache group 1", pack(t, with(validRegister(), "cache_group", 1)), &errKey{Unsupported, "cache_group", NoIndex}},
		{"cache group 0", pack(t, with(validRegister(), "cache_group", 0)), nil},
		{"cache group string", pack(t, with(validRegister(), "cache_group", "0")), &errKey{InvalidType, "cache_group", NoIndex}},
		{"ipc endpoint", pack(t, with(validRegister(), "endpoint", "ipc:///tmp/x.sock")), nil},
		{"empty replay endpoint", pack(t, with(validRegister(), "replay_endpoint", "")), nil},
		{"long instance", pack(t, with(validRegister(), "instance_id", long)), &errKey{OutOfRange, "instance_id", NoIndex}},
		{"long lora ok", pack(t, with(validRegister(), "lora_name", long)), nil},
		{"too long lora", pack(t, with(validRegister(), "lora_name", strings.Repeat("l", 256<<10+1))), &errKey{OutOfRange, "lora_name", NoIndex}},
		{"seed number", pack(t, withProfile("python_hash_seed", 0)), &errKey{InvalidType, "python_hash_seed", NoIndex}},
		{"strategy missing", pack(t, withProfile("strategy", deleteField)), &errKey{Missing, "strategy", NoIndex}},
		{"SGLang profile", pack(t, with(with(validRegister(), "type", "SGLang"), "hash_profile", map[string]any{"strategy": "sglang_bigram", "algorithm": "sha256_raw", "index_projection": "first64_be"})), nil},
		{"duplicate key", []byte{0x82, 0xa4, 't', 'y', 'p', 'e', 0xa4, 'v', 'L', 'L', 'M', 0xa4, 't', 'y', 'p', 'e', 0xa4, 'v', 'L', 'L', 'M'}, &errKey{InvalidValue, "type", NoIndex}},
	}
	for _, f := range []string{"endpoint", "type", "modelname", "instance_id", "block_size", "dp_rank", "hash_profile"} {
		tests = append(tests, struct {
			name string
			body []byte
			want *errKey
		}{"missing " + f, pack(t, with(validRegister(), f, deleteField)), &errKey{Missing, f, NoIndex}})
	}
	// Every field at a wrong type.
	wrong := map[string]any{
		"endpoint": 1, "replay_endpoint": true, "type": 1.5, "modelname": []int{1}, "lora_name": 3,
		"tenant_id": map[string]any{}, "instance_id": []byte("x"), "block_size": "16", "dp_rank": 0.0,
		"hash_profile": "vllm_v1", "cache_group": true,
	}
	for f, v := range wrong {
		tests = append(tests, struct {
			name string
			body []byte
			want *errKey
		}{"wrong type " + f, pack(t, with(validRegister(), f, v)), &errKey{InvalidType, f, NoIndex}})
	}
	for _, f := range []string{"strategy", "algorithm", "index_projection"} {
		tests = append(tests, struct {
			name string
			body []byte
			want *errKey
		}{"wrong type hash_profile." + f, pack(t, withProfile(f, 7)), &errKey{InvalidType, f, NoIndex}})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, e := DecodeRegister(tc.body, DefaultLimits())
			if diff := cmp.Diff(tc.want, keyOf(e)); diff != "" {
				t.Errorf("error mismatch (-want +got):\n%s\nerror: %v", diff, e)
			}
		})
	}
}

func TestDecodeRegisterValues(t *testing.T) {
	got, e := DecodeRegister(pack(t, with(with(validRegister(), "tenant_id", deleteField), "cache_group", 0)), DefaultLimits())
	if e != nil {
		t.Fatal(e)
	}
	zero, seed := 0, "0"
	want := registry.Registration{
		Endpoint: "tcp://127.0.0.1:5557", ReplayEndpoint: "tcp://127.0.0.1:5558", Type: "vLLM", ModelName: "deepseek",
		InstanceID: "vllm-prefill-node1", BlockSize: 16, CacheGroup: &zero,
		HashProfile: hashing.Spec{Strategy: "vllm_v1", Algorithm: "sha256_cbor", IndexProjection: "low64_be", PythonHashSeed: &seed},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("decoded registration (-want +got):\n%s", diff)
	}
}

func TestDecodeUnregister(t *testing.T) {
	tests := []struct {
		name string
		body map[string]any
		want *errKey
	}{
		{"valid", validUnregister(), nil},
		{"tenant optional", with(validUnregister(), "tenant_id", deleteField), nil},
		{"missing instance", with(validUnregister(), "instance_id", deleteField), &errKey{Missing, "instance_id", NoIndex}},
		{"missing rank", with(validUnregister(), "dp_rank", deleteField), &errKey{Missing, "dp_rank", NoIndex}},
		{"extra field", with(validUnregister(), "modelname", "m"), &errKey{UnknownField, "modelname", NoIndex}},
		{"wrong type instance", with(validUnregister(), "instance_id", 1), &errKey{InvalidType, "instance_id", NoIndex}},
		{"wrong type tenant", with(validUnregister(), "tenant_id", nil), &errKey{InvalidType, "tenant_id", NoIndex}},
		{"wrong type rank", with(validUnregister(), "dp_rank", "0"), &errKey{InvalidType, "dp_rank", NoIndex}},
		{"negative rank", with(validUnregister(), "dp_rank", -3), &errKey{OutOfRange, "dp_rank", NoIndex}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, e := DecodeUnregister(pack(t, tc.body), DefaultLimits())
			if diff := cmp.Diff(tc.want, keyOf(e)); diff != "" {
				t.Errorf("error mismatch (-want +got):\n%s\nerror: %v", diff, e)
			}
			if e == nil && r.TenantID != "default" {
				t.Errorf("tenant %q", r.TenantID)
			}
		})
	}
}

func binTokens(v ...int32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(x))
	}
	return b
}

func TestDecodeQuery(t *testing.T) {
	lim := DefaultLimits()
	lim.MaxTokens = 8
	tests := []struct {
		name   string
		body   map[string]any
		want   *errKey
		tokens []int32
	}{
		{"valid", validQuery(), nil, []int32{101, 15, 100, 55, 89}},
		{"bin tokens", with(validQuery(), "token_ids", binTokens(1, -2, math.MaxInt32, math.MinInt32)), nil, []int32{1, -2, math.MaxInt32, math.MinInt32}},
		{"empty tokens", with(validQuery(), "token_ids", []int{}), nil, nil},
		{"nil salt", with(validQuery(), "cache_salt", nil), nil, []int32{101, 15, 100, 55, 89}},
		{"bin not multiple of 4", with(validQuery(), "token_ids", []byte{1, 2, 3}), &errKey{InvalidValue, "token_ids", NoIndex}, nil},
		{"token over int32", with(validQuery(), "token_ids", []int64{1, math.MaxInt32 + 1}), &errKey{OutOfRange, "token_ids", 1}, nil},
		{"token under int32", with(validQuery(), "token_ids", []int64{1, 2, math.MinInt32 - 1}), &errKey{OutOfRange, "token_ids", 2}, nil},
		{"token float", with(validQuery(), "token_ids", []any{1, 2.5}), &errKey{InvalidType, "token_ids", 1}, nil},
		{"token string", with(validQuery(), "token_ids", []any{"1"}), &errKey{InvalidType, "token_ids", 0}, nil},
		{"too many tokens", with(validQuery(), "token_ids", make([]int, 9)), &errKey{OutOfRange, "token_ids", NoIndex}, nil},
		{"too many bin tokens", with(validQuery(), "token_ids", make([]byte, 36)), &errKey{OutOfRange, "token_ids", NoIndex}, nil},
		{"missing model", with(validQuery(), "model", deleteField), &errKey{Missing, "model", NoIndex}, nil},
		{"missing block size", with(validQuery(), "block_size", deleteField), &errKey{Missing, "block_size", NoIndex}, nil},
		{"missing tokens", with(validQuery(), "token_ids", deleteField), &errKey{Missing, "token_ids", NoIndex}, nil},
		{"modelname is not model", with(validQuery(), "modelname", "x"), &errKey{UnknownField, "modelname", NoIndex}, nil},
		{"empty model", with(validQuery(), "model", ""), &errKey{InvalidValue, "model", NoIndex}, nil},
		{"zero block size", with(validQuery(), "block_size", 0), &errKey{InvalidValue, "block_size", NoIndex}, nil},
		{"wrong type model", with(validQuery(), "model", 1), &errKey{InvalidType, "model", NoIndex}, nil},
		{"wrong type lora", with(validQuery(), "lora_name", nil), &errKey{InvalidType, "lora_name", NoIndex}, nil},
		{"wrong type tokens", with(validQuery(), "token_ids", "1 2 3"), &errKey{InvalidType, "token_ids", NoIndex}, nil},
		{"wrong type tenant", with(validQuery(), "tenant_id", 7), &errKey{InvalidType, "tenant_id", NoIndex}, nil},
		{"wrong type instance", with(validQuery(), "instance_id", []int{}), &errKey{InvalidType, "instance_id", NoIndex}, nil},
		{"wrong type block size", with(validQuery(), "block_size", 16.0), &errKey{InvalidType, "block_size", NoIndex}, nil},
		{"wrong type salt", with(validQuery(), "cache_salt", 1), &errKey{InvalidType, "cache_salt", NoIndex}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var q QueryRequest
			e := DecodeQuery(pack(t, tc.body), lim, &q)
			if diff := cmp.Diff(tc.want, keyOf(e)); diff != "" {
				t.Fatalf("error mismatch (-want +got):\n%s\nerror: %v", diff, e)
			}
			if e == nil {
				if diff := cmp.Diff(tc.tokens, q.Tokens, cmpopts.EquateEmpty()); diff != "" {
					t.Errorf("tokens (-want +got):\n%s", diff)
				}
				if q.TenantID != "default" || q.Model != "deepseek" || q.BlockSize != 16 {
					t.Errorf("decoded %+v", q)
				}
			}
		})
	}
}

func TestDecodeQueryAllocations(t *testing.T) {
	body := pack(t, with(validQuery(), "token_ids", make([]int, 8192)))
	var q QueryRequest
	if e := DecodeQuery(body, DefaultLimits(), &q); e != nil {
		t.Fatal(e)
	}
	allocs := testing.AllocsPerRun(100, func() {
		if e := DecodeQuery(body, DefaultLimits(), &q); e != nil {
			t.Fatal(e)
		}
	})
	if allocs != 0 {
		t.Errorf("DecodeQuery allocates %.1f times per warm request, want 0", allocs)
	}
}

// BenchmarkDecodeQuery8K decodes an 8K-token /query body in the integer
// formats routers send: "compact" is what Python's msgpack writes (fixint,
// uint8, uint16, uint32 by value), "int32" what Go packers write for int32
// values. Token ids span a 150K vocabulary, so the formats interleave.
func BenchmarkDecodeQuery8K(b *testing.B) {
	for _, enc := range []string{"compact", "compact-32k", "int32"} {
		b.Run("enc="+enc, func(b *testing.B) {
			body := tokenBody(8192, enc == "int32")
			if enc == "compact-32k" { // a vocabulary under 65,536 ids
				body = tokenBodyVocab(8192, 32000)
			}
			var q QueryRequest
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if e := DecodeQuery(body, DefaultLimits(), &q); e != nil {
					b.Fatal(e)
				}
			}
		})
	}
}

// BenchmarkDecodeQueryMembers decodes a /query body with every context
// member and 16 token ids: what the members cost, which the 8K benchmark's
// token array hides.
func BenchmarkDecodeQueryMembers(b *testing.B) {
	body, err := msgpack.Marshal(map[string]any{
		"model": "meta-llama/Llama-3.1-8B", "lora_name": "adapter", "tenant_id": "t1", "instance_id": "p0",
		"cache_salt": "salt", "block_size": 16, "token_ids": []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
	})
	if err != nil {
		b.Fatal(err)
	}
	var q QueryRequest
	b.ReportAllocs()
	for b.Loop() {
		if e := DecodeQuery(body, DefaultLimits(), &q); e != nil {
			b.Fatal(e)
		}
	}
}

// tokenBody packs a /query body by hand with n pseudo-random token ids of a
// 150K vocabulary, in Python's smallest-format packing or as int32s.
func tokenBody(n int, int32s bool) []byte { return packTokens(n, 150000, int32s) }

// tokenBodyVocab is tokenBody for a vocabulary of the given size.
func tokenBodyVocab(n, vocab int) []byte          { return packTokens(n, vocab, false) }
func packTokens(n, vocab int, int32s bool) []byte { return querybody.Pack(n, vocab, int32s) }

// TestTokenFormats decodes every integer format a packer may use for a
// token id, fast paths included.
func TestTokenFormats(t *testing.T) {
	elems := [][]byte{
		{0x05},                               // positive fixint
		{0xff},                               // negative fixint -1
		{0xcc, 0xc8},                         // uint8 200
		{0xcd, 0x30, 0x39},                   // uint16 12345
		{0xce, 0x7f, 0xff, 0xff, 0xff},       // uint32 MaxInt32
		{0xd0, 0x80},                         // int8 -128
		{0xd1, 0x80, 0x00},                   // int16 -32768
		{0xd2, 0x80, 0x00, 0x00, 0x00},       // int32 MinInt32
		{0xd2, 0x00, 0x01, 0xe2, 0x40},       // int32 123456
		{0xd3, 0, 0, 0, 0, 0, 0, 0, 0x07},    // int64 7
		{0xcf, 0, 0, 0, 0, 0, 0, 0x01, 0x00}, // uint64 256
	}
	want := []int32{5, -1, 200, 12345, math.MaxInt32, -128, -32768, math.MinInt32, 123456, 7, 256}
	body := []byte{0x83, 0xa5, 'm', 'o', 'd', 'e', 'l', 0xa1, 'm', 0xaa, 'b', 'l', 'o', 'c', 'k', '_', 's', 'i', 'z', 'e', 0x10,
		0xa9, 't', 'o', 'k', 'e', 'n', '_', 'i', 'd', 's', 0x90 | byte(len(elems))}
	for _, e := range elems {
		body = append(body, e...)
	}
	var q QueryRequest
	if e := DecodeQuery(body, DefaultLimits(), &q); e != nil {
		t.Fatal(e)
	}
	if diff := cmp.Diff(want, q.Tokens); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	// Out-of-range values in the fast-path formats are still rejected.
	for _, bad := range [][]byte{{0xce, 0x80, 0, 0, 0}, {0xd3, 0xff, 0xff, 0xff, 0xff, 0x7f, 0xff, 0xff, 0xff}} {
		b := append(append([]byte(nil), body[:len(body)-len(elemsBytes(elems))-1]...), 0x91)
		b = append(b, bad...)
		if e := DecodeQuery(b, DefaultLimits(), &q); e == nil || e.Reason != OutOfRange || e.Index != 0 {
			t.Errorf("% x: %v, want out_of_range at index 0", bad, e)
		}
	}
}

func elemsBytes(elems [][]byte) []byte {
	var b []byte
	for _, e := range elems {
		b = append(b, e...)
	}
	return b
}
