package pprofsrv

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

func TestServesProfilesUntilClosed(t *testing.T) {
	s, err := Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + s.Addr() + "/debug/pprof/goroutine?debug=1"
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), "goroutine profile:") {
		t.Fatalf("status %d, body %.80q", resp.StatusCode, body)
	}
	http.DefaultClient.CloseIdleConnections()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := http.Get(url); err == nil {
		t.Fatal("profiles still served after Close")
	}
}

func TestStartFailsOnBadAddress(t *testing.T) {
	if _, err := Start("127.0.0.1:notaport"); err == nil {
		t.Fatal("no error for a malformed address")
	}
}

func TestCloseNil(t *testing.T) {
	var s *Server
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}
