package main

import (
	"net"
	"strings"

	"github.com/rs/zerolog"

	"github.com/mooncake-conductor-go/conductor/internal/config"
)

// openRoutes lists what anyone who can reach addr may do without a
// token, when the listener is not on loopback and no token is set; nil
// otherwise. /register and /unregister change what every router sees,
// /snapshot hands out the whole index, and the debug route reveals the
// index's layout: fine on a trusted network, which the operator should
// know they rely on.
func openRoutes(addr net.Addr, cfg *config.Config) []string {
	if cfg.AuthToken != "" {
		return nil
	}
	if ta, ok := addr.(*net.TCPAddr); ok && ta.IP.IsLoopback() {
		return nil
	}
	routes := []string{"POST /register", "POST /unregister", "GET /snapshot"}
	if cfg.DebugRoutes {
		routes = append(routes, "POST /debug/explain")
	}
	return routes
}

// warnOpenRoutes logs openRoutes once at start.
func warnOpenRoutes(log zerolog.Logger, addr net.Addr, cfg *config.Config) {
	routes := openRoutes(addr, cfg)
	if routes == nil {
		return
	}
	ev := log.Warn().Str("addr", addr.String()).Str("open_routes", strings.Join(routes, ", "))
	if cfg.GRPCAddr != "" {
		ev = ev.Str("open_grpc", "ReportCacheState, PublishEvent")
	}
	ev.Msg("the HTTP listener is not on loopback and no bearer token is set: anyone who reaches it can change registrations and read the index; set --auth-token-file, or --addr 127.0.0.1")
}
