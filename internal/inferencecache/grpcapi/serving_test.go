package grpcapi

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	pb "github.com/mooncake-conductor-go/conductor/internal/inferencecache/proto/inferencecache/v1alpha1"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
)

func TestHealthFollowsReadiness(t *testing.T) {
	var ready atomic.Bool
	f := newFixture(t, func(o *Options) { o.Ready = ready.Load; o.ReadyPoll = 10 * time.Millisecond })
	h := healthpb.NewHealthClient(f.conn)
	statusOf := func(svc string) healthpb.HealthCheckResponse_ServingStatus {
		r, err := h.Check(ctx(t), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			t.Fatal(err)
		}
		return r.Status
	}
	for _, svc := range []string{"", ServiceName} {
		if s := statusOf(svc); s != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Fatalf("%q before ready: %v", svc, s)
		}
	}
	ready.Store(true)
	for _, svc := range []string{"", ServiceName} {
		eventtest.Eventually(t, "SERVING", func() bool { return statusOf(svc) == healthpb.HealthCheckResponse_SERVING })
	}
	ready.Store(false)
	eventtest.Eventually(t, "NOT_SERVING again", func() bool { return statusOf(ServiceName) == healthpb.HealthCheckResponse_NOT_SERVING })
}

func TestReflectionListsTheService(t *testing.T) {
	f := newFixture(t, nil)
	st, err := reflectpb.NewServerReflectionClient(f.conn).ServerReflectionInfo(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&reflectpb.ServerReflectionRequest{MessageRequest: &reflectpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	r, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, s := range r.GetListServicesResponse().GetService() {
		found = found || s.GetName() == ServiceName
	}
	if !found {
		t.Fatalf("reflection lists %v", r.GetListServicesResponse())
	}
	_ = st.CloseSend()
}

func TestBearerTokenOnProducerCalls(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.AuthToken = "s3cret" })
	u := update("a", chainEntry(t1, 16, 1, 2, 3, 4))
	for _, md := range []metadata.MD{nil, metadata.Pairs("authorization", "Bearer wrong"), metadata.Pairs("authorization", "s3cret")} {
		if err := f.report(md, u); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("ReportCacheState with %v: %v", md, err)
		}
		c := ctx(t)
		if md != nil {
			c = metadata.NewOutgoingContext(c, md)
		}
		if _, err := f.client.PublishEvent(c, &pb.CacheEvent{}); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("PublishEvent with %v: %v", md, err)
		}
	}
	if got := f.lookup(chainReq("vllm", 16, 1, 2, 3, 4)); got.ReasonCode != UnknownTenant {
		t.Fatalf("an unauthenticated report got through: %v", got)
	}
	if err := f.report(metadata.Pairs("authorization", "Bearer s3cret"), u); err != nil {
		t.Fatal(err)
	}
	// Lookups stay open, like /query.
	if got := f.lookup(chainReq("vllm", 16, 1, 2, 3, 4)); got.ReasonCode != PrefixMatch {
		t.Fatalf("after an authenticated report: %v", got)
	}
	if n := counterValue(t, f.reg, "conductor_grpc_requests_total", "code", "Unauthenticated"); n != 6 {
		t.Fatalf("unauthenticated calls counted %v", n)
	}
}

// writeCert writes a self-signed certificate for 127.0.0.1 with the given
// serial and returns its pool.
func writeCert(t *testing.T, certFile, keyFile string, serial int64) *x509.CertPool {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "conductor test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	// Write to temporary names and rename, as a rotation would.
	for path, block := range map[string]*pem.Block{certFile: {Type: "CERTIFICATE", Bytes: der}, keyFile: {Type: "EC PRIVATE KEY", Bytes: kb}} {
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	c, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(c)
	return pool
}

func TestTLSHandshakeAndReload(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	pool1 := writeCert(t, certFile, keyFile, 1)
	f := newFixture(t, func(o *Options) { o.TLSCert, o.TLSKey = certFile, keyFile })

	dial := func(pool *x509.CertPool, cfg *tls.Config) (*tls.ConnectionState, error) {
		if cfg == nil {
			cfg = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		}
		var state tls.ConnectionState
		creds := credentials.NewTLS(cfg)
		conn, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(&stateCreds{creds, &state}))
		if err != nil {
			return nil, err
		}
		defer conn.Close()
		_, err = pb.NewInferenceCacheClient(conn).RenderTemplate(ctx(t), &pb.RenderTemplateRequest{})
		return &state, err
	}
	st, err := dial(pool1, nil)
	if err != nil {
		t.Fatalf("TLS call: %v", err)
	}
	if st.PeerCertificates[0].SerialNumber.Int64() != 1 || st.Version < tls.VersionTLS12 {
		t.Fatalf("serial %v version %x", st.PeerCertificates[0].SerialNumber, st.Version)
	}
	// TLS 1.1 is refused.
	if _, err := dial(nil, &tls.Config{InsecureSkipVerify: true, MaxVersion: tls.VersionTLS11}); err == nil {
		t.Fatal("a TLS 1.1 client got through")
	}
	// Rotate: the next handshake serves the new certificate. The mtime
	// may not move within its granularity, so the size differs too.
	pool2 := writeCert(t, certFile, keyFile, 1<<40)
	eventtest.Eventually(t, "the rotated certificate", func() bool {
		st, err := dial(pool2, nil)
		return err == nil && st.PeerCertificates[0].SerialNumber.Int64() == 1<<40
	})
}

