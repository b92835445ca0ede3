package registration

import (
	"bytes"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/reqfields"
)

func pack(t *testing.T, v map[string]any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestRecordRoundTrip: a registration's record (Encode) reads back
// (DecodeService) as the same service, and encodes to the same bytes
// again, for each profile family and with the optional members.
func TestRecordRoundTrip(t *testing.T) {
	for name, body := range map[string]map[string]any{
		"vllm with every optional member": {
			"endpoint": "tcp://10.0.0.1:5557", "replay_endpoint": "tcp://10.0.0.1:5558",
			"type": "vLLM", "modelname": "m", "instance_id": "p0", "block_size": 16, "dp_rank": 1,
			"lora_name": "adapter", "tenant_id": "t1", "cache_group": 0,
			"hash_profile": map[string]any{"strategy": "vllm_v1", "algorithm": "sha256_cbor", "python_hash_seed": "0", "index_projection": "low64_be"},
		},
		"hybrid groups": {
			"endpoint": "tcp://10.0.0.2:5557", "type": "vLLM", "modelname": "llama4", "instance_id": "h", "block_size": 16, "dp_rank": 0,
			"hash_profile": map[string]any{"strategy": "vllm_v1", "algorithm": "sha256_cbor", "python_hash_seed": "0", "index_projection": "low64_be"},
			"kv_cache_groups": []any{
				map[string]any{"kind": "sliding_window", "block_size": 32, "sliding_window": 128},
				map[string]any{"kind": "full_attention", "block_size": 16},
			},
		},
		"standard hash": {
			"endpoint": "tcp://10.0.0.3:5557", "type": "vLLM", "modelname": "m", "instance_id": "s", "block_size": 16, "dp_rank": 0,
			"hash_profile": map[string]any{"strategy": "rfc1527", "algorithm": "xxh3_64", "seed": "7"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			want, err := DecodeService(pack(t, body))
			if err != nil {
				t.Fatal(err)
			}
			rec := Encode(&want)
			got, err := DecodeService(rec)
			if err != nil {
				t.Fatalf("the record does not read back: %v", err)
			}
			if diff := cmp.Diff(want, got, cmp.AllowUnexported(hashing.Profile{})); diff != "" {
				t.Errorf("round trip (-want +got):\n%s", diff)
			}
			if again := Encode(&got); !bytes.Equal(again, rec) {
				t.Errorf("the record changed on a second round trip:\n% x\n% x", rec, again)
			}
		})
	}
}

// TestDecodeSchemaErrors: the schema's refusals carry the contract's
// reason and the member's name.
func TestDecodeSchemaErrors(t *testing.T) {
	base := func() map[string]any {
		return map[string]any{
			"endpoint": "tcp://10.0.0.1:5557", "type": "vLLM", "modelname": "m", "instance_id": "p0", "block_size": 16, "dp_rank": 0,
			"hash_profile": map[string]any{"strategy": "vllm_v1", "algorithm": "sha256_cbor", "python_hash_seed": "0", "index_projection": "low64_be"},
		}
	}
	for _, tc := range []struct {
		name   string
		edit   func(m map[string]any)
		reason reqfields.Reason
		field  string
	}{
		{"unknown member", func(m map[string]any) { m["x"] = 1 }, reqfields.UnknownField, "x"},
		{"missing instance_id", func(m map[string]any) { delete(m, "instance_id") }, reqfields.Missing, "instance_id"},
		{"block_size a string", func(m map[string]any) { m["block_size"] = "16" }, reqfields.InvalidType, "block_size"},
		{"endpoint over the limit", func(m map[string]any) { m["endpoint"] = string(make([]byte, 1025)) }, reqfields.OutOfRange, "endpoint"},
		{"hash_profile member missing", func(m map[string]any) { delete(m["hash_profile"].(map[string]any), "algorithm") }, reqfields.Missing, "algorithm"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := base()
			tc.edit(m)
			_, e := Decode(pack(t, m), DefaultLimits())
			if e == nil || e.Reason != tc.reason || e.Field != tc.field {
				t.Fatalf("got %v, want %s on %q", e, tc.reason, tc.field)
			}
		})
	}
}

// BenchmarkDecodeRegister decodes a /register body with every optional
// member but kv_cache_groups: the per-member cost of the schema.
func BenchmarkDecodeRegister(b *testing.B) {
	body, err := msgpack.Marshal(map[string]any{
		"endpoint": "tcp://10.0.0.1:5557", "replay_endpoint": "tcp://10.0.0.1:5558",
		"type": "vLLM", "modelname": "m", "instance_id": "p0", "block_size": 16, "dp_rank": 1,
		"lora_name": "adapter", "tenant_id": "t1", "cache_group": 0,
		"hash_profile": map[string]any{"strategy": "vllm_v1", "algorithm": "sha256_cbor", "python_hash_seed": "0", "index_projection": "low64_be"},
	})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, e := Decode(body, DefaultLimits()); e != nil {
			b.Fatal(e)
		}
	}
}
