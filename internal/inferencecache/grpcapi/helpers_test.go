package grpcapi

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/contexts"
	"github.com/mooncake-conductor-go/conductor/internal/inferencecache/producer"
	pb "github.com/mooncake-conductor-go/conductor/internal/inferencecache/proto/inferencecache/v1alpha1"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/fakeclock"
)

// fixture is a server on a real loopback TCP listener and a client to it.
type fixture struct {
	t      *testing.T
	ix     *index.Index
	cat    *contexts.Catalogue
	prod   *producer.Store
	srv    *Server
	reg    *prometheus.Registry
	clock  *fakeclock.Clock
	addr   string
	client pb.InferenceCacheClient
	conn   *grpc.ClientConn
}

func newFixture(t *testing.T, tune func(*Options)) *fixture {
	t.Helper()
	ix := index.New(index.Options{Stripes: 8})
	c := fakeclock.New(time.Unix(1_700_000_000, 0))
	prod := producer.New(producer.Options{Index: ix, TTL: 30 * time.Minute, Now: c.Now})
	reg := prometheus.NewRegistry()
	// A minute for lookups: the default 100 ms would answer TIMEOUT
	// whenever a busy CI machine keeps the handler off the CPU that long.
	cat := contexts.New(ix)
	opts := Options{Contexts: cat, Producer: prod, Logger: zerolog.New(io.Discard), Registerer: reg, Gatherer: reg, Now: c.Now,
		LookupTimeout: time.Minute}
	if tune != nil {
		tune(&opts)
	}
	srv, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	f := &fixture{t: t, ix: ix, cat: cat, prod: prod, srv: srv, reg: reg, clock: c, addr: ln.Addr().String()}
	if opts.TLSCert == "" {
		conn, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		f.conn, f.client = conn, pb.NewInferenceCacheClient(conn)
	}
	t.Cleanup(func() {
		if f.conn != nil {
			f.conn.Close()
		}
		srv.Stop()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		prod.Close()
	})
	return f
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

// key8 is a key as the wire carries it.
func key8(k uint64) []byte { return binary.BigEndian.AppendUint64(nil, k) }

// chainEntry is a PrefixEntry of keys, each block covering per tokens.
func chainEntry(tier pb.CacheTier, per int32, keys ...uint64) *pb.PrefixEntry {
	e := &pb.PrefixEntry{Tier: tier}
	for _, k := range keys {
		e.BlockHashes = append(e.BlockHashes, key8(k))
		e.BlockTokenCounts = append(e.BlockTokenCounts, per)
	}
	return e
}

// report sends updates on one ReportCacheState stream and checks the Ack.
func (f *fixture) report(md metadata.MD, updates ...*pb.CacheStateUpdate) error {
	f.t.Helper()
	c := ctx(f.t)
	if md != nil {
		c = metadata.NewOutgoingContext(c, md)
	}
	st, err := f.client.ReportCacheState(c)
	if err != nil {
		return err
	}
	for _, u := range updates {
		if err := st.Send(u); err != nil {
			if !errors.Is(err, io.EOF) {
				return err
			}
			break // the server ended the call: its status comes below
		}
	}
	ack, err := st.CloseAndRecv()
	if err != nil {
		return err
	}
	if !ack.GetAccepted() {
		f.t.Fatalf("ack not accepted: %v", ack)
	}
	return nil
}

func (f *fixture) mustReport(updates ...*pb.CacheStateUpdate) {
	f.t.Helper()
	if err := f.report(nil, updates...); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) lookup(req *pb.LookupRouteRequest) *pb.LookupRouteResponse {
	f.t.Helper()
	resp, err := f.client.LookupRoute(ctx(f.t), req)
	if err != nil {
		f.t.Fatalf("LookupRoute returned an error status: %v", err)
	}
	return resp
}

// chainReq is a chain lookup of keys, per tokens each.
func chainReq(scheme string, per int32, keys ...uint64) *pb.LookupRouteRequest {
	r := &pb.LookupRouteRequest{TenantId: "t", ModelId: "m", HashScheme: scheme}
	for _, k := range keys {
		r.BlockHashes = append(r.BlockHashes, key8(k))
		r.BlockTokenCounts = append(r.BlockTokenCounts, per)
	}
	return r
}

// wantPick is the affinity pick computed from the written-out rule.
func wantPick(seed []byte, replicas []string) string {
	sum := sha256.Sum256(seed)
	return replicas[binary.BigEndian.Uint64(sum[:8])%uint64(len(replicas))]
}

// chainSeed is a chain's affinity seed.
func chainSeed(hashes [][]byte) []byte {
	var out []byte
	for _, h := range hashes {
		out = binary.BigEndian.AppendUint32(out, uint32(len(h)))
		out = append(out, h...)
	}
	return out
}

func update(replica string, entries ...*pb.PrefixEntry) *pb.CacheStateUpdate {
	return &pb.CacheStateUpdate{ReplicaId: replica, TenantId: "t", ModelId: "m", HashScheme: "vllm", Prefixes: entries}
}

func scopeKey(tenant, model, scheme, adapter string) index.ScopeKey {
	return index.ScopeKey{Tenant: tenant, Model: model, Scheme: scheme, Adapter: adapter}
}
