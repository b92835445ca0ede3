package server

import (
	"errors"
	"io"
	"testing"

	"github.com/valyala/fasthttp"
	"github.com/vmihailenco/msgpack/v5"
)

// TestSnapshotRoute: GET /snapshot streams what Options.Snapshot writes,
// behind the bearer token when one is set; without the option it is an
// unknown path.
func TestSnapshotRoute(t *testing.T) {
	payload := []byte("CNDSNAP\x00 pretend snapshot bytes")
	write := func(w io.Writer) error { _, err := w.Write(payload); return err }
	for _, tc := range []struct {
		name   string
		opts   Options
		auth   string
		status int
		body   string
	}{
		{"open", Options{Snapshot: write}, "", 200, string(payload)},
		{"token given", Options{Snapshot: write, AuthToken: "tok"}, "Bearer tok", 200, string(payload)},
		{"token missing", Options{Snapshot: write, AuthToken: "tok"}, "", 401, ""},
		{"token wrong", Options{Snapshot: write, AuthToken: "tok"}, "Bearer no", 401, ""},
		{"not served", Options{}, "", 404, ""},
		{"writer fails", Options{Snapshot: func(w io.Writer) error { w.Write(payload[:4]); return errors.New("boom") }}, "", 200, "CNDS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := startServer(t, tc.opts)
			req := fasthttp.AcquireRequest()
			defer fasthttp.ReleaseRequest(req)
			resp := &fasthttp.Response{}
			req.SetRequestURI("http://" + h.addr + "/snapshot")
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			if err := h.c.Do(req, resp); err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode() != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode(), tc.status)
			}
			if tc.status == 200 && string(resp.Body()) != tc.body {
				t.Fatalf("body %q, want %q", resp.Body(), tc.body)
			}
			if tc.status == 401 {
				// The same challenge and envelope as every guarded route.
				if got := string(resp.Header.Peek("WWW-Authenticate")); got != `Bearer realm="conductor"` {
					t.Errorf("WWW-Authenticate %q", got)
				}
				var env map[string]any
				if err := msgpack.Unmarshal(resp.Body(), &env); err != nil || env["error"] != "a valid bearer token is required" || len(env) != 1 {
					t.Errorf("body %v (%v), want the {error} envelope", env, err)
				}
			}
		})
	}
}

// TestRawRoutesFollowTheTable: /metrics and /snapshot, which write their
// own responses, get what every route gets from the route table: 405 with
// Allow for a wrong method, 404 when the option is off, and a panic in
// them answered as the 500 envelope instead of killing the connection.
func TestRawRoutesFollowTheTable(t *testing.T) {
	metrics := func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("up 1\n") } // served: TestMetricsMove
	snap := func(w io.Writer) error { _, err := w.Write([]byte("CNDSNAP")); return err }
	on := startServer(t, Options{Metrics: metrics, Snapshot: snap})
	off := startServer(t, Options{})
	boom := startServer(t, Options{Metrics: func(*fasthttp.RequestCtx) { panic("scrape failed") }})
	for _, tc := range []struct {
		name   string
		h      *harness
		method string
		path   string
		status int
		allow  string
		env    string // the {error} message
	}{
		{"metrics, wrong method", on, "POST", "/metrics", 405, "GET", "method not allowed; use GET"},
		{"metrics off", off, "GET", "/metrics", 404, "", "not found: /metrics"},
		{"metrics panics", boom, "GET", "/metrics", 500, "", "internal error"},
		{"snapshot, wrong method", on, "DELETE", "/snapshot", 405, "GET", "method not allowed; use GET"},
		{"snapshot off", off, "GET", "/snapshot", 404, "", "not found: /snapshot"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body, resp := tc.h.do(tc.method, tc.path, "", nil)
			if status != tc.status {
				t.Fatalf("status %d, want %d", status, tc.status)
			}
			if got := string(resp.Header.Peek("Allow")); got != tc.allow {
				t.Errorf("Allow %q, want %q", got, tc.allow)
			}
			if m, ok := body.(map[string]any); !ok || m["error"] != tc.env || len(m) != 1 {
				t.Errorf("body %v, want {error: %q}", body, tc.env)
			}
		})
	}
}
