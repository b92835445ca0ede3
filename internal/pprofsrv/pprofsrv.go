// Package pprofsrv serves the Go runtime's profiles (net/http/pprof) on a
// listener of their own, for operators who pass --pprof-addr. It is off by
// default: profiles expose internals and a CPU profile costs CPU while it
// runs, so they never share the API's port and are never on by accident.
package pprofsrv

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

// Server is a running profile endpoint; Close stops it.
type Server struct {
	srv  *http.Server
	ln   net.Listener
	done chan struct{}
}

// Start listens on addr ("127.0.0.1:6060", or ":0" for any free port) and
// serves /debug/pprof/ until Close.
func Start(addr string) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("pprof listen on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	s := &Server{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}, ln: ln, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		_ = s.srv.Serve(ln) // ends with http.ErrServerClosed at Close
	}()
	return s, nil
}

// Addr is the address it listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops listening, ends open profile requests (a CPU profile in
// progress is cut short) and waits for the serving goroutine. It is safe
// on a nil Server.
func (s *Server) Close() error {
	if s == nil {
		return nil
	}
	err := s.srv.Close()
	<-s.done
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}
