package server

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/valyala/fasthttp"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/contexts"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/query"
	"github.com/mooncake-conductor-go/conductor/internal/tokenmemo"
	"github.com/mooncake-conductor-go/conductor/registry"
)

// A golden case is a sequence of steps against one fresh server. Request
// bodies are written as JSON and sent as MessagePack, with these notations:
//
//	{"$bin": "<hex>"}            a MessagePack bin
//	{"$bin_int32": [1, -2]}      a bin of little-endian int32 values
//	{"$range": [start, count]}   an array of the integers start..start+count-1
//	{"$float": 1.5}              a float64 (JSON numbers are integers)
//	{"$concat": [a, b, …]}       the elements of arrays a, b, … in one array
//
// "body_hex" sends raw bytes instead, "body_text" a text as it is (a JSON
// body, which the API refuses), and "store" steps put blocks straight
// into the index (keys computed by the hashing package from tokens), so query
// answers can be asserted without a publisher.
type goldenCase struct {
	Description string       `json:"description"`
	MaxBody     int          `json:"max_body_bytes"`
	Steps       []goldenStep `json:"steps"`
}

type goldenStep struct {
	Method      string          `json:"method"`
	Path        string          `json:"path"`
	ContentType *string         `json:"content_type"`
	Body        json.RawMessage `json:"body"`
	BodyHex     string          `json:"body_hex"`
	BodyText    string          `json:"body_text"`
	Status      int             `json:"status"`
	Response    json.RawMessage `json:"response"`
	Store       *storeStep      `json:"store"`
}

type storeStep struct {
	Tenant    string `json:"tenant_id"`
	Model     string `json:"model"`
	Lora      string `json:"lora_name"`
	BlockSize int    `json:"block_size"`
	CacheSalt string `json:"cache_salt"`
	// Instance/Rank name an engine owner; Shared stores a shared reference.
	Instance string          `json:"instance_id"`
	Rank     int             `json:"dp_rank"`
	Shared   bool            `json:"shared"`
	Tier     string          `json:"tier"`
	Tokens   json.RawMessage `json:"token_ids"`
	// Blocks limits how many leading blocks of the chain are stored.
	Blocks int `json:"blocks"`
}

var tierNames = map[string]index.Tier{"device": index.Device, "cpu_local": index.CPULocal, "cpu_share": index.CPUShare, "disk": index.Disk}

type harness struct {
	t    *testing.T
	reg  *registry.Registry
	memo *hashing.Memo
	cat  *contexts.Catalogue
	addr string
	c    *fasthttp.Client
}

func startServer(t *testing.T, opts Options) *harness {
	t.Helper()
	return startServerMemo(t, opts, nil)
}

// startServerMemo is startServer with an engine using memo (nil: none).
func startServerMemo(t *testing.T, opts Options, memo *hashing.Memo) *harness {
	t.Helper()
	ix := index.New(index.Options{})
	cat := contexts.New(ix)
	reg := registry.New(registry.Options{Contexts: cat})
	opts.Registry, opts.Contexts = reg, cat
	opts.Engine = query.New(query.Options{Contexts: cat, Memo: memo})
	srv := New(opts)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		_ = srv.Shutdown(context.Background())
		<-done
		reg.Close()
	})
	return &harness{t: t, reg: reg, memo: memo, cat: cat, addr: ln.Addr().String(), c: &fasthttp.Client{ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second}}
}

// do sends one request and returns the status and decoded body.
func (h *harness) do(method, path, contentType string, body []byte) (int, any, *fasthttp.Response) {
	h.t.Helper()
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	resp := &fasthttp.Response{}
	req.SetRequestURI("http://" + h.addr + path)
	req.Header.SetMethod(method)
	if contentType != "" {
		req.Header.SetContentType(contentType)
	}
	// A MessagePack client says so: the health routes answer JSON to
	// clients that name neither encoding.
	req.Header.Set("Accept", "application/msgpack")
	req.SetBody(body)
	if err := h.c.Do(req, resp); err != nil {
		h.t.Fatalf("%s %s: %v", method, path, err)
	}
	if ct := string(resp.Header.ContentType()); ct != "application/msgpack" {
		h.t.Errorf("%s %s: Content-Type %q, want application/msgpack", method, path, ct)
	}
	var v any
	if err := msgpack.Unmarshal(resp.Body(), &v); err != nil {
		h.t.Fatalf("%s %s: response is not MessagePack: %v (% x)", method, path, err, resp.Body())
	}
	return resp.StatusCode(), normalize(v), resp
}

