package server

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/google/go-cmp/cmp"
)

func TestBodyOverLimitIs413(t *testing.T) {
	h := startServer(t, Options{MaxBodyBytes: 1024})
	status, got, _ := h.do("POST", "/query", "application/msgpack", bytes.Repeat([]byte{0xc0}, 4096))
	if status != 413 {
		t.Errorf("status %d, want 413", status)
	}
	if diff := cmp.Diff(map[string]any{"error": "request body is over the limit of 1024 bytes"}, got); diff != "" {
		t.Errorf("body (-want +got):\n%s", diff)
	}
	// The server keeps answering afterwards.
	status, _, _ = h.do("GET", "/services", "", nil)
	if status != 200 {
		t.Errorf("after 413: status %d", status)
	}
}

func TestIsMsgpack(t *testing.T) {
	for ct, want := range map[string]bool{
		"application/msgpack":                 true,
		"Application/MsgPack":                 true,
		"application/msgpack; charset=binary": true,
		"application/x-msgpack":               false,
		"application/json":                    false,
		"":                                    false,
	} {
		if got := isMsgpack([]byte(ct)); got != want {
			t.Errorf("isMsgpack(%q) = %v, want %v", ct, got, want)
		}
	}
}

func TestBearerToken(t *testing.T) {
	h := startServer(t, Options{AuthToken: "s3cret"})
	body := []byte{0x80}
	for _, tc := range []struct {
		name, auth string
		status     int
	}{
		{"no header", "", 401},
		{"wrong token", "Bearer nope", 401},
		{"prefix of token", "Bearer s3cre", 401},
		{"basic scheme", "Basic s3cret", 401},
		{"right token", "Bearer s3cret", 400}, // authorized, then the empty map is validated
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, got := h.doAuth("POST", "/unregister", tc.auth, body)
			if status != tc.status {
				t.Errorf("status %d, want %d (%v)", status, tc.status, got)
			}
			if tc.status == 401 {
				if diff := cmp.Diff(map[string]any{"error": "a valid bearer token is required"}, got); diff != "" {
					t.Errorf("body (-want +got):\n%s", diff)
				}
			}
		})
	}
	// Reads and queries stay open.
	if status, _, _ := h.do("GET", "/services", "", nil); status != 200 {
		t.Errorf("/services with auth on: %d", status)
	}
}

// TestSlowClientIsCut: a client that trickles its request is disconnected
// once the read timeout passes, and others are still served.
func TestSlowClientIsCut(t *testing.T) {
	h := startServer(t, Options{ReadTimeout: 300 * time.Millisecond})
	conn, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("POST /query HTTP/1.1\r\nHost: x\r\nContent-Type: application/msgpack\r\nContent-Length: 100\r\n\r\n\x83")); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 4096)
	for {
		if _, err := conn.Read(buf); err != nil {
			break // closed by the server (any response before it is fine)
		}
	}
	if el := time.Since(start); el > 3*time.Second {
		t.Errorf("slow client held its connection for %v", el)
	}
	if status, _, _ := h.do("GET", "/services", "", nil); status != 200 {
		t.Errorf("server stopped answering: %d", status)
	}
}

