// Package server is the HTTP front door: it routes the contract's five
// endpoints, checks method and content type, and turns handler results and
// typed errors into MessagePack responses.
package server

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/mooncake-conductor-go/conductor/codec"
	"github.com/mooncake-conductor-go/conductor/hashing"
	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/registry"
)

// Options configure a Server. Zero values take the documented defaults.
type Options struct {
	Registry *registry.Registry
	Index    *index.Index
	Limits   codec.Limits
	// MaxBodyBytes bounds a request body; larger bodies get 413.
	MaxBodyBytes int
	// ReadTimeout and WriteTimeout bound one request's read and its
	// response's write, so a slow client cannot hold a connection forever.
	ReadTimeout  time.Duration
	WriteTimeout time.Duration
	// IdleTimeout closes keep-alive connections idle for longer.
	IdleTimeout time.Duration
	// MaxConnsPerIP bounds concurrent connections from one client address
	// (0 = the default 1024, negative = unlimited).
	MaxConnsPerIP int
	Logger        zerolog.Logger
	// Observer, when set, sees every request's endpoint, status and time.
	Observer Observer
	// Metrics, when set, serves GET /metrics.
	Metrics fasthttp.RequestHandler
	// Memo, when set, lets warm queries skip SHA-256 for blocks seen
	// before; answers are identical either way.
	Memo *hashing.Memo
	// TokenMemo, when set, lets warm queries copy the token ids of a body
	// prefix seen before instead of decoding them.
	TokenMemo *codec.TokenMemo
	// AuthToken, when non-empty, is the bearer token /register and
	// /unregister require. Off by default so the drop-in stays compatible.
	AuthToken string
	// Ready reports readiness for GET /readyz: whether every static
	// registration has connected, and how many sources are stale.
	Ready func() (ready bool, staleSources int)
}

// Observer receives per-request measurements (metrics live outside this
// package so the server does not depend on an exporter).
type Observer interface {
	ObserveRequest(endpoint string, status int, elapsed time.Duration)
}

// DefaultMaxBodyBytes is the default request body limit (64 MiB), enough
// for the maximum token count in array form.
const DefaultMaxBodyBytes = 64 << 20

// DefaultMaxConnsPerIP bounds one client's concurrent connections: far
// above a router's connection pool, far below what exhausts descriptors.
const DefaultMaxConnsPerIP = 1024

// Server serves the Conductor API.
type Server struct {
	opts Options
	fs   *fasthttp.Server
}