// normalize makes decoded MessagePack comparable with decoded JSON: every
// integer becomes int64 and every map map[string]any.
func normalize(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			t[k] = normalize(e)
		}
		return t
	case []any:
		for i, e := range t {
			t[i] = normalize(e)
		}
		return t
	case int8, int16, int32, int64, int, uint8, uint16, uint32, uint, uint64:
		var n int64
		fmt.Sscan(fmt.Sprint(t), &n)
		return n
	}
	return v
}

func decodeJSON(raw json.RawMessage) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}

// fromJSON applies the body notations; wire selects what is sent (true) or
// what is compared (false, where integers become int64).
func fromJSON(v any) (any, error) {
	switch t := v.(type) {
	case json.Number:
		if n, err := t.Int64(); err == nil {
			return n, nil
		}
		return strconv.ParseUint(t.String(), 10, 64) // a 64-bit key
	case []any:
		for i, e := range t {
			var err error
			if t[i], err = fromJSON(e); err != nil {
				return nil, err
			}
		}
		return t, nil
	case map[string]any:
		if len(t) == 1 {
			for k, e := range t {
				switch k {
				case "$bin":
					return hex.DecodeString(e.(string))
				case "$float":
					return e.(json.Number).Float64()
				case "$bin_int32":
					var b []byte
					for _, x := range e.([]any) {
						n, err := x.(json.Number).Int64()
						if err != nil {
							return nil, err
						}
						b = append(b, byte(n), byte(n>>8), byte(n>>16), byte(n>>24))
					}
					return b, nil
				case "$concat":
					var out []any
					for _, part := range e.([]any) {
						v, err := fromJSON(part)
						if err != nil {
							return nil, err
						}
						a, ok := v.([]any)
						if !ok {
							return nil, fmt.Errorf("$concat of a non-array %T", v)
						}
						out = append(out, a...)
					}
					return out, nil
				case "$range":
					a := e.([]any)
					start, _ := a[0].(json.Number).Int64()
					n, _ := a[1].(json.Number).Int64()
					out := make([]any, n)
					for i := range out {
						out[i] = start + int64(i)
					}
					return out, nil
				}
			}
		}
		for k, e := range t {
			var err error
			if t[k], err = fromJSON(e); err != nil {
				return nil, err
			}
		}
		return t, nil
	}
	return v, nil
}

func (h *harness) store(s *storeStep) error {
	ctx := index.ContextKey{Tenant: s.Tenant, Model: s.Model, Lora: s.Lora, BlockSize: s.BlockSize}
	if ctx.Tenant == "" {
		ctx.Tenant = "default"
	}
	c := h.cat.Get(ctx)
	if c == nil {
		return fmt.Errorf("store: no table for %+v", ctx)
	}
	tier, ok := tierNames[s.Tier]
	if !ok {
		return fmt.Errorf("store: unknown tier %q", s.Tier)
	}
	tv, err := decodeJSON(s.Tokens)
	if err != nil {
		return err
	}
	tv, err = fromJSON(tv)
	if err != nil {
		return err
	}
	var tokens []int32
	for _, x := range tv.([]any) {
		tokens = append(tokens, int32(x.(int64)))
	}
	ch := hashing.AcquireChain()
	defer hashing.ReleaseChain(ch)
	tbl := c.Table
	ch.Reset(&c.Profile, s.BlockSize, tokens, s.Lora, s.CacheSalt)
	ch.UseMemo(h.memo) // fills the memo that later queries read
	var owner index.OwnerID
	if !s.Shared {
		owner = tbl.AddEngineOwner(s.Instance, s.Rank)
	}
	for i := 0; s.Blocks == 0 || i < s.Blocks; i++ {
		key, _, ok := ch.Next()
		if !ok {
			break
		}
		if s.Shared {
			r := new(index.SharedRef)
			r.Init(nil, tier, 0, key, 0, nil)
			tbl.Acquire(r)
		} else {
			tbl.Store(owner, index.Put{Key: key, Tier: tier})
		}
	}
	return nil
}

