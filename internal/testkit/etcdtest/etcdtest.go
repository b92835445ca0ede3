// Package etcdtest runs a real etcd server for the tests of the shared
// registrations: a single-member cluster on loopback, in a temporary
// directory, in its own process. It can be stopped and started again on
// the same data and the same client address, to test what replicas do
// while etcd is away and after it returns.
//
// The server is the etcd binary built from scripts/etcd, a module of its
// own that pins the same etcd version as the client the service uses.
// It is built once and kept in the user's cache, so the service's module
// does not require etcd's server and `go build ./...` and `go vet ./...`
// do not compile it. This package imports only the standard library.
package etcdtest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Server is one single-member etcd cluster.
type Server struct {
	t      testing.TB
	dir    string
	client url.URL
	peer   url.URL
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited
	log    *bytes.Buffer // the server's output, shown when it fails to start
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

// Stop shuts etcd down gracefully and waits for its process to exit
// (idempotent).
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(60 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
	s.cmd = nil
}

// Restart starts etcd again on the same data and addresses (or for the
// first time) and returns once it answers its health check.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	bin, err := binary()
	if err != nil {
		s.t.Fatalf("etcd: %v", err)
	}
	// A port released by the previous run may take a moment to bind
	// again: a server that exits before it is healthy is started again.
	deadline := time.Now().Add(60 * time.Second)
	for {
		s.start(bin)
		healthy, err := s.awaitHealthy(deadline)
		if healthy {
			return
		}
		s.Stop()
		if time.Now().After(deadline) || err == nil {
			s.t.Fatalf("etcd did not become healthy: %v\n%s", err, s.log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *Server) start(bin string) {
	s.t.Helper()
	peer := s.peer.String()
	s.log = &bytes.Buffer{}
	cmd := exec.Command(bin,
		"--name", "test",
		"--data-dir", s.dir,
		"--listen-client-urls", s.client.String(),
		"--advertise-client-urls", s.client.String(),
		"--listen-peer-urls", peer,
		"--initial-advertise-peer-urls", peer,
		"--initial-cluster", "test="+peer,
		// Short raft timings: a single member elects itself at once.
		"--heartbeat-interval", "10",
		"--election-timeout", "100",
		"--log-level", "warn",
	)
	cmd.Stdout, cmd.Stderr = s.log, s.log
	// The server dies with the test process even if the test binary is
	// killed before its cleanups run.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("start etcd: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	s.cmd, s.exited = cmd, exited
}

// awaitHealthy polls the server's health endpoint until it reports
// healthy (true), the process exits (false, with the reason) or the
// deadline passes (false, nil error).
func (s *Server) awaitHealthy(deadline time.Time) (bool, error) {
	health := s.client.String() + "/health"
	for time.Now().Before(deadline) {
		select {
		case <-s.exited:
			return false, fmt.Errorf("etcd exited: %v", s.cmd.ProcessState)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, health, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			var body [256]byte
			n, _ := resp.Body.Read(body[:])
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && strings.Contains(string(body[:n]), `"health":"true"`) {
				cancel()
				return true, nil
			}
		}
		cancel()
		time.Sleep(20 * time.Millisecond)
	}
	return false, errors.New("timed out")
}

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
)

// binary returns the etcd binary built from scripts/etcd, building it
// on first use. The cached file is named for a digest of the module's
// files, so a change of the pinned version builds it again; concurrent
// test processes each build into a temporary file and rename it into
// place, so none reads a half-written binary.
func binary() (string, error) {
	buildOnce.Do(func() { builtBin, buildErr = build() })
	return builtBin, buildErr
}

func build() (string, error) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("the go command is needed to build etcd: %w", err)
	}
	out, err := exec.Command(goTool, "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("tests run outside the conductor module")
	}
	src := filepath.Join(filepath.Dir(gomod), "scripts", "etcd")
	h := sha256.New()
	for _, f := range []string{"go.mod", "go.sum", "main.go"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			return "", err
		}
		h.Write(b)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cache, "conductor-tools")
	bin := filepath.Join(dir, "etcd-"+hex.EncodeToString(h.Sum(nil))[:12])
	if fi, err := os.Stat(bin); err == nil && fi.Mode().IsRegular() {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tmp := fmt.Sprintf("%s.%d.tmp", bin, os.Getpid())
	cmd := exec.Command(goTool, "build", "-o", tmp, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-buildvcs=false")
	if msg, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("build %s: %w\n%s", src, err, msg)
	}
	if err := os.Rename(tmp, bin); err != nil {
		os.Remove(tmp)
		return "", err
	}
	return bin, nil
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