// TestOversizedBodyRejectedEarly: a Content-Length over the limit is
// answered 413 without the body being sent.
func TestOversizedBodyRejectedEarly(t *testing.T) {
	h := startServer(t, Options{MaxBodyBytes: 1 << 10})
	conn, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("POST /query HTTP/1.1\r\nHost: x\r\nContent-Type: application/msgpack\r\nContent-Length: 104857600\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	var resp fasthttp.Response
	if err := resp.Read(bufio.NewReader(conn)); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode() != 413 {
		t.Errorf("status %d, want 413", resp.StatusCode())
	}
}

// TestMaxConnsPerIP: connections over the per-client limit are refused
// while the ones inside it keep working.
func TestMaxConnsPerIP(t *testing.T) {
	h := startServer(t, Options{MaxConnsPerIP: 2})
	var (
		conns   []net.Conn
		readers []*bufio.Reader
	)
	get := func(i int) {
		t.Helper()
		_, _ = conns[i].Write([]byte("GET /services HTTP/1.1\r\nHost: x\r\n\r\n"))
		_ = conns[i].SetReadDeadline(time.Now().Add(5 * time.Second))
		var ok fasthttp.Response
		if err := ok.Read(readers[i]); err != nil || ok.StatusCode() != 200 {
			t.Fatalf("connection %d inside the limit: %v %d", i, err, ok.StatusCode())
		}
	}
	for i := 0; i < 2; i++ {
		c, err := net.Dial("tcp", h.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns, readers = append(conns, c), append(readers, bufio.NewReader(c))
		// An answer on it says the server has accepted, and so counted,
		// the connection (it stays open: keep-alive).
		get(i)
	}
	extra, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	_, _ = extra.Write([]byte("GET /services HTTP/1.1\r\nHost: x\r\n\r\n"))
	_ = extra.SetReadDeadline(time.Now().Add(5 * time.Second))
	var resp fasthttp.Response
	if err := resp.Read(bufio.NewReader(extra)); err == nil && resp.StatusCode() == 200 {
		t.Error("third connection was served")
	}
	get(0)
}

// TestInternalErrorEnvelope: a handler panic becomes 500 {error} and the
// server keeps serving.
func TestInternalErrorEnvelope(t *testing.T) {
	s := New(Options{}) // no registry: /services dereferences nil
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.SetMethod("GET")
	ctx.Request.SetRequestURI("/services")
	s.Handle(&ctx)
	if ctx.Response.StatusCode() != 500 {
		t.Fatalf("status %d", ctx.Response.StatusCode())
	}
	var got map[string]any
	if err := msgpack.Unmarshal(ctx.Response.Body(), &got); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]any{"error": "internal error"}, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestReadyz(t *testing.T) {
	ready, stale := false, 0
	h := startServer(t, Options{Ready: func() (bool, string, int) { return ready, "static registrations are not connected yet", stale }})
	status, got, _ := h.do("GET", "/readyz", "", nil)
	if status != 503 || cmp.Diff(map[string]any{"error": "static registrations are not connected yet"}, got) != "" {
		t.Errorf("not ready: %d %v", status, got)
	}
	ready, stale = true, 2
	status, got, _ = h.do("GET", "/readyz", "", nil)
	if status != 200 || cmp.Diff(map[string]any{"status": "ready", "stale_sources": int64(2)}, got) != "" {
		t.Errorf("ready: %d %v", status, got)
	}
	status, got, _ = h.do("GET", "/healthz", "", nil)
	if status != 200 || cmp.Diff(map[string]any{"status": "ok"}, got) != "" {
		t.Errorf("healthz: %d %v", status, got)
	}
}

// A 503 from /readyz is the expected answer while starting and catching
// up, asked by every probe: logged at DEBUG, never as a failed request.
func TestReadyzNotReadyLoggedAtDebug(t *testing.T) {
	var buf eventtest.LogBuffer
	h := startServer(t, Options{
		Logger: zerolog.New(&buf).Level(zerolog.DebugLevel),
		Ready:  func() (bool, string, int) { return false, "catching up", 0 },
	})
	for range 3 {
		if status, _, _ := h.do("GET", "/readyz", "", nil); status != 503 {
			t.Fatalf("status %d, want 503", status)
		}
	}
	var debug int
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var l map[string]any
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		switch {
		case l["level"] == "debug" && l["message"] == "not ready" && l["reason"] == "catching up":
			debug++
		case l["level"] == "error" || l["level"] == "warn":
			t.Errorf("readiness 503 logged at %v: %s", l["level"], line)
		}
	}
	if debug != 3 {
		t.Errorf("%d DEBUG lines for 3 refusals:\n%s", debug, buf.String())
	}
}

// TestHealthRoutesByAccept: /healthz and /readyz are for any HTTP client
// (probes, curl, load balancers), so they answer JSON unless the client
// names MessagePack first, and a MessagePack client still gets it; the
// contract's routes keep MessagePack for a client naming neither.
func TestHealthRoutesByAccept(t *testing.T) {
	var ready atomic.Bool
	h := startServer(t, Options{Ready: func() (bool, string, int) { return ready.Load(), "catching up", 1 }})
	cases := []struct {
		path, accept string
		notReady     bool
		status       int
		contentType  string
		body         map[string]any
	}{
		{"/healthz", "", false, 200, "application/json", map[string]any{"status": "ok"}},
		{"/healthz", "*/*", false, 200, "application/json", map[string]any{"status": "ok"}},
		{"/healthz", "text/plain", false, 200, "application/json", map[string]any{"status": "ok"}},
		{"/healthz", "application/json", false, 200, "application/json", map[string]any{"status": "ok"}},
		{"/healthz", "application/msgpack", false, 200, "application/msgpack", map[string]any{"status": "ok"}},
		{"/healthz", "application/msgpack, application/json", false, 200, "application/msgpack", map[string]any{"status": "ok"}},
		{"/healthz", "text/html, application/json;q=0.9, */*", false, 200, "application/json", map[string]any{"status": "ok"}},
		{"/readyz", "", false, 200, "application/json", map[string]any{"status": "ready", "stale_sources": int64(1)}},
		{"/readyz", "*/*", false, 200, "application/json", map[string]any{"status": "ready", "stale_sources": int64(1)}},
		{"/readyz", "application/msgpack", false, 200, "application/msgpack", map[string]any{"status": "ready", "stale_sources": int64(1)}},
		{"/readyz", "", true, 503, "application/json", map[string]any{"error": "catching up"}},
		{"/readyz", "*/*", true, 503, "application/json", map[string]any{"error": "catching up"}},
		{"/readyz", "application/msgpack", true, 503, "application/msgpack", map[string]any{"error": "catching up"}},
		// The contract's read routes keep their encoding for a plain client.
		{"/services", "", false, 200, "application/msgpack", map[string]any{"count": int64(0), "services": []any{}}},
		{"/services", "*/*", false, 200, "application/msgpack", map[string]any{"count": int64(0), "services": []any{}}},
	}
	for _, c := range cases {
		t.Run(c.path+" "+c.accept, func(t *testing.T) {
			ready.Store(!c.notReady)
			req := fasthttp.AcquireRequest()
			defer fasthttp.ReleaseRequest(req)
			resp := &fasthttp.Response{}
			req.SetRequestURI("http://" + h.addr + c.path)
			req.Header.SetMethod("GET")
			if c.accept != "" {
				req.Header.Set("Accept", c.accept)
			}
			if err := h.c.Do(req, resp); err != nil {
				t.Fatal(err)
			}
			if ct := string(resp.Header.ContentType()); resp.StatusCode() != c.status || ct != c.contentType {
				t.Fatalf("%d %s, want %d %s", resp.StatusCode(), ct, c.status, c.contentType)
			}
			var got any
			if c.contentType == "application/json" {
				d := json.NewDecoder(bytes.NewReader(resp.Body()))
				d.UseNumber()
				if err := d.Decode(&got); err != nil {
					t.Fatalf("not JSON: %v (%q)", err, resp.Body())
				}
				got = jsonNumbersToInts(got)
			} else if err := msgpack.Unmarshal(resp.Body(), &got); err != nil {
				t.Fatalf("not MessagePack: %v (% x)", err, resp.Body())
			}
			if diff := cmp.Diff(any(c.body), normalize(got)); diff != "" {
				t.Errorf("body (-want +got):\n%s", diff)
			}
		})
	}
}
