package server

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/valyala/fasthttp"
	"github.com/vmihailenco/msgpack/v5"
)

var update = flag.Bool("update", false, "rewrite golden files from the responses")

// jsonExchange is one request and its golden answer: the body is kept as
// the exact text (JSON) or hex (MessagePack) sent back.
type jsonExchange struct {
	Method string `json:"method"`
	Path   string `json:"path"`
	Accept string `json:"accept,omitempty"`
	// Request, when set, is sent as MessagePack (Content-Type
	// application/msgpack): the JSON value re-encoded.
	Request     json.RawMessage `json:"request,omitempty"`
	Status      int             `json:"status"`
	ContentType string          `json:"content_type"`
	JSON        json.RawMessage `json:"json,omitempty"`
	MsgpackHex  string          `json:"msgpack_hex,omitempty"`
}

// TestGoldenJSONForms: the read endpoints answer JSON, byte for byte the
// golden text, when Accept asks for it first, with the same shape and map
// order as their MessagePack bodies; MessagePack stays the default, and
// the endpoints that take a body answer JSON for their errors only (a
// success stays the contract's MessagePack). Run with -update to
// rewrite testdata/json_forms.json, then review the diff.
func TestGoldenJSONForms(t *testing.T) {
	ready := false
	h := startServer(t, Options{Ready: func() (bool, string, int) { return ready, "static registrations are not connected yet", 1 }})
	regBody, err := msgpack.Marshal(map[string]any{
		"endpoint": "tcp://127.0.0.1:7001", "type": "vLLM", "modelname": "m", "instance_id": "inst-a",
		"block_size": 16, "dp_rank": 0, "lora_name": "<lora & \"x\">",
		"hash_profile": map[string]any{"strategy": "vllm_v1", "algorithm": "sha256_cbor", "python_hash_seed": "0", "index_projection": "low64_be"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if st, body, _ := h.do("POST", "/register", "application/msgpack", regBody); st != 200 {
		t.Fatalf("register: %d %v", st, body)
	}
	requests := []jsonExchange{
		{Method: "GET", Path: "/healthz", Accept: "application/json"},
		{Method: "GET", Path: "/readyz", Accept: "application/json"},
		{Method: "GET", Path: "/services", Accept: "application/json"},
		{Method: "GET", Path: "/global_view", Accept: "application/json"},
		{Method: "GET", Path: "/services", Accept: "text/html, application/json;q=0.9, application/msgpack"},
		{Method: "GET", Path: "/healthz", Accept: "application/msgpack, application/json"},
		{Method: "GET", Path: "/healthz", Accept: "*/*"},
		{Method: "GET", Path: "/healthz"},
		{Method: "POST", Path: "/healthz", Accept: "application/json"},
		{Method: "POST", Path: "/unregister", Accept: "application/json"},
		{Method: "GET", Path: "/nowhere", Accept: "application/json"},
		{Method: "POST", Path: "/register", Accept: "application/json", Request: json.RawMessage(`{"type":"vLLM"}`)},
		{Method: "POST", Path: "/register", Request: json.RawMessage(`{"type":"vLLM"}`)},
		{Method: "POST", Path: "/register", Accept: "application/msgpack, application/json", Request: json.RawMessage(`{"type":"vLLM"}`)},
		{Method: "POST", Path: "/unregister", Accept: "application/json", Request: json.RawMessage(`{"instance_id":"nobody","dp_rank":0}`)},
		{Method: "POST", Path: "/query", Accept: "application/json", Request: json.RawMessage(`{"model":"m","token_ids":"abc"}`)},
		{Method: "POST", Path: "/query", Accept: "application/json", Request: json.RawMessage(`{"model":"m","block_size":16,"token_ids":[1,2,3]}`)},
	}
	var got []jsonExchange
	for i, r := range requests {
		if i == 1 {
			// Not ready first: the 503 envelope in JSON; then ready.
			got = append(got, h.exchange(r))
			ready = true
		}
		got = append(got, h.exchange(r))
	}
	path := filepath.Join("testdata", "json_forms.json")
	if *update {
		b, err := json.MarshalIndent(got, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var want []jsonExchange
	if err := json.Unmarshal(raw, &want); err != nil {
		t.Fatal(err)
	}
	// The golden file is indented for reading; bodies are compared as
	// exact bytes once its indentation is removed (json.Compact keeps
	// member order and string escapes as written).
	compact := func(m json.RawMessage) json.RawMessage {
		if len(m) == 0 {
			return m
		}
		var b bytes.Buffer
		if err := json.Compact(&b, m); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	for i := range want {
		want[i].JSON, want[i].Request = compact(want[i].JSON), compact(want[i].Request)
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b json.RawMessage) bool { return string(a) == string(b) })); diff != "" {
		t.Errorf("JSON forms (-golden +got):\n%s", diff)
	}
}

// exchange sends r and records the answer; a JSON body must be valid JSON.
func (h *harness) exchange(r jsonExchange) jsonExchange {
	h.t.Helper()
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	resp := &fasthttp.Response{}
	req.SetRequestURI("http://" + h.addr + r.Path)
	req.Header.SetMethod(r.Method)
	if r.Accept != "" {
		req.Header.Set("Accept", r.Accept)
	}
	if len(r.Request) > 0 {
		var v any
		d := json.NewDecoder(bytes.NewReader(r.Request))
		d.UseNumber()
		if err := d.Decode(&v); err != nil {
			h.t.Fatal(err)
		}
		body, err := msgpack.Marshal(jsonNumbersToInts(v))
		if err != nil {
			h.t.Fatal(err)
		}
		req.Header.SetContentType("application/msgpack")
		req.SetBody(body)
	}
	if err := h.c.Do(req, resp); err != nil {
		h.t.Fatal(err)
	}
	r.Status, r.ContentType = resp.StatusCode(), string(resp.Header.ContentType())
	body := append([]byte(nil), resp.Body()...)
	if r.ContentType == "application/json" {
		if !json.Valid(body) {
			h.t.Fatalf("%s %s: invalid JSON %q", r.Method, r.Path, body)
		}
		r.JSON = body
	} else {
		var v any
		if err := msgpack.Unmarshal(body, &v); err != nil {
			h.t.Fatalf("%s %s: not MessagePack: %v", r.Method, r.Path, err)
		}
		r.MsgpackHex = hex.EncodeToString(body)
	}
	return r
}

// jsonNumbersToInts turns the json.Numbers of a decoded value into int64,
// so they are sent as MessagePack integers.
func jsonNumbersToInts(v any) any {
	switch x := v.(type) {
	case json.Number:
		n, _ := x.Int64()
		return n
	case []any:
		for i := range x {
			x[i] = jsonNumbersToInts(x[i])
		}
	case map[string]any:
		for k := range x {
			x[k] = jsonNumbersToInts(x[k])
		}
	}
	return v
}
