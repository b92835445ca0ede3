// Package grpcapi is the InferenceCache gRPC front door: the eight RPCs of
// inferencecache.v1alpha1.InferenceCache, answered from the same index the
// Conductor HTTP API uses. Gateways look routes up (LookupRoute) either in
// a Conductor context, fed by ZMQ, or in a producer-fed scope, fed by
// ReportCacheState and PublishEvent; observers stream the index's changes
// and the service's metrics. docs/grpc.md describes the mapping.
package grpcapi

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/mooncake-conductor-go/conductor/internal/bearer"
	"github.com/mooncake-conductor-go/conductor/internal/contexts"
	"github.com/mooncake-conductor-go/conductor/internal/inferencecache/fingerprint"
	"github.com/mooncake-conductor-go/conductor/internal/inferencecache/producer"
	pb "github.com/mooncake-conductor-go/conductor/internal/inferencecache/proto/inferencecache/v1alpha1"
	"github.com/mooncake-conductor-go/conductor/internal/query"
	"github.com/mooncake-conductor-go/conductor/internal/tokenmemo"
)

// ServiceName is the gRPC service name health checks report on.
const ServiceName = "inferencecache.v1alpha1.InferenceCache"

// ProbeTenant is reserved for InferenceCache's functional self-test: lookups
// answer NO_HINT, producer messages are acknowledged and ignored, and it
// never appears in a read.
const ProbeTenant = "inferencecache.io/probe"

// Defaults of the Options.
const (
	DefaultMinMatchedTokens = 64
	DefaultScoreFloor       = 0.1
	DefaultLookupTimeout    = 100 * time.Millisecond
	DefaultMaxMsgBytes      = 16 << 20
	DefaultMaxStreams       = 1024
	DefaultMaxWatchers      = 256
	DefaultWatcherBuffer    = 8192
	DefaultMetricsInterval  = 5 * time.Second
	DefaultReadyPoll        = time.Second
	// MaxTokenIDs bounds LookupRoute's token_ids (2^20).
	MaxTokenIDs = 1 << 20
	// MaxChainBlocks bounds LookupRoute's block_hashes.
	MaxChainBlocks = 1 << 16
)

