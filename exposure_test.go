package main

import (
	"bytes"
	"encoding/json"
	"net"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/mooncake-conductor-go/conductor/internal/config"
)

func TestWarnOpenRoutes(t *testing.T) {
	tcp := func(ip string) net.Addr { return &net.TCPAddr{IP: net.ParseIP(ip), Port: 13333} }
	for _, tc := range []struct {
		name   string
		addr   net.Addr
		token  string
		debug  bool
		routes string // "" = no warning
	}{
		{"every interface, no token", tcp("0.0.0.0"), "", false, "POST /register, POST /unregister, GET /snapshot"},
		{"every IPv6 interface", tcp("::"), "", false, "POST /register, POST /unregister, GET /snapshot"},
		{"a routable address with debug routes", tcp("10.0.0.5"), "", true, "POST /register, POST /unregister, GET /snapshot, POST /debug/explain"},
		{"loopback", tcp("127.0.0.1"), "", true, ""},
		{"IPv6 loopback", tcp("::1"), "", false, ""},
		{"a token is set", tcp("0.0.0.0"), "s3cret", true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			cfg := config.Defaults()
			cfg.AuthToken, cfg.DebugRoutes = tc.token, tc.debug
			warnOpenRoutes(zerolog.New(&buf), tc.addr, cfg)
			if tc.routes == "" {
				if buf.Len() != 0 {
					t.Errorf("warned: %s", buf.String())
				}
				return
			}
			if strings.Count(buf.String(), "\n") != 1 {
				t.Fatalf("want one line: %q", buf.String())
			}
			var l map[string]any
			if err := json.Unmarshal(buf.Bytes(), &l); err != nil {
				t.Fatal(err)
			}
			if l["level"] != "warn" || l["open_routes"] != tc.routes || strings.Contains(buf.String(), "s3cret") {
				t.Errorf("line %v, want routes %q", l, tc.routes)
			}
		})
	}
}