func TestGoldenAPI(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "testdata", "api", "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden cases: %v", err)
	}
	// Every case runs with and without the prefix memo: answers must not
	// depend on it.
	for _, f := range files {
		for _, memoBytes := range []int{0, 1 << 20} {
			name := strings.TrimSuffix(filepath.Base(f), ".json")
			if memoBytes > 0 {
				name += "/memo"
			}
			t.Run(name, func(t *testing.T) {
				raw, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				var gc goldenCase
				if err := json.Unmarshal(raw, &gc); err != nil {
					t.Fatalf("parse %s: %v", f, err)
				}
				h := startServerMemo(t, Options{MaxBodyBytes: gc.MaxBody, TokenMemo: tokenmemo.New(memoBytes)}, hashing.NewMemo(memoBytes))
				for i, st := range gc.Steps {
					if st.Store != nil {
						if err := h.store(st.Store); err != nil {
							t.Fatalf("step %d: %v", i, err)
						}
						continue
					}
					ct := "application/msgpack"
					if st.ContentType != nil {
						ct = *st.ContentType
					}
					var body []byte
					switch {
					case st.BodyText != "":
						body = []byte(st.BodyText)
					case st.BodyHex != "":
						if body, err = hex.DecodeString(st.BodyHex); err != nil {
							t.Fatalf("step %d: body_hex: %v", i, err)
						}
					case len(st.Body) > 0:
						v, err := decodeJSON(st.Body)
						if err == nil {
							v, err = fromJSON(v)
						}
						if err != nil {
							t.Fatalf("step %d: body: %v", i, err)
						}
						if body, err = msgpack.Marshal(v); err != nil {
							t.Fatal(err)
						}
					}
					status, got, _ := h.do(st.Method, st.Path, ct, body)
					want, err := decodeJSON(st.Response)
					if err == nil {
						want, err = fromJSON(want)
					}
					if err != nil {
						t.Fatalf("step %d: response: %v", i, err)
					}
					if status != st.Status {
						t.Errorf("step %d (%s %s): status %d, want %d; body %v", i, st.Method, st.Path, status, st.Status, got)
					}
					if diff := cmp.Diff(want, got); diff != "" {
						t.Errorf("step %d (%s %s): response mismatch (-want +got):\n%s", i, st.Method, st.Path, diff)
					}
				}
				// Repeat every query step warm: same answers.
				if memoBytes > 0 {
					if hits, _ := h.memoStats(); hits == 0 && hasQueryHits(gc) {
						t.Error("the memo never hit")
					}
				}
			})
		}
	}
}

func (h *harness) doAuth(method, path, auth string, body []byte) (int, any) {
	h.t.Helper()
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	resp := &fasthttp.Response{}
	req.SetRequestURI("http://" + h.addr + path)
	req.Header.SetMethod(method)
	req.Header.SetContentType("application/msgpack")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	req.SetBody(body)
	if err := h.c.Do(req, resp); err != nil {
		h.t.Fatal(err)
	}
	var v any
	if err := msgpack.Unmarshal(resp.Body(), &v); err != nil {
		h.t.Fatal(err)
	}
	return resp.StatusCode(), normalize(v)
}

func (h *harness) memoStats() (uint64, uint64) { return h.memo.Stats() }

// hasQueryHits reports whether a case queries after storing blocks, so a
// memo must have been consulted for an already-hashed prefix.
func hasQueryHits(gc goldenCase) bool {
	stored := false
	for _, st := range gc.Steps {
		if st.Store != nil {
			stored = true
		}
		if stored && st.Path == "/query" && st.Status == 200 {
			return true
		}
	}
	return false
}