// Options configure a Server. Zero values take the defaults above.
type Options struct {
	// Contexts is the catalogue of Conductor contexts (their tables, in
	// its index beside the producer scopes, and hash profiles).
	Contexts *contexts.Catalogue
	Producer *producer.Store
	// Engine answers token_ids lookups on Conductor contexts: the one
	// engine /query uses, with its prefix memo and verified links, so both
	// doors give one answer for one prompt (nil builds one over Contexts
	// without caches).
	Engine *query.Engine
	// TokenMemo, when set, is the token memo both doors share, which lets
	// a lookup repeating a token_ids prefix seen before on either door
	// copy those ids instead of decoding them. Its owner forgets it (the
	// service, once neither a context nor a scope is left: scope lookups
	// use it too; the engine knows nothing of it).
	TokenMemo *tokenmemo.Memo
	Logger    zerolog.Logger
	// AuthToken, when set, is the bearer token ReportCacheState and
	// PublishEvent require (the one /register and /unregister require).
	AuthToken string
	// Ready reports readiness, as /readyz does; health follows it.
	Ready func() bool
	// ReadyPoll is how often health re-reads Ready.
	ReadyPoll time.Duration
	// TLSCert and TLSKey are PEM files; both or neither.
	TLSCert, TLSKey string
	// Registerer receives the gRPC metrics; Gatherer feeds StreamMetrics.
	Registerer prometheus.Registerer
	Gatherer   prometheus.Gatherer

	// LookupRoute ranking (docs/grpc.md, LookupRoute: Score, Filters and order).
	MinMatchedTokens int     // negative: no minimum
	ScoreFloor       float64 // negative: no floor
	NoAffinity       bool
	RequireChain     bool
	LookupTimeout    time.Duration
	// FingerprintBlockSize is the block size of the vllm/sglang schemes.
	FingerprintBlockSize int

	MaxMsgBytes     int
	MaxStreams      uint32
	MaxWatchers     int
	WatcherBuffer   int
	MetricsInterval time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Server serves InferenceCache over gRPC.
type Server struct {
	pb.UnimplementedInferenceCacheServer
	opts   Options
	gs     *grpc.Server
	health *health.Server
	hub    *hub
	m      *grpcMetrics
	codec  lookupCodec
	// query answers token_ids lookups on Conductor contexts, the engine
	// /query uses.
	query *query.Engine
	token bearer.Token
	// lookupInfo is what interceptors are told of every LookupRoute call.
	lookupInfo *grpc.UnaryServerInfo

	stop     chan struct{}
	done     sync.WaitGroup
	stopOnce sync.Once
}

// New builds a Server and installs its watcher on the index; it does not
// listen until Serve.
func New(opts Options) (*Server, error) {
	if opts.MinMatchedTokens == 0 {
		opts.MinMatchedTokens = DefaultMinMatchedTokens
	}
	if opts.ScoreFloor == 0 {
		opts.ScoreFloor = DefaultScoreFloor
	}
	if opts.LookupTimeout <= 0 {
		opts.LookupTimeout = DefaultLookupTimeout
	}
	if opts.FingerprintBlockSize <= 0 {
		opts.FingerprintBlockSize = fingerprint.DefaultBlockSize
	}
	if opts.MaxMsgBytes <= 0 {
		opts.MaxMsgBytes = DefaultMaxMsgBytes
	}
	if opts.MaxStreams == 0 {
		opts.MaxStreams = DefaultMaxStreams
	}
	if opts.MaxWatchers <= 0 {
		opts.MaxWatchers = DefaultMaxWatchers
	}
	if opts.WatcherBuffer <= 0 {
		opts.WatcherBuffer = DefaultWatcherBuffer
	}
	if opts.MetricsInterval <= 0 {
		opts.MetricsInterval = DefaultMetricsInterval
	}
	if opts.ReadyPoll <= 0 {
		opts.ReadyPoll = DefaultReadyPoll
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Ready == nil {
		opts.Ready = func() bool { return true }
	}
	if opts.Registerer == nil {
		opts.Registerer = prometheus.NewRegistry()
	}
	s := &Server{opts: opts, stop: make(chan struct{})}
	s.lookupInfo = &grpc.UnaryServerInfo{Server: s, FullMethod: pb.InferenceCache_LookupRoute_FullMethodName}
	s.token = bearer.New(opts.AuthToken)
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	s.m = m
	s.hub = newHub(opts.MaxWatchers, opts.WatcherBuffer, opts.Now, m)
	s.codec = newLookupCodec(opts.TokenMemo)
	if opts.Engine == nil {
		opts.Engine = query.New(query.Options{Contexts: opts.Contexts})
	}
	s.query = opts.Engine
	gopts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(opts.MaxMsgBytes),
		grpc.MaxSendMsgSize(opts.MaxMsgBytes),
		grpc.MaxConcurrentStreams(opts.MaxStreams),
		grpc.ForceServerCodecV2(s.codec),
		grpc.ChainUnaryInterceptor(s.unaryInterceptor),
		grpc.ChainStreamInterceptor(s.streamInterceptor),
	}
	if (opts.TLSCert == "") != (opts.TLSKey == "") {
		return nil, errors.New("grpc TLS needs both a certificate and a key file")
	}
	if opts.TLSCert != "" {
		r, err := newCertReloader(opts.TLSCert, opts.TLSKey, opts.Logger)
		if err != nil {
			return nil, err
		}
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(&tls.Config{
			MinVersion:     tls.VersionTLS12,
			GetCertificate: r.get,
			NextProtos:     []string{"h2"},
		})))
	}
	s.gs = grpc.NewServer(gopts...)
	s.gs.RegisterService(serviceDesc(), s)
	s.health = health.NewServer()
	healthpb.RegisterHealthServer(s.gs, s.health)
	reflection.Register(s.gs)
	s.setHealth(opts.Ready())
	s.done.Add(1)
	go s.pollReady()
	opts.Contexts.Index().SetWatcher(s.hub)
	return s, nil
}

// Serve accepts connections on ln until Stop.
func (s *Server) Serve(ln net.Listener) error {
	err := s.gs.Serve(ln)
	if errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return err
}

