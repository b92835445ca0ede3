package grpcapi

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"slices"
	"strings"

	"github.com/zeebo/xxh3"
	"google.golang.org/grpc"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/inferencecache/producer"
	pb "github.com/mooncake-conductor-go/conductor/internal/inferencecache/proto/inferencecache/v1alpha1"
)

// Reasons a producer entry is dropped (conductor_grpc_producer_entries_dropped_total).
const (
	dropNoScope     = "no_scope"        // empty replica, tenant or model: the whole update
	dropNoScheme    = "no_scheme"       // empty hash_scheme: the update's prefixes
	dropUnequal     = "unequal_chain"   // block_hashes and block_token_counts differ in length
	dropEmptyHash   = "empty_hash"      // a hash of zero bytes
	dropTokenCount  = "bad_token_count" // negative, or the sum past int32
	dropTier        = "bad_tier"        // not a CacheTier value
	dropEmptyEntry  = "empty_entry"     // neither chain nor prefix_hash
	dropProbeTenant = "probe_tenant"    // the reserved tenant: acknowledged, ignored
	dropReplicas    = "replica_limit"   // the scope has producer.MaxReplicasPerScope other replicas
)

var allDropReasons = []string{dropNoScope, dropNoScheme, dropUnequal, dropEmptyHash, dropTokenCount, dropTier, dropEmptyEntry, dropProbeTenant, dropReplicas}

// producerKey is the index key of a hash a producer sent: 8 bytes are the
// key big-endian, as every InferenceCache sidecar sends; any other length
// is reduced with XXH3-64, so arbitrary engine-opaque hashes still work
// (two distinct such hashes collide with probability about 2^-64).
func producerKey(b []byte) uint64 {
	if len(b) == 8 {
		return binary.BigEndian.Uint64(b)
	}
	return xxh3.Hash(b)
}

// producerTier maps a reported tier to the index tier that stores it: T1 is
// engine memory; T2 (host or offload memory) is kept in the owner's
// host-memory tier, which the answer reports as T2 like cpu_share; T3 is
// disk. UNSPECIFIED is T1.
func producerTier(t pb.CacheTier) (index.Tier, bool) {
	switch t {
	case pb.CacheTier_CACHE_TIER_UNSPECIFIED, pb.CacheTier_CACHE_TIER_T1:
		return index.Device, true
	case pb.CacheTier_CACHE_TIER_T2:
		return index.CPULocal, true
	case pb.CacheTier_CACHE_TIER_T3:
		return index.Disk, true
	}
	return 0, false
}

// ReportCacheState applies each update as it arrives and acknowledges once
// the client half-closes. Bad entries are dropped and counted; the rest
// apply.
func (s *Server) ReportCacheState(stream grpc.ClientStreamingServer[pb.CacheStateUpdate, pb.Ack]) error {
	for {
		u, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return stream.SendAndClose(&pb.Ack{Accepted: true})
		}
		if err != nil {
			return err
		}
		s.applyUpdate(u)
	}
}

// applyUpdate stores one CacheStateUpdate.
func (s *Server) applyUpdate(u *pb.CacheStateUpdate) {
	if u.GetTenantId() == ProbeTenant {
		s.m.dropped.WithLabelValues(dropProbeTenant).Add(float64(len(u.GetPrefixes())))
		return
	}
	if u.GetReplicaId() == "" || u.GetTenantId() == "" || u.GetModelId() == "" {
		s.m.dropped.WithLabelValues(dropNoScope).Add(float64(len(u.GetPrefixes())))
		return
	}
	rk := producer.ReplicaKey{Tenant: u.GetTenantId(), Model: u.GetModelId(), Replica: u.GetReplicaId()}
	st := s.opts.Producer
	// A snapshot's cut sees the update whole or not at all.
	defer st.Hold()()
	if x := u.GetStats(); x != nil {
		st.SetStats(rk, producer.Stats{CacheMemoryBytes: x.GetCacheMemoryBytes(), HitRate: x.GetHitRate(),
			Pressure: x.GetPressure(), ClientVersion: x.GetClientVersion(),
			T2HitTokens: x.GetT2HitTokens(), T2QueryTokens: x.GetT2QueryTokens()})
	} else {
		st.Touch(rk)
	}
	if u.GetHashScheme() == "" {
		s.m.dropped.WithLabelValues(dropNoScheme).Add(float64(len(u.GetPrefixes())))
		return
	}
	var (
		w       producer.Writer
		wAd     string
		haveW   bool
		applied int
	)
	for _, e := range u.GetPrefixes() {
		tier, ok := producerTier(e.GetTier())
		if !ok {
			s.m.dropped.WithLabelValues(dropTier).Inc()
			continue
		}
		if reason := checkEntry(e); reason != "" {
			s.m.dropped.WithLabelValues(reason).Inc()
			continue
		}
		ad := e.GetAdapterId()
		if ad == "" {
			ad = u.GetAdapterId()
		}
		if !haveW || ad != wAd {
			w = st.Writer(index.ScopeKey{Tenant: rk.Tenant, Model: rk.Model, Scheme: u.GetHashScheme(), Adapter: ad}, rk.Replica)
			wAd, haveW = ad, true
		}
		if w.Refused() {
			s.m.dropped.WithLabelValues(dropReplicas).Inc()
			continue
		}
		if hs := e.GetBlockHashes(); len(hs) > 0 {
			cum := int32(0)
			for i, h := range hs {
				cum += e.GetBlockTokenCounts()[i]
				w.Put(tier, producerKey(h), cum)
			}
			applied += len(hs)
			continue
		}
		w.Put(tier, producerKey(e.GetPrefixHash()), e.GetTokenCount())
		applied++
	}
	s.m.applied.Add(float64(applied))
}

