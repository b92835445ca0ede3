package server

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vmihailenco/msgpack/v5"
)

// bigBody is well over the test's limit and over what loopback socket
// buffers hold, so a server that closed without reading it would reset
// the connection under a client still sending.
const bigBody = 24 << 20

// TestOversizeBodyFromAClientThatKeepsSending: a client that sends its
// whole body before reading (no Expect: 100-continue) gets the 413, in
// JSON when Accept prefers it and in MessagePack otherwise, not a
// connection reset; the server answers afterwards.
func TestOversizeBodyFromAClientThatKeepsSending(t *testing.T) {
	h := startServer(t, Options{MaxBodyBytes: 1 << 20})
	body := bytes.Repeat([]byte{0xc0}, bigBody)
	for _, tc := range []struct {
		accept, ctype string
	}{
		{"application/json", "application/json"},
		{"", "application/msgpack"},
	} {
		req, err := http.NewRequest(http.MethodPost, "http://"+h.addr+"/query", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/msgpack")
		if tc.accept != "" {
			req.Header.Set("Accept", tc.accept)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("Accept %q: %v", tc.accept, err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 413 || resp.Header.Get("Content-Type") != tc.ctype || !resp.Close {
			t.Errorf("Accept %q: status %d, Content-Type %q, close %v", tc.accept, resp.StatusCode, resp.Header.Get("Content-Type"), resp.Close)
		}
		want := map[string]any{"error": "request body is over the limit of 1048576 bytes"}
		var env map[string]any
		if tc.ctype == "application/json" {
			err = json.Unmarshal(got, &env)
		} else {
			err = msgpack.Unmarshal(got, &env)
		}
		if err != nil {
			t.Fatalf("Accept %q: body %q: %v", tc.accept, got, err)
		}
		if diff := cmp.Diff(want, env); diff != "" {
			t.Errorf("Accept %q: body (-want +got):\n%s", tc.accept, diff)
		}
	}
	if status, _, _ := h.do("GET", "/services", "", nil); status != 200 {
		t.Errorf("after 413: status %d", status)
	}
}

// TestOversizeBodyFromPythonUrllib: Python's urllib, which sends the whole
// body before reading, reads the JSON 413.
func TestOversizeBodyFromPythonUrllib(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3 on PATH; TestOversizeBodyFromAClientThatKeepsSending covers the behaviour")
	}
	h := startServer(t, Options{MaxBodyBytes: 1 << 20})
	script := `
import json, sys, urllib.request, urllib.error
req = urllib.request.Request(sys.argv[1], data=b"\xc0" * int(sys.argv[2]),
    headers={"Content-Type": "application/msgpack", "Accept": "application/json"})
try:
    urllib.request.urlopen(req, timeout=30)
    print(json.dumps({"status": 200}))
except urllib.error.HTTPError as e:
    print(json.dumps({"status": e.code, "content_type": e.headers.get("Content-Type"), "body": json.loads(e.read())}))
`
	out, err := exec.Command(py, "-c", script, "http://"+h.addr+"/query", "25165824").CombinedOutput()
	if err != nil {
		t.Fatalf("urllib: %v\n%s", err, out)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(strings.TrimSpace(string(out))), &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	want := map[string]any{"status": 413.0, "content_type": "application/json",
		"body": map[string]any{"error": "request body is over the limit of 1048576 bytes"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("urllib (-want +got):\n%s", diff)
	}
}