// stopGrace is how long Stop lets unary calls in flight finish.
const stopGrace = 3 * time.Second

// Stop ends every stream, waits briefly (stopGrace) for unary calls in
// flight, and stops the server's goroutines; it detaches the index watcher.
func (s *Server) Stop() {
	ctx, cancel := context.WithTimeout(context.Background(), stopGrace)
	defer cancel()
	s.Shutdown(ctx)
}

// Shutdown is Stop with the wait for unary calls in flight bounded by ctx:
// when ctx ends first, the calls still running are cut. Either way it
// returns once the server's goroutines are gone.
func (s *Server) Shutdown(ctx context.Context) {
	s.stopOnce.Do(func() {
		s.opts.Contexts.Index().SetWatcher(nil)
		close(s.stop)
		s.hub.closeAll()
		s.health.Shutdown()
		stopped := make(chan struct{})
		go func() { s.gs.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-ctx.Done():
			s.gs.Stop()
			<-stopped
		}
		s.done.Wait()
	})
}

func (s *Server) setHealth(ready bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ready {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.health.SetServingStatus("", st)
	s.health.SetServingStatus(ServiceName, st)
}

// pollReady keeps the health status equal to readiness.
func (s *Server) pollReady() {
	defer s.done.Done()
	tk := time.NewTicker(s.opts.ReadyPoll)
	defer tk.Stop()
	last := s.opts.Ready()
	for {
		select {
		case <-s.stop:
			return
		case <-tk.C:
			if r := s.opts.Ready(); r != last {
				last = r
				s.setHealth(r)
			}
		}
	}
}

// producerMethods need the bearer token when one is configured.
var producerMethods = map[string]bool{
	pb.InferenceCache_ReportCacheState_FullMethodName: true,
	pb.InferenceCache_PublishEvent_FullMethodName:     true,
}

// authorize checks the bearer token of a producer call, in constant time.
func (s *Server) authorize(ctx context.Context, method string) error {
	if !s.token.Required() || !producerMethods[method] {
		return nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("authorization") {
		if s.token.Allows([]byte(v)) {
			return nil
		}
	}
	return status.Error(codes.Unauthenticated, "a valid bearer token is required on producer calls")
}

// methodLabel is the short method name for metrics: known methods only, so
// clients cannot make up label values.
func methodLabel(full string) string {
	i := strings.LastIndexByte(full, '/')
	if i < 0 || !strings.HasPrefix(full, "/"+ServiceName+"/") {
		if strings.HasPrefix(full, "/grpc.health.v1.Health/") {
			return "Health/" + full[i+1:]
		}
		return "other"
	}
	return full[i+1:]
}

func (s *Server) unaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if r := recover(); r != nil {
			s.opts.Logger.Error().Interface("panic", r).Str("method", info.FullMethod).Msg("grpc handler panicked")
			resp, err = nil, status.Error(codes.Internal, "internal error")
		}
		s.m.call(info.FullMethod, status.Code(err))
	}()
	if err := s.authorize(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return h(ctx, req)
}

func (s *Server) streamInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) (err error) {
	defer func() {
		if r := recover(); r != nil {
			s.opts.Logger.Error().Interface("panic", r).Str("method", info.FullMethod).Msg("grpc handler panicked")
			err = status.Error(codes.Internal, "internal error")
		}
		s.m.call(info.FullMethod, status.Code(err))
	}()
	if err := s.authorize(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return h(srv, ss)
}

// RenderTemplate answers as InferenceCache's own server does: OK with
// every other field empty. An empty stable_prefix_hash tells the gateway
// to hash the prompt itself; there is no template store.
func (s *Server) RenderTemplate(context.Context, *pb.RenderTemplateRequest) (*pb.RenderTemplateResponse, error) {
	return &pb.RenderTemplateResponse{ReasonCode: "OK"}, nil
}

// LookupPDRoute answers NO_HINT, as InferenceCache's own server does:
// there is no prefill/decode topology to consult.
func (s *Server) LookupPDRoute(context.Context, *pb.LookupPDRouteRequest) (*pb.LookupPDRouteResponse, error) {
	return &pb.LookupPDRouteResponse{ReasonCode: NoHint}, nil
}
