package server

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/valyala/fasthttp"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/mooncake-conductor-go/conductor/codec"
	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/contexts"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/registry"
)

// FuzzHandlers sends arbitrary bodies to every POST endpoint of a server
// that already holds one registration: nothing panics, every response is a
// MessagePack map, and a rejected request leaves registrations and contexts
// exactly as they were.
func FuzzHandlers(f *testing.F) {
	reg0, _ := msgpack.Marshal(map[string]any{"endpoint": "tcp://127.0.0.1:9", "type": "vLLM", "modelname": "m", "instance_id": "x",
		"block_size": 16, "dp_rank": 0, "hash_profile": map[string]any{"strategy": "vllm_v1", "algorithm": "sha256", "python_hash_seed": "7", "index_projection": "low64_be"}})
	f.Add(reg0)
	q, _ := msgpack.Marshal(map[string]any{"model": "m", "block_size": 16, "token_ids": []int{1, 2, 3}})
	f.Add(q)
	u, _ := msgpack.Marshal(map[string]any{"instance_id": "base", "dp_rank": 0})
	f.Add(u)
	hq, _ := msgpack.Marshal(map[string]any{"model": "m", "block_size": 16, "seq_hashes": []any{uint64(1), []byte{1, 2}}})
	f.Add(hq)
	f.Add([]byte{0x80})
	bh, _ := msgpack.Marshal(map[string]any{"model": "m", "block_size": 16, "block_hashes": []any{uint64(1)}})
	f.Add(bh)
	f.Add([]byte(`{"model": "m", "block_size": 16, "block_hashes": [1]}`))

	ix := index.New(index.Options{})
	cat := contexts.New(ix)
	reg := registry.New(registry.Options{Contexts: cat})
	s := New(Options{Registry: reg, Contexts: cat})
	base, _ := msgpack.Marshal(map[string]any{"endpoint": "tcp://127.0.0.1:8", "type": "vLLM", "modelname": "m", "instance_id": "base",
		"block_size": 16, "dp_rank": 0, "hash_profile": map[string]any{"strategy": "vllm_v1", "algorithm": "sha256", "python_hash_seed": "7", "index_projection": "low64_be"}})
	call := func(path string, body []byte) (int, []byte) {
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.SetMethod("POST")
		ctx.Request.SetRequestURI(path)
		ctx.Request.Header.SetContentType("application/msgpack")
		ctx.Request.SetBody(body)
		s.Handle(&ctx)
		return ctx.Response.StatusCode(), append([]byte(nil), ctx.Response.Body()...)
	}
	if st, b := call("/register", base); st != 200 {
		f.Fatalf("base registration: %d %x", st, b)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, path := range []string{"/query", "/query_by_hash", "/register", "/unregister"} {
			before, ctxBefore := reg.Services(), reg.Contexts()
			st, resp := call(path, body)
			var v map[string]any
			if err := msgpack.Unmarshal(resp, &v); err != nil {
				t.Fatalf("%s: response is not a MessagePack map: %v", path, err)
			}
			if st != 200 {
				if _, ok := v["error"].(string); !ok {
					t.Fatalf("%s: %d without an error message: %v", path, st, v)
				}
				if diff := cmp.Diff(before, reg.Services(), cmpopts.EquateComparable(hashing.Profile{})); diff != "" {
					t.Fatalf("%s: rejected request (%d) changed services:\n%s", path, st, diff)
				}
				if diff := cmp.Diff(ctxBefore, reg.Contexts(), cmpopts.EquateComparable(hashing.Profile{})); diff != "" {
					t.Fatalf("%s: rejected request (%d) changed contexts:\n%s", path, st, diff)
				}
				continue
			}
			// Put accepted changes back so every input starts from the
			// same state.
			switch path {
			case "/register":
				for _, svc := range reg.Services() {
					if svc.Key() != "base|default|0" {
						_ = reg.Unregister(svc.Key())
					}
				}
			case "/unregister":
				if _, err := reg.Register(mustDecode(t, base)); err != nil {
					t.Fatal(err)
				}
			}
		}
	})
}

func mustDecode(t *testing.T, body []byte) registry.Service {
	t.Helper()
	svc, e := codecDecodeRegister(body)
	if e != nil {
		t.Fatal(e)
	}
	return svc
}

func codecDecodeRegister(body []byte) (registry.Service, error) {
	reg, e := codec.DecodeRegister(body, codec.DefaultLimits())
	if e != nil {
		return registry.Service{}, e
	}
	return registry.NewService(reg)
}
