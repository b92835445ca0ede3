package server

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/mooncake-conductor-go/conductor/registry"
)

// A registration change the state directory cannot record answers 503
// {error} and changes nothing.
func TestUnrecordedRegistrationIs503(t *testing.T) {
	h := startServer(t, Options{})
	body, _ := msgpack.Marshal(map[string]any{
		"endpoint": "tcp://127.0.0.1:1", "type": "vLLM", "modelname": "m", "instance_id": "a", "block_size": 16, "dp_rank": 0,
		"hash_profile": map[string]any{"strategy": "vllm_v1", "algorithm": "sha256_cbor", "python_hash_seed": "0", "index_projection": "low64_be"},
	})
	unreg, _ := msgpack.Marshal(map[string]any{"instance_id": "a", "dp_rank": 0})
	failing := func([]registry.Service) error { return errors.New("no space left on device") }
	wantErr := map[string]any{"error": "registration change could not be recorded: no space left on device"}

	h.reg.SetRecorder(failing)
	status, got, _ := h.do("POST", "/register", "application/msgpack", body)
	if status != 503 || cmp.Diff(wantErr, got) != "" {
		t.Errorf("register: %d %v", status, got)
	}
	if _, got, _ := h.do("GET", "/services", "", nil); cmp.Diff(int64(0), got.(map[string]any)["count"]) != "" {
		t.Errorf("services after refused register: %v", got)
	}

	h.reg.SetRecorder(nil)
	if status, got, _ := h.do("POST", "/register", "application/msgpack", body); status != 200 {
		t.Fatalf("register: %d %v", status, got)
	}
	h.reg.SetRecorder(failing)
	status, got, _ = h.do("POST", "/unregister", "application/msgpack", unreg)
	if status != 503 || cmp.Diff(wantErr, got) != "" {
		t.Errorf("unregister: %d %v", status, got)
	}
	if _, got, _ := h.do("GET", "/services", "", nil); cmp.Diff(int64(1), got.(map[string]any)["count"]) != "" {
		t.Errorf("services after refused unregister: %v", got)
	}
}