// New builds a Server; it does not listen until Serve.
func New(opts Options) *Server {
	if opts.Limits == (codec.Limits{}) {
		opts.Limits = codec.DefaultLimits()
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.ReadTimeout <= 0 {
		opts.ReadTimeout = 30 * time.Second
	}
	if opts.WriteTimeout <= 0 {
		opts.WriteTimeout = 30 * time.Second
	}
	if opts.IdleTimeout <= 0 {
		opts.IdleTimeout = 120 * time.Second
	}
	switch {
	case opts.MaxConnsPerIP == 0:
		opts.MaxConnsPerIP = DefaultMaxConnsPerIP
	case opts.MaxConnsPerIP < 0:
		opts.MaxConnsPerIP = 0
	}
	s := &Server{opts: opts}
	s.fs = &fasthttp.Server{
		Handler:                      s.Handle,
		ErrorHandler:                 s.transportError,
		Name:                         "conductor",
		MaxRequestBodySize:           opts.MaxBodyBytes,
		ReadTimeout:                  opts.ReadTimeout,
		WriteTimeout:                 opts.WriteTimeout,
		IdleTimeout:                  opts.IdleTimeout,
		MaxConnsPerIP:                opts.MaxConnsPerIP,
		NoDefaultContentType:         true,
		DisablePreParseMultipartForm: true,
		// A keep-alive connection gives its body buffer and bufio
		// reader back between requests instead of keeping them: a
		// router's idle connections would otherwise each pin a buffer
		// the size of the largest prompt it sent (40 KB at 8K tokens),
		// and nothing could return it. The loadgen's RSS after
		// unregistration drops by ~1 MiB with 16 connections.
		ReduceMemoryUsage: true,
		Logger:            fasthttpLogger{opts.Logger},
	}
	return s
}

// Serve accepts connections on ln until Shutdown.
func (s *Server) Serve(ln net.Listener) error { return s.fs.Serve(ln) }

// Shutdown stops accepting, waits for in-flight requests and closes idle
// connections.
func (s *Server) Shutdown() error { return s.fs.Shutdown() }

// apiError is what a handler returns instead of a body: a validation error
// rendered as the contract's 400 body, or a service-level error rendered as
// {error} with its status.
type apiError struct {
	status int
	valid  *codec.Error
	msg    string
}

func validation(e *codec.Error) *apiError { return &apiError{status: 400, valid: e} }

func serviceError(status int, msg string) *apiError { return &apiError{status: status, msg: msg} }

type handler func(s *Server, ctx *fasthttp.RequestCtx, out []byte) ([]byte, *apiError)

type route struct {
	method  string
	msgpack bool // requires a MessagePack body
	h       handler
	mutates bool // changes registrations; needs the bearer token when one is set
}

var routes = map[string]route{
	"/register":    {fasthttp.MethodPost, true, (*Server).register, true},
	"/unregister":  {fasthttp.MethodPost, true, (*Server).unregister, true},
	"/query":       {fasthttp.MethodPost, true, (*Server).query, false},
	"/services":    {fasthttp.MethodGet, false, (*Server).services, false},
	"/global_view": {fasthttp.MethodGet, false, (*Server).globalView, false},
	"/healthz":     {fasthttp.MethodGet, false, (*Server).healthz, false},
	"/readyz":      {fasthttp.MethodGet, false, (*Server).readyz, false},
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

// Handle is the fasthttp handler for every request.
func (s *Server) Handle(ctx *fasthttp.RequestCtx) {
	start := time.Now()
	if s.opts.Metrics != nil && string(ctx.Path()) == "/metrics" && ctx.IsGet() {
		s.opts.Metrics(ctx)
		s.observe("/metrics", ctx.Response.StatusCode(), start)
		return
	}
	bp := bufPool.Get().(*[]byte)
	out := (*bp)[:0]
	out, apiErr := s.dispatch(ctx, out)
	status := fasthttp.StatusOK
	if apiErr != nil {
		status = apiErr.status
		if apiErr.valid != nil {
			out = codec.AppendError(out[:0], apiErr.valid)
		} else {
			out = codec.AppendMessage(out[:0], apiErr.msg)
		}
		if status >= 500 {
			s.opts.Logger.Error().Str("path", string(ctx.Path())).Str("error", apiErr.msg).Msg("request failed")
		}
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/msgpack")
	ctx.SetBody(out)
	*bp = out
	bufPool.Put(bp)
	s.observe(string(ctx.Path()), status, start)
}

func (s *Server) observe(path string, status int, start time.Time) {
	if s.opts.Observer == nil {
		return
	}
	if _, known := routes[path]; !known && path != "/metrics" {
		path = "other" // client-chosen paths must not become label values
	}
	s.opts.Observer.ObserveRequest(path, status, time.Since(start))
}

func (s *Server) dispatch(ctx *fasthttp.RequestCtx, out []byte) (res []byte, apiErr *apiError) {
	defer func() {
		if r := recover(); r != nil {
			s.opts.Logger.Error().Interface("panic", r).Str("path", string(ctx.Path())).Msg("handler panicked")
			res, apiErr = nil, serviceError(fasthttp.StatusInternalServerError, "internal error")
		}
	}()
	rt, ok := routes[string(ctx.Path())]
	if !ok {
		return nil, serviceError(fasthttp.StatusNotFound, "not found: "+string(ctx.Path()))
	}
	if string(ctx.Method()) != rt.method {
		ctx.Response.Header.Set("Allow", rt.method)
		return nil, serviceError(fasthttp.StatusMethodNotAllowed, "method not allowed; use "+rt.method)
	}
	if rt.mutates && s.opts.AuthToken != "" && !s.authorized(ctx) {
		ctx.Response.Header.Set("WWW-Authenticate", `Bearer realm="conductor"`)
		return nil, serviceError(fasthttp.StatusUnauthorized, "a valid bearer token is required")
	}
	if rt.msgpack && !isMsgpack(ctx.Request.Header.ContentType()) {
		return nil, validation(codec.Errorf(codec.UnsupportedContentType, "", "Content-Type must contain application/msgpack"))
	}
	return rt.h(s, ctx, out)
}

// authorized compares the bearer token in constant time, so response timing
// does not reveal how much of a guess was right.
func (s *Server) authorized(ctx *fasthttp.RequestCtx) bool {
	h := ctx.Request.Header.Peek(fasthttp.HeaderAuthorization)
	tok, ok := bytes.CutPrefix(h, []byte("Bearer "))
	if !ok {
		return false
	}
	want := sha256.Sum256([]byte(s.opts.AuthToken))
	got := sha256.Sum256(tok)
	return subtle.ConstantTimeCompare(want[:], got[:]) == 1
}

var msgpackType = []byte("application/msgpack")

func isMsgpack(ct []byte) bool {
	if len(ct) < len(msgpackType) {
		return false
	}
	for i := 0; i+len(msgpackType) <= len(ct); i++ {
		if bytes.EqualFold(ct[i:i+len(msgpackType)], msgpackType) {
			return true
		}
	}
	return false
}

// transportError answers requests fasthttp could not parse, including bodies
// over the limit, with the {error} envelope.
func (s *Server) transportError(ctx *fasthttp.RequestCtx, err error) {
	status := fasthttp.StatusBadRequest
	msg := "malformed HTTP request"
	if errors.Is(err, fasthttp.ErrBodyTooLarge) {
		status = fasthttp.StatusRequestEntityTooLarge
		msg = "request body is over the limit"
	}
	var te interface{ Timeout() bool }
	if errors.As(err, &te) && te.Timeout() {
		status = fasthttp.StatusRequestTimeout
		msg = "request read timed out"
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/msgpack")
	ctx.SetBody(codec.AppendMessage(nil, msg))
}

func (s *Server) register(ctx *fasthttp.RequestCtx, out []byte) ([]byte, *apiError) {
	svc, e := codec.DecodeRegister(ctx.PostBody(), s.opts.Limits)
	if e != nil {
		return nil, validation(e)
	}
	if _, err := s.opts.Registry.Register(svc); err != nil {
		var ce *registry.ConflictError
		switch {
		case errors.As(err, &ce):
			return nil, validation(codec.Errorf(codec.InvalidRegistration, "", "%s", ce.Msg))
		case errors.Is(err, registry.ErrTooManyServices):
			return nil, validation(codec.Errorf(codec.OutOfRange, "", "the service limit is reached"))
		default:
			// The endpoint passed syntax checks but the source could not
			// be set up for it.
			return nil, validation(codec.Errorf(codec.InvalidValue, "endpoint", "cannot subscribe to endpoint: %v", err))
		}
	}
	return codec.AppendRegistered(out, svc.InstanceID), nil
}

func (s *Server) unregister(ctx *fasthttp.RequestCtx, out []byte) ([]byte, *apiError) {
	req, e := codec.DecodeUnregister(ctx.PostBody(), s.opts.Limits)
	if e != nil {
		return nil, validation(e)
	}
	key := registry.KeyOf(req.InstanceID, req.TenantID, req.DPRank)
	if err := s.opts.Registry.Unregister(key); err != nil {
		if errors.Is(err, registry.ErrNotFound) {
			return nil, serviceError(fasthttp.StatusNotFound, "service not found: "+string(key))
		}
		return nil, serviceError(fasthttp.StatusInternalServerError, err.Error())
	}
	return codec.AppendUnregistered(out, key), nil
}

// queryState is pooled so a /query allocates nothing once warm: the token
// buffer and the result slices are reused.
type queryState struct {
	req codec.QueryRequest
	res index.QueryResult
}

var queryPool = sync.Pool{New: func() any { return new(queryState) }}

func (s *Server) query(ctx *fasthttp.RequestCtx, out []byte) ([]byte, *apiError) {
	q := queryPool.Get().(*queryState)
	defer queryPool.Put(q)
	if e := s.opts.TokenMemo.DecodeQuery(ctx.PostBody(), s.opts.Limits, &q.req); e != nil {
		return nil, validation(e)
	}
	r := &q.req
	q.res.Instances = q.res.Instances[:0]
	tbl := s.opts.Index.Table(index.ContextKey{Tenant: r.TenantID, Model: r.Model, Lora: r.LoraName, BlockSize: r.BlockSize})
	if tbl != nil {
		s.opts.TokenMemo.Remember(r)
		ch := hashing.AcquireChain()
		ch.Reset(tbl.Profile(), r.BlockSize, r.Tokens, r.LoraName, r.CacheSalt)
		if r.TokensShared() {
			ch.KeepTokens() // the prefix memo need not copy them
		}
		ch.UseMemo(s.opts.Memo)
		tbl.Query(ch, r.InstanceID, &q.res)
		hashing.ReleaseChain(ch)
	}
	return codec.AppendQuery(out, &q.res), nil
}

func (s *Server) services(_ *fasthttp.RequestCtx, out []byte) ([]byte, *apiError) {
	return codec.AppendServices(out, s.opts.Registry.Services()), nil
}

func (s *Server) globalView(_ *fasthttp.RequestCtx, out []byte) ([]byte, *apiError) {
	return codec.AppendGlobalView(out, s.opts.Registry.Contexts()), nil
}

func (s *Server) healthz(_ *fasthttp.RequestCtx, out []byte) ([]byte, *apiError) {
	return codec.AppendStatus(out, "ok", -1), nil
}

// readyz is 200 once every static registration has connected; until then,
// 503 with the same body, so orchestrators hold traffic back.
func (s *Server) readyz(_ *fasthttp.RequestCtx, out []byte) ([]byte, *apiError) {
	ready, stale := true, 0
	if s.opts.Ready != nil {
		ready, stale = s.opts.Ready()
	}
	if !ready {
		return nil, serviceError(fasthttp.StatusServiceUnavailable, "static registrations are not connected yet")
	}
	return codec.AppendStatus(out, "ready", stale), nil
}

// fasthttpLogger routes fasthttp's own messages (connection errors, limit
// refusals) into the structured log at debug level: they are client faults,
// already answered, and would otherwise bypass the configured format.
type fasthttpLogger struct{ log zerolog.Logger }

func (l fasthttpLogger) Printf(format string, args ...any) {
	l.log.Debug().Str("component", "http").Msgf(format, args...)
}
