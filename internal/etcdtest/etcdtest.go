// Package etcdtest runs a real etcd server in the test process, on
// loopback, in a temporary directory, for the tests of the shared
// registrations. It can be stopped and started again on the same data
// and the same client address, to test what replicas do while etcd is
// away and after it returns.
package etcdtest

import (
	"fmt"
	"net"
	"net/url"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Server is one single-member etcd cluster.
type Server struct {
	t      testing.TB
	dir    string
	client url.URL
	peer   url.URL
	e      *embed.Etcd
}

// Start runs a fresh etcd; it is stopped when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{t: t, dir: t.TempDir(), client: freeURL(t), peer: freeURL(t)}
	s.Restart()
	t.Cleanup(s.Stop)
	return s
}

// Endpoint is the client URL, stable across restarts.
func (s *Server) Endpoint() string { return s.client.String() }

// Stop shuts etcd down (idempotent).
func (s *Server) Stop() {
	if s.e == nil {
		return
	}
	s.e.Close()
	s.e = nil
}

// Restart starts etcd again on the same data and addresses (or for the
// first time).
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	cfg := embed.NewConfig()
	cfg.Name = "test"
	cfg.Dir = s.dir
	cfg.ListenClientUrls = []url.URL{s.client}
	cfg.AdvertiseClientUrls = []url.URL{s.client}
	cfg.ListenPeerUrls = []url.URL{s.peer}
	cfg.AdvertisePeerUrls = []url.URL{s.peer}
	cfg.InitialCluster = fmt.Sprintf("%s=%s", cfg.Name, s.peer.String())
	cfg.ListenMetricsUrls = nil
	// Short raft timings: a single member elects itself at once, and
	// stopping waits for open watch streams only about 5 s, not 7.
	cfg.TickMs, cfg.ElectionMs = 10, 100
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	var err error
	// A port released by the previous run may take a moment to bind again.
	deadline := time.Now().Add(20 * time.Second)
	for {
		s.e, err = embed.StartEtcd(cfg)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		s.t.Fatalf("start etcd: %v", err)
	}
	select {
	case <-s.e.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		s.e.Close()
		s.t.Fatal("etcd did not become ready")
	}
}

// freeURL reserves a loopback port by listening on it and closing it.
func freeURL(t testing.TB) url.URL {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return url.URL{Scheme: "http", Host: addr}
}