// stateCreds records the client's view of the TLS connection.
type stateCreds struct {
	credentials.TransportCredentials
	state *tls.ConnectionState
}

func (c *stateCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ClientHandshake(ctx, authority, raw)
	if ti, ok := info.(credentials.TLSInfo); ok {
		*c.state = ti.State
	}
	return conn, info, err
}

func TestTLSNeedsBothFiles(t *testing.T) {
	_, err := New(Options{TLSCert: "x.pem"})
	if err == nil {
		t.Fatal("a certificate without a key was accepted")
	}
	if errors.Is(err, os.ErrNotExist) {
		t.Fatal("checked the file before the pairing")
	}
}

func TestFailOpenStubs(t *testing.T) {
	f := newFixture(t, nil)
	rt, err := f.client.RenderTemplate(ctx(t), &pb.RenderTemplateRequest{TemplateRef: "x", Variables: map[string]string{"a": "b"}})
	if err != nil || rt.ReasonCode != "OK" || len(rt.StablePrefixHash) != 0 || len(rt.RenderedPrompt) != 0 {
		t.Fatalf("RenderTemplate: %v %v", rt, err)
	}
	pd, err := f.client.LookupPDRoute(ctx(t), &pb.LookupPDRouteRequest{TenantId: "t", ModelId: "m"})
	if err != nil || pd.ReasonCode != NoHint || pd.PrefillReplicaId != "" || pd.DecodeReplicaId != "" {
		t.Fatalf("LookupPDRoute: %v %v", pd, err)
	}
}

// TestConcurrentLookupsKeepTheirOwnRequests: lookups decoded into pooled
// buffers, many at once over one connection, each get the answer to their
// own request — chains of different lengths and tenants, adapters echoed —
// so no call sees another's (or a released call's) memory.
func TestConcurrentLookupsKeepTheirOwnRequests(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.MinMatchedTokens = -1 })
	const tenants, depth = 4, 96
	keys := make([][]uint64, tenants)
	for tn := range tenants {
		keys[tn] = make([]uint64, depth)
		for i := range keys[tn] {
			keys[tn][i] = uint64(tn*depth+i)*0x9e3779b97f4a7c15 + 3
		}
		// The replica holds the first 32·(tn+1) blocks.
		u := &pb.CacheStateUpdate{ReplicaId: fmt.Sprintf("r%d", tn), TenantId: fmt.Sprintf("t%d", tn), ModelId: "m", HashScheme: "vllm",
			AdapterId: "a", Prefixes: []*pb.PrefixEntry{chainEntry(t1, 16, keys[tn][:24*(tn+1)]...)}}
		f.mustReport(u)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 150 {
				tn := (g + i) % tenants
				n := 1 + (g*31+i*17)%depth // a prefix of the chain, of varying length
				req := chainReq("vllm", 16, keys[tn][:n]...)
				req.TenantId, req.AdapterId = fmt.Sprintf("t%d", tn), "a"
				resp, err := f.client.LookupRoute(ctx(t), req)
				if err != nil {
					errs <- err
					return
				}
				want := 16 * min(n, 24*(tn+1))
				if resp.ReasonCode != PrefixMatch || len(resp.ReplicaScores) != 1 || resp.AdapterId != "a" ||
					resp.ReplicaScores[0].ReplicaId != fmt.Sprintf("r%d", tn) || int(resp.ReplicaScores[0].MatchedTokens) != want {
					errs <- fmt.Errorf("tenant %d, %d blocks: %v, want %d tokens from r%d", tn, n, resp, want, tn)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
