package regstore

import (
	"encoding/binary"
	"errors"
	"io"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/registration"
	"github.com/mooncake-conductor-go/conductor/internal/state/statedir"
	"github.com/mooncake-conductor-go/conductor/registry"
)

// service builds a registration the way /register does, from a request map.
func service(t testing.TB, req map[string]any) registry.Service {
	t.Helper()
	body, err := msgpack.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	reg, e := registration.Decode(body, registration.DefaultLimits())
	if e != nil {
		t.Fatalf("Decode: %v", e)
	}
	svc, err := registry.NewService(reg)
	if err != nil {
		t.Fatalf("NewService: %v", err)
	}
	return svc
}

func services(t testing.TB) []registry.Service {
	return []registry.Service{
		service(t, map[string]any{
			"endpoint": "tcp://10.0.0.1:5557", "replay_endpoint": "tcp://10.0.0.1:5558",
			"type": "vLLM", "modelname": "m", "instance_id": "prefill-0", "block_size": 16, "dp_rank": 1,
			"lora_name": "adapter", "tenant_id": "t1", "cache_group": 0,
			"hash_profile": map[string]any{"strategy": "vllm_v1", "algorithm": "sha256_cbor", "python_hash_seed": "0", "index_projection": "low64_be"},
		}),
		service(t, map[string]any{
			"endpoint": "tcp://10.0.0.2:5557", "type": "vLLM", "modelname": "llama4", "instance_id": "hybrid", "block_size": 16, "dp_rank": 0,
			"hash_profile": map[string]any{"strategy": "vllm_v1", "algorithm": "sha256_cbor", "python_hash_seed": "0", "index_projection": "low64_be"},
			"kv_cache_groups": []any{
				map[string]any{"kind": "chunked_local_attention", "block_size": 16, "chunk_size": 8192},
				map[string]any{"kind": "sliding_window", "block_size": 32, "sliding_window": 128},
				map[string]any{"kind": "full_attention", "block_size": 16},
			},
		}),
		service(t, map[string]any{
			"endpoint": "ipc:///tmp/sglang.sock", "type": "SGLang", "modelname": "m2", "instance_id": "sg", "block_size": 1, "dp_rank": 0,
			"hash_profile": map[string]any{"strategy": "sglang", "algorithm": "sha256_raw", "index_projection": "first64_be"},
		}),
		service(t, map[string]any{
			"endpoint": "tcp://10.0.0.9:6000", "type": "Mooncake", "modelname": "m", "instance_id": "master", "block_size": 16, "dp_rank": 0,
			"hash_profile": map[string]any{"strategy": "vllm_v1", "algorithm": "sha256_cbor", "python_hash_seed": "12345", "index_projection": "low64_be"},
		}),
	}
}

// cmpServices compares registrations including the resolved profile.
var cmpServices = cmp.Options{cmp.AllowUnexported(hashing.Profile{}), cmpopts.SortSlices(func(a, b registry.Service) bool { return a.Key() < b.Key() })}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	want := services(t)
	for _, n := range []int{0, 1, len(want)} {
		got, reason := Decode(Encode(want[:n]))
		if reason != "" {
			t.Fatalf("%d services: %s", n, reason)
		}
		if diff := cmp.Diff(want[:n], got, cmpServices, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("%d services (-want +got):\n%s", n, diff)
		}
	}
}

func openStore(t *testing.T) (*Store, *statedir.Dir) {
	t.Helper()
	d, err := statedir.Open(t.TempDir(), statedir.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return New(d), d
}

func TestSaveLoad(t *testing.T) {
	s, _ := openStore(t)
	got, err := s.Load()
	if err != nil || len(got) != 0 {
		t.Fatalf("Load of a fresh directory: %v, %v", got, err)
	}
	want := services(t)
	if err := s.Save(want); err != nil {
		t.Fatal(err)
	}
	got, err = s.Load()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got, cmpServices); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if err := s.Save(want[:1]); err != nil {
		t.Fatal(err)
	}
	if got, err = s.Load(); err != nil || len(got) != 1 || got[0].Key() != want[0].Key() {
		t.Errorf("after shrinking: %v, %v", got, err)
	}
}

type failingWriter struct{ err error }

func (f failingWriter) Write([]byte) (int, error) { return 0, f.err }

// A failed save (a full disk here) reports the error and leaves the
// previous record as it was.
func TestSaveFailureKeepsPreviousRecord(t *testing.T) {
	s, _ := openStore(t)
	want := services(t)
	if err := s.Save(want[:2]); err != nil {
		t.Fatal(err)
	}
	s.write = func(io.Writer) io.Writer { return failingWriter{syscall.ENOSPC} }
	err := s.Save(want)
	if !errors.Is(err, syscall.ENOSPC) || statedir.FailureReason(err) != statedir.ReasonNoSpace {
		t.Fatalf("Save on a full disk: %v", err)
	}
	s.write = nil
	got, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want[:2], got, cmpServices); diff != "" {
		t.Errorf("record after failed save (-want +got):\n%s", diff)
	}
}

func TestLoadCorrupt(t *testing.T) {
	good := Encode(services(t))
	reseal := func(b []byte) []byte {
		b = b[:len(b)-8]
		return binary.LittleEndian.AppendUint64(b, xxhash.Sum64(b))
	}
	bogus, _ := msgpack.Marshal(map[string]any{"endpoint": "tcp://*:1"})
	withBogus := append([]byte(nil), good[:headerLen]...)
	binary.LittleEndian.PutUint32(withBogus[12:], 1)
	withBogus = binary.LittleEndian.AppendUint32(withBogus, uint32(len(bogus)))
	withBogus = append(withBogus, bogus...)
	withBogus = binary.LittleEndian.AppendUint64(withBogus, xxhash.Sum64(withBogus))

	for _, tc := range []struct {
		name   string
		data   []byte
		reason string
	}{
		{"empty", nil, "truncated"},
		{"truncated", good[:len(good)-3], "checksum"},
		{"flipped byte", func() []byte { b := append([]byte(nil), good...); b[40] ^= 1; return b }(), "checksum"},
		{"bad magic", reseal(append([]byte("XXXXXXXX"), good[8:]...)), "bad magic"},
		{"future version", func() []byte {
			b := append([]byte(nil), good...)
			binary.LittleEndian.PutUint32(b[8:], Version+1)
			return reseal(b)
		}(), "format version 2, this release reads version 1"},
		{"count too high", func() []byte {
			b := append([]byte(nil), good...)
			binary.LittleEndian.PutUint32(b[12:], uint32(len(services(t))+1))
			return reseal(b)
		}(), "cut short"},
		{"invalid registration", withBogus, "not a valid registration"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := openStore(t)
			if err := os.WriteFile(s.Path(), tc.data, 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := s.Load()
			var ce *CorruptError
			if !errors.As(err, &ce) {
				t.Fatalf("Load: %v, want a CorruptError", err)
			}
			if !strings.Contains(ce.Reason, tc.reason) || !strings.Contains(err.Error(), s.Path()) || !strings.Contains(err.Error(), "--state-reset") {
				t.Errorf("error %q: want reason containing %q, the path and the way out", err, tc.reason)
			}
		})
	}
}
