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
