package server

import (
	"bytes"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestBodyOverLimitIs413(t *testing.T) {
	h := startServer(t, Options{MaxBodyBytes: 1024})
	status, got, _ := h.do("POST", "/query", "application/msgpack", bytes.Repeat([]byte{0xc0}, 4096))
	if status != 413 {
		t.Errorf("status %d, want 413", status)
	}
	if diff := cmp.Diff(map[string]any{"error": "request body is over the limit"}, got); diff != "" {
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