// checkEntry validates a whole entry before any of it is applied, so an
// entry is stored entirely or not at all; it returns the drop reason.
func checkEntry(e *pb.PrefixEntry) string {
	hs, cs := e.GetBlockHashes(), e.GetBlockTokenCounts()
	if len(hs) > 0 || len(cs) > 0 {
		if len(hs) != len(cs) {
			return dropUnequal
		}
		sum := int64(0)
		for i, h := range hs {
			if len(h) == 0 {
				return dropEmptyHash
			}
			if cs[i] < 0 {
				return dropTokenCount
			}
			if sum += int64(cs[i]); sum > math.MaxInt32 {
				return dropTokenCount
			}
		}
		return ""
	}
	if len(e.GetPrefixHash()) == 0 {
		return dropEmptyEntry
	}
	if e.GetTokenCount() < 0 {
		return dropTokenCount
	}
	return ""
}

// PublishEvent applies a producer's delta. It always acknowledges:
// PREFIX_ADDED and TYPE_UNSPECIFIED change nothing (ReportCacheState is
// authoritative for additions), PREFIX_EVICTED removes the replica from the
// key, ALL_CLEARED removes the replica and its stats from (tenant, model),
// and every event counts as a sign of life.
func (s *Server) PublishEvent(_ context.Context, e *pb.CacheEvent) (*pb.Ack, error) {
	ack := &pb.Ack{Accepted: true}
	if e.GetTenantId() == ProbeTenant || e.GetReplicaId() == "" || e.GetTenantId() == "" || e.GetModelId() == "" {
		return ack, nil
	}
	rk := producer.ReplicaKey{Tenant: e.GetTenantId(), Model: e.GetModelId(), Replica: e.GetReplicaId()}
	st := s.opts.Producer
	defer st.Hold()()
	switch e.GetType() {
	case pb.CacheEvent_PREFIX_EVICTED:
		st.Refresh(rk)
		if h := e.GetPrefixHash(); len(h) > 0 {
			st.Evict(rk, e.GetAdapterId(), e.GetAdapterId() != "", producerKey(h))
		}
	case pb.CacheEvent_REPLICA_UPDATED:
		if st.Refresh(rk) {
			s.hub.publish(&event{typ: pb.CacheEvent_REPLICA_UPDATED, replica: rk.Replica, model: rk.Model,
				tenant: rk.Tenant, adapter: e.GetAdapterId(), tsUS: s.opts.Now().UnixMicro()})
		}
	case pb.CacheEvent_ALL_CLEARED:
		st.Clear(rk)
	default:
		st.Refresh(rk)
	}
	return ack, nil
}

// GetCacheState lists (tenant, model)'s replicas — producer-fed ones with
// their latest stats, Conductor instances with zero stats — and counts the
// distinct keys of its scopes and contexts.
func (s *Server) GetCacheState(_ context.Context, req *pb.GetCacheStateRequest) (*pb.GetCacheStateResponse, error) {
	resp := &pb.GetCacheStateResponse{Summary: &pb.CacheSummary{}}
	tenant, model := req.GetTenantId(), req.GetModelId()
	if tenant == ProbeTenant {
		return resp, nil
	}
	seen := map[string]bool{}
	for _, r := range s.opts.Producer.StatsOf(tenant, model) {
		seen[r.Replica] = true
		resp.Replicas = append(resp.Replicas, &pb.ReplicaStats{ReplicaId: r.Replica,
			CacheMemoryBytes: r.CacheMemoryBytes, HitRate: r.HitRate, Pressure: r.Pressure,
			ClientVersion: r.ClientVersion, T2HitTokens: r.T2HitTokens, T2QueryTokens: r.T2QueryTokens})
	}
	tables := s.opts.Producer.ScopeTables(tenant, model)
	for _, t := range s.opts.Contexts.Index().Tables() {
		if c := t.Context(); c.Tenant != tenant || c.Model != model {
			continue
		}
		tables = append(tables, t)
		for inst := range t.Instances() {
			if !seen[inst] {
				seen[inst] = true
				resp.Replicas = append(resp.Replicas, &pb.ReplicaStats{ReplicaId: inst})
			}
		}
	}
	slices.SortFunc(resp.Replicas, func(a, b *pb.ReplicaStats) int { return strings.Compare(a.ReplicaId, b.ReplicaId) })
	resp.Summary.TotalPrefixes = distinctKeys(tables)
	return resp, nil
}

// distinctKeys counts the keys of several tables once each; one table
// needs no set.
func distinctKeys(tables []*index.Table) int64 {
	if len(tables) == 1 {
		return int64(tables[0].PrefixCount())
	}
	set := map[uint64]struct{}{}
	for _, t := range tables {
		t.EachKey(func(k uint64) bool { set[k] = struct{}{}; return true })
	}
	return int64(len(set))
}
