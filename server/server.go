// Package server is the HTTP front door: it routes the contract's five
// endpoints, checks method and content type, and turns handler results and
// typed errors into MessagePack responses (JSON for the read-only
// endpoints when the client's Accept asks for it, and for the health
// routes unless it asks for MessagePack).
package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/mooncake-conductor-go/conductor/codec"
	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/bearer"
	"github.com/mooncake-conductor-go/conductor/internal/contexts"
	"github.com/mooncake-conductor-go/conductor/internal/query"
	"github.com/mooncake-conductor-go/conductor/internal/tokenmemo"
	"github.com/mooncake-conductor-go/conductor/registry"
)

// Options configure a Server. Zero values take the documented defaults.
type Options struct {
	Registry *registry.Registry
	// Contexts is where /query finds a context's table and hash profile
	// (the catalogue the registry writes).
	Contexts *contexts.Catalogue
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
	// Engine answers /query and /debug/explain (the one engine both doors
	// share, with its caches); nil builds one over Contexts without caches.
	Engine *query.Engine
	// TokenMemo, when set, lets warm queries copy the token ids of a body
	// prefix seen before (on either door) instead of decoding them: the
	// token memo both doors share. Its owner forgets it (the service,
	// once nothing is left to look up; the engine knows nothing of it).
	TokenMemo *tokenmemo.Memo
	// AuthToken, when non-empty, is the bearer token /register and
	// /unregister require. Off by default so the drop-in stays compatible.
	AuthToken string
	// Ready reports readiness for GET /readyz: whether the service is
	// ready to be routed to, why not when it is not (the 503's message),
	// and how many sources are stale.
	Ready func() (ready bool, reason string, staleSources int)
	// Snapshot, when set, serves GET /snapshot: it writes a consistent
	// snapshot of the index for a peer replica to start from. It needs
	// the bearer token when one is configured.
	Snapshot func(io.Writer) error
	// DebugRoutes serves the operator routes (POST /debug/explain). Off
	// by default: off, they answer 404 like any unknown path.
	DebugRoutes bool
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
	opts  Options
	token bearer.Token
	query *query.Engine
	// memo is the door's use of the token memo (Options.TokenMemo): /query
	// bodies' MessagePack token arrays, whose ids the memo may take.
	memo tokenmemo.Door
	fs   *fasthttp.Server
	// lingering is the open connections, for the one that must linger
	// after a 413 (linger.go).
	lingering lingerSet
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
	if opts.Engine == nil {
		opts.Engine = query.New(query.Options{Contexts: opts.Contexts, MaxTokens: opts.Limits.MaxTokens})
	}
	s := &Server{opts: opts, token: bearer.New(opts.AuthToken), query: opts.Engine}
	s.memo = tokenmemo.Door{Memo: opts.TokenMemo, Format: tokenmemo.MsgPack, Own: true}
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
func (s *Server) Serve(ln net.Listener) error {
	return s.fs.Serve(newLingerListener(ln, s.opts.ReadTimeout, &s.lingering))
}

// Shutdown stops accepting, ends the lingering of connections refused
// with 413 (linger.go), waits for in-flight requests until ctx ends
// (then it returns ctx's error, and the requests still running go on
// until the process exits) and closes idle connections.
func (s *Server) Shutdown(ctx context.Context) error {
	s.lingering.stop()
	return s.fs.ShutdownWithContext(ctx)
}

// A handler returns the response body or an error; errorBody turns every
// error into a status and an envelope in one place. The errors handlers
// return are a closed set: validation errors (*codec.Error from decoding,
// *query.Error from the engine's own rules), the registry's typed errors, and *httpError for what the
// server itself refuses. Anything else is a 500.
type handler func(s *Server, ctx *fasthttp.RequestCtx, out []byte) ([]byte, error)

// errorKind is a refusal decided by the server itself, not by a request's
// content.
type errorKind uint8

const (
	errNotFound     errorKind = iota + 1 // 404: no such route
	errMethod                            // 405: wrong method for the route
	errUnauthorized                      // 401: bearer token missing or wrong
	errUnavailable                       // 503: not ready
	errInternal                          // 500: a handler failed
	errMalformed                         // 400: fasthttp could not parse the request
	errTooLarge                          // 413: the body is over the limit
	errReadTimeout                       // 408: the request did not arrive in time
)

var kindStatus = [...]int{
	errNotFound:     fasthttp.StatusNotFound,
	errMethod:       fasthttp.StatusMethodNotAllowed,
	errUnauthorized: fasthttp.StatusUnauthorized,
	errUnavailable:  fasthttp.StatusServiceUnavailable,
	errInternal:     fasthttp.StatusInternalServerError,
	errMalformed:    fasthttp.StatusBadRequest,
	errTooLarge:     fasthttp.StatusRequestEntityTooLarge,
	errReadTimeout:  fasthttp.StatusRequestTimeout,
}

// queryReasons are the contract's names of the query engine's refusals.
var queryReasons = [...]codec.Reason{
	query.Missing:      codec.Missing,
	query.InvalidValue: codec.InvalidValue,
	query.OutOfRange:   codec.OutOfRange,
}

// httpError is rendered as the {error} envelope with its kind's status.
type httpError struct {
	kind errorKind
	msg  string
}

func (e *httpError) Error() string { return e.msg }

// errorBody is the one mapping from a handler's error to a status and the
// body the contract prescribes: 400 with {error, reason, field?, index?}
// for validation and registration errors, {error} with the status for
// everything else.
func errorBody(out []byte, err error) (status int, body []byte) {
	var (
		ve *codec.Error
		qe *query.Error
		ee *query.EntryError
		re *registry.RuleError
		ce *registry.ConflictError
		se *registry.SourceError
		he *httpError
	)
	switch {
	case errors.As(err, &ve):
		return fasthttp.StatusBadRequest, codec.AppendError(out, ve)
	case errors.As(err, &qe):
		return fasthttp.StatusBadRequest, codec.AppendError(out, &codec.Error{Reason: queryReasons[qe.Reason], Field: qe.Field, Index: codec.NoIndex, Msg: qe.Msg})
	case errors.As(err, &ee):
		return fasthttp.StatusBadRequest, codec.AppendError(out, &codec.Error{Reason: codec.InvalidValue, Field: ee.Field, Index: ee.Index, Msg: ee.Msg})
	case errors.As(err, &re):
		reason := codec.InvalidValue
		if re.Missing {
			reason = codec.Missing
		}
		return fasthttp.StatusBadRequest, codec.AppendError(out, &codec.Error{Reason: reason, Field: re.Field, Index: codec.NoIndex, Msg: re.Msg})
	case errors.As(err, &ce):
		return fasthttp.StatusBadRequest, codec.AppendError(out, codec.Errorf(codec.InvalidRegistration, "", "%s", ce.Msg))
	case errors.Is(err, registry.ErrTooManyServices):
		return fasthttp.StatusBadRequest, codec.AppendError(out, codec.Errorf(codec.OutOfRange, "", "the service limit is reached"))
	case errors.As(err, &se):
		// The endpoint passed the rules but no source could be set up.
		return fasthttp.StatusBadRequest, codec.AppendError(out, codec.Errorf(codec.InvalidValue, "endpoint", "cannot subscribe to endpoint: %v", err))
	case errors.Is(err, registry.ErrNotFound):
		return fasthttp.StatusNotFound, codec.AppendMessage(out, err.Error())
	case errors.Is(err, registry.ErrNotRecorded):
		// Nothing changed: the state directory cannot take writes.
		return fasthttp.StatusServiceUnavailable, codec.AppendMessage(out, err.Error())
	case errors.As(err, &he):
		return kindStatus[he.kind], codec.AppendMessage(out, he.msg)
	}
	return fasthttp.StatusInternalServerError, codec.AppendMessage(out, err.Error())
}

// route is one path's contract. A route answers through h (a buffered
// body, rendered as MessagePack or JSON) or, when its response is not a
// buffered body (the Prometheus exposition, the streamed snapshot),
// through raw, which writes it itself; either way the method, token and
// content-type checks, the error envelope and panic recovery are the
// table's, the same for every route.
type route struct {
	method string
	// msgpack: the request body must be MessagePack. cli is then the
	// subcommand that sends the route's requests from JSON, named in the
	// answer to a JSON body (jsonHint).
	msgpack bool
	cli     string
	// token: the bearer token is required when one is configured (the
	// routes that change registrations or hand out the index).
	token bool
	// json: the route answers JSON, success and errors alike, when the
	// request's Accept prefers application/json (see wantsJSON). Every
	// other route answers only its errors in JSON then.
	json bool
	// plain: the route is for any HTTP client (probes, curl, load
	// balancers), not only a Conductor client, so it answers JSON unless
	// Accept names application/msgpack before application/json: a plain
	// `curl /healthz` reads text, a MessagePack client still gets
	// MessagePack (docs/operations.md#health). The contract does not
	// define these routes.
	plain bool
	h     handler
	raw   func(s *Server, ctx *fasthttp.RequestCtx)
	// enabled, when set, says whether the route is served with these
	// options; otherwise it is 404 like any unknown path.
	enabled func(o *Options) bool
}

// routes is the whole HTTP surface. /debug/explain is served only with
// Options.DebugRoutes: explaining a prompt is a separate route rather than
// a flag on /query so that /query's contract response and its hot path
// stay exactly as they are whatever a client sends, and so that a proxy
// can keep operators' routes apart by path.
var routes = map[string]route{
	"/register":   {method: fasthttp.MethodPost, msgpack: true, cli: "register", token: true, h: (*Server).register},
	"/unregister": {method: fasthttp.MethodPost, msgpack: true, cli: "unregister", token: true, h: (*Server).unregister},
	"/query":      {method: fasthttp.MethodPost, msgpack: true, cli: "query", h: (*Server).lookup},
	// /query_by_hash answers JSON on Accept too: a router that already
	// hashes prompts is often a script (docs/api.md#post-query_by_hash).
	"/query_by_hash": {method: fasthttp.MethodPost, msgpack: true, cli: "query-by-hash", json: true, h: (*Server).lookupByHash},
	"/services":      {method: fasthttp.MethodGet, json: true, h: (*Server).services},
	"/global_view":   {method: fasthttp.MethodGet, json: true, h: (*Server).globalView},
	"/healthz":       {method: fasthttp.MethodGet, json: true, plain: true, h: (*Server).healthz},
	"/readyz":        {method: fasthttp.MethodGet, json: true, plain: true, h: (*Server).readyz},
	"/metrics": {method: fasthttp.MethodGet, raw: func(s *Server, ctx *fasthttp.RequestCtx) { s.opts.Metrics(ctx) },
		enabled: func(o *Options) bool { return o.Metrics != nil }},
	snapshotPath: {method: fasthttp.MethodGet, token: true, raw: (*Server).serveSnapshot,
		enabled: func(o *Options) bool { return o.Snapshot != nil }},
	"/debug/explain": {method: fasthttp.MethodPost, msgpack: true, cli: "explain", json: true, h: (*Server).explain,
		enabled: func(o *Options) bool { return o.DebugRoutes }},
}

// route finds the route for path among those these options serve.
func (s *Server) route(path []byte) (route, bool) {
	rt, ok := routes[string(path)]
	if !ok || (rt.enabled != nil && !rt.enabled(&s.opts)) {
		return route{}, false
	}
	return rt, true
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

// Handle is the fasthttp handler for every request.
func (s *Server) Handle(ctx *fasthttp.RequestCtx) {
	start := time.Now()
	rt, known := s.route(ctx.Path())
	bp := bufPool.Get().(*[]byte)
	out := (*bp)[:0]
	out, wrote, err := s.dispatch(ctx, rt, known, out)
	status := fasthttp.StatusOK
	switch {
	case err != nil:
		status, out = errorBody(out[:0], err)
		if status == fasthttp.StatusServiceUnavailable && string(ctx.Path()) == "/readyz" {
			// Not ready yet is the expected answer during start-up and
			// catch-up, asked every few seconds by the probe.
			s.opts.Logger.Debug().Str("path", "/readyz").Str("reason", err.Error()).Msg("not ready")
		} else if status >= 500 {
			s.opts.Logger.Error().Str("path", string(ctx.Path())).Str("error", err.Error()).Msg("request failed")
		}
	case wrote:
		status = ctx.Response.StatusCode()
	}
	if !wrote {
		ctx.SetStatusCode(status)
		// Errors answer JSON on every route when asked, so a shell client
		// can read reason and field; success bodies of the POST routes stay
		// the contract's MessagePack whatever Accept says.
		if (rt.json || err != nil) && answerJSON(rt, ctx.Request.Header.Peek(fasthttp.HeaderAccept)) {
			s.setJSON(ctx, out)
		} else {
			ctx.SetContentType("application/msgpack")
			ctx.SetBody(out)
		}
	}
	*bp = out
	bufPool.Put(bp)
	s.observe(ctx.Path(), known, status, start)
}

func (s *Server) observe(path []byte, known bool, status int, start time.Time) {
	if s.opts.Observer == nil {
		return
	}
	label := "other" // client-chosen paths must not become label values
	if known {
		label = string(path)
	}
	s.opts.Observer.ObserveRequest(label, status, time.Since(start))
}

// dispatch applies the route's checks and runs its handler, recovering a
// panic as a 500. wrote tells that a raw route wrote the response itself
// (and err is nil).
func (s *Server) dispatch(ctx *fasthttp.RequestCtx, rt route, known bool, out []byte) (res []byte, wrote bool, err error) {
	defer func() {
		if r := recover(); r != nil {
			s.opts.Logger.Error().Interface("panic", r).Str("path", string(ctx.Path())).Msg("handler panicked")
			ctx.Response.Reset()
			res, wrote, err = nil, false, &httpError{errInternal, "internal error"}
		}
	}()
	if !known {
		return nil, false, &httpError{errNotFound, "not found: " + string(ctx.Path())}
	}
	if string(ctx.Method()) != rt.method {
		ctx.Response.Header.Set("Allow", rt.method)
		return nil, false, &httpError{errMethod, "method not allowed; use " + rt.method}
	}
	if rt.token {
		if err := s.checkToken(ctx); err != nil {
			return nil, false, err
		}
	}
	if rt.msgpack && !isMsgpack(ctx.Request.Header.ContentType()) {
		return nil, false, jsonHint(ctx, rt, codec.Errorf(codec.UnsupportedContentType, "", "Content-Type must contain application/msgpack"))
	}
	if rt.raw != nil {
		rt.raw(s, ctx)
		return out, true, nil
	}
	res, err = rt.h(s, ctx, out)
	if err != nil && rt.msgpack {
		err = jsonHint(ctx, rt, err)
	}
	return res, false, err
}

// jsonHint is the one place a MessagePack route's refusal of a JSON
// request (a JSON Content-Type, or a body whose first byte opens a JSON
// object or array) says that JSON is the command line's: the reason stays
// what the body got, the message says what to do (codec.JSONHint).
func jsonHint(ctx *fasthttp.RequestCtx, rt route, err error) error {
	var ve *codec.Error
	if !errors.As(err, &ve) || (ve.Reason != codec.UnsupportedContentType && ve.Reason != codec.InvalidMsgpack) {
		return err
	}
	isJSON := codec.LooksLikeJSON(ctx.PostBody()) || isJSONType(ctx.Request.Header.ContentType())
	return codec.JSONHint(ve, isJSON, rt.cli)
}

// isJSONType reports whether a Content-Type names JSON (application/json,
// or a +json type).
func isJSONType(ct []byte) bool {
	mt, _, _ := bytes.Cut(ct, []byte(";"))
	mt = bytes.ToLower(bytes.TrimSpace(mt))
	return bytes.Equal(mt, []byte("application/json")) || bytes.HasSuffix(mt, []byte("+json"))
}

// checkToken is the rule of every route that needs the bearer token: nil
// when none is configured or the request carries it, otherwise the 401
// with its challenge header.
func (s *Server) checkToken(ctx *fasthttp.RequestCtx) error {
	if s.token.Allows(ctx.Request.Header.Peek(fasthttp.HeaderAuthorization)) {
		return nil
	}
	ctx.Response.Header.Set("WWW-Authenticate", `Bearer realm="conductor"`)
	return &httpError{errUnauthorized, "a valid bearer token is required"}
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

// acceptChoice is which of the service's two encodings an Accept header
// names first.
type acceptChoice uint8

const (
	acceptNeither acceptChoice = iota // no header, */*, text/plain, ...
	acceptJSON
	acceptMsgpack
)

// accepted returns the first of application/json and application/msgpack
// an Accept header names (quality values are not weighed).
func accepted(accept []byte) acceptChoice {
	for len(accept) > 0 {
		var item []byte
		item, accept, _ = bytes.Cut(accept, []byte(","))
		mt, _, _ := bytes.Cut(item, []byte(";"))
		mt = bytes.TrimSpace(mt)
		switch {
		case bytes.EqualFold(mt, []byte("application/json")):
			return acceptJSON
		case bytes.EqualFold(mt, msgpackType):
			return acceptMsgpack
		}
	}
	return acceptNeither
}

// wantsJSON reports whether an Accept header asks for JSON before
// MessagePack: a header naming neither, or no header, keeps MessagePack,
// the contract's encoding.
func wantsJSON(accept []byte) bool { return accepted(accept) == acceptJSON }

// answerJSON is whether route rt answers a request with this Accept in
// JSON: when the client prefers JSON, and on the plain routes also when it
// names neither encoding (a probe, curl without -H).
func answerJSON(rt route, accept []byte) bool {
	switch accepted(accept) {
	case acceptJSON:
		return true
	case acceptNeither:
		return rt.plain
	}
	return false
}

// setJSON answers with the JSON form of the MessagePack body out.
func (s *Server) setJSON(ctx *fasthttp.RequestCtx, out []byte) {
	js, err := codec.AppendJSON(nil, out)
	if err != nil {
		// Only a bug in an encoder gets here: the body is ours.
		s.opts.Logger.Error().Err(err).Str("path", string(ctx.Path())).Msg("response has no JSON form")
		ctx.SetStatusCode(fasthttp.StatusInternalServerError)
		js = []byte(`{"error":"internal error"}`)
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(js)
}

// transportError answers requests fasthttp could not parse, including bodies
// over the limit, with the {error} envelope, in JSON when Accept prefers
// it, as every other error. fasthttp closes the connection after it; a
// body over the limit is refused before it is read, so that connection
// lingers to let the client finish sending and read the 413 (linger.go).
func (s *Server) transportError(ctx *fasthttp.RequestCtx, err error) {
	he := &httpError{errMalformed, "malformed HTTP request"}
	var te interface{ Timeout() bool }
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		he = &httpError{errTooLarge, fmt.Sprintf("request body is over the limit of %d bytes", s.opts.MaxBodyBytes)}
		s.lingering.lingerAfter413(ctx)
	case errors.As(err, &te) && te.Timeout():
		he = &httpError{errReadTimeout, "request read timed out"}
	}
	status, out := errorBody(nil, he)
	ctx.SetStatusCode(status)
	if wantsJSON(ctx.Request.Header.Peek(fasthttp.HeaderAccept)) {
		s.setJSON(ctx, out)
		return
	}
	ctx.SetContentType("application/msgpack")
	ctx.SetBody(out)
}

func (s *Server) register(ctx *fasthttp.RequestCtx, out []byte) ([]byte, error) {
	reg, e := codec.DecodeRegister(ctx.PostBody(), s.opts.Limits)
	if e != nil {
		return nil, e
	}
	svc, err := registry.NewService(reg)
	if err != nil {
		return nil, err
	}
	if _, err := s.opts.Registry.Register(svc); err != nil {
		return nil, err
	}
	return codec.AppendRegistered(out, svc.InstanceID), nil
}

func (s *Server) unregister(ctx *fasthttp.RequestCtx, out []byte) ([]byte, error) {
	req, e := codec.DecodeUnregister(ctx.PostBody(), s.opts.Limits)
	if e != nil {
		return nil, e
	}
	key := registry.KeyOf(req.InstanceID, req.TenantID, req.DPRank)
	if err := s.opts.Registry.Unregister(key); err != nil {
		return nil, err
	}
	return codec.AppendUnregistered(out, key), nil
}

// resultPool keeps lookup results, whose slices a warm /query reuses.
var resultPool = sync.Pool{New: func() any { return new(query.Result) }}

func (s *Server) lookup(ctx *fasthttp.RequestCtx, out []byte) ([]byte, error) {
	res := resultPool.Get().(*query.Result)
	defer resultPool.Put(res)
	if err := s.lookupBody(ctx.PostBody(), res); err != nil {
		return nil, err
	}
	return codec.AppendQuery(out, res), nil
}

// queryBody is a /query body decoded, and its use of the token memo.
type queryBody struct {
	q    codec.QueryRequest
	memo tokenmemo.Session
}

// bodyPool holds decoded bodies, so a /query allocates nothing once their
// buffers have grown.
var bodyPool = sync.Pool{New: func() any { return new(queryBody) }}

// lookupBody answers a /query body into res: decode (through the token
// memo, whose door wrapper supplies the ids it knows), one engine call,
// and then, when the body's context exists, the memo learns the array
// (docs/architecture.md, "The gRPC door"). A query for a context nobody
// registered leaves both memos as they were.
func (s *Server) lookupBody(body []byte, res *query.Result) error {
	b := bodyPool.Get().(*queryBody)
	defer bodyPool.Put(b)
	defer b.memo.Forget() // it may hold views into the body
	q := &b.q
	var hook codec.TokenHook
	if s.memo.Memo != nil {
		b.memo.Begin(&s.memo)
		hook = &b.memo
	}
	if d := codec.DecodeQueryHook(body, s.opts.Limits, q, hook); d != nil {
		return d
	}
	known, err := s.query.Lookup(&query.Request{Context: queryContext(q), Instance: q.InstanceID, CacheSalt: q.CacheSalt, Tokens: q.Tokens, Shared: b.memo.Lent()}, res)
	if err != nil {
		return err
	}
	if known && b.memo.Teach() {
		q.DetachTokens()
	}
	return nil
}

// hashBodyPool holds decoded /query_by_hash bodies, whose lists a warm
// request reuses.
var hashBodyPool = sync.Pool{New: func() any { return new(codec.HashQueryRequest) }}

// lookupByHash answers POST /query_by_hash: /query's answer for the
// prompt whose block hashes the body lists.
func (s *Server) lookupByHash(ctx *fasthttp.RequestCtx, out []byte) ([]byte, error) {
	q := hashBodyPool.Get().(*codec.HashQueryRequest)
	defer func() {
		clear(q.Raw) // views into the body
		q.Raw = nil
		hashBodyPool.Put(q)
	}()
	if e := codec.DecodeHashQuery(ctx.PostBody(), s.opts.Limits, q); e != nil {
		return nil, e
	}
	res := resultPool.Get().(*query.Result)
	defer resultPool.Put(res)
	req := query.KeysRequest{
		Context:  index.ContextKey{Tenant: q.TenantID, Model: q.Model, Lora: q.LoraName, BlockSize: q.BlockSize},
		Instance: q.InstanceID, CacheSalt: q.CacheSalt, Field: q.Field, Values: q.Values, Raw: q.Raw,
	}
	if _, err := s.query.LookupKeys(&req, res); err != nil {
		return nil, err
	}
	return codec.AppendQuery(out, res), nil
}

// queryContext is the context a decoded /query names.
func queryContext(q *codec.QueryRequest) index.ContextKey {
	return index.ContextKey{Tenant: q.TenantID, Model: q.Model, Lora: q.LoraName, BlockSize: q.BlockSize}
}

// explain answers POST /debug/explain: for the /query body given, the
// block keys computed and, per owner, where its run stopped and why. The
// body is decoded in full, without the token memo, which it does not
// teach.
func (s *Server) explain(ctx *fasthttp.RequestCtx, out []byte) ([]byte, error) {
	var q codec.QueryRequest
	if d := codec.DecodeQuery(ctx.PostBody(), s.opts.Limits, &q); d != nil {
		return nil, d
	}
	x, err := s.query.Explain(&query.Request{Context: queryContext(&q), Instance: q.InstanceID, CacheSalt: q.CacheSalt, Tokens: q.Tokens})
	if err != nil {
		return nil, err
	}
	return codec.AppendExplain(out, x.ContextKnown, x.Blocks, x.Owners), nil
}

func (s *Server) services(ctx *fasthttp.RequestCtx, out []byte) ([]byte, error) {
	// The JSON form, for people, also says how each source is doing.
	withSource := wantsJSON(ctx.Request.Header.Peek(fasthttp.HeaderAccept))
	return codec.AppendServices(out, s.opts.Registry.Services(), withSource), nil
}

func (s *Server) globalView(_ *fasthttp.RequestCtx, out []byte) ([]byte, error) {
	return codec.AppendGlobalView(out, s.opts.Registry.Contexts()), nil
}

func (s *Server) healthz(_ *fasthttp.RequestCtx, out []byte) ([]byte, error) {
	return codec.AppendStatus(out, "ok", -1), nil
}

// readyz is 200 with {status: ready, stale_sources} once Ready says so
// (static registrations connected, restored sources caught up); until then
// 503 with the reason as {error}, so orchestrators hold traffic back.
func (s *Server) readyz(_ *fasthttp.RequestCtx, out []byte) ([]byte, error) {
	ready, reason, stale := true, "", 0
	if s.opts.Ready != nil {
		ready, reason, stale = s.opts.Ready()
	}
	if !ready {
		return nil, &httpError{errUnavailable, reason}
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
