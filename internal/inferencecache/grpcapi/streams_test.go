package grpcapi

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"

	pb "github.com/mooncake-conductor-go/conductor/internal/inferencecache/proto/inferencecache/v1alpha1"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
)

func (f *fixture) watchers() int { return len(*f.srv.hub.list.Load()) }

// TestStreamCacheEventsFilters: producer-fed changes reach the watchers
// whose filters they pass, in order, with the key big-endian.
func TestStreamCacheEventsFilters(t *testing.T) {
	f := newFixture(t, nil)
	added, err := f.client.StreamCacheEvents(ctx(t), &pb.StreamEventsRequest{TenantId: "t", ModelId: "m", Types: []pb.CacheEvent_Type{pb.CacheEvent_PREFIX_ADDED}})
	if err != nil {
		t.Fatal(err)
	}
	all, err := f.client.StreamCacheEvents(ctx(t), &pb.StreamEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	eventtest.Eventually(t, "two watchers", func() bool { return f.watchers() == 2 })

	f.mustReport(update("a", chainEntry(t1, 16, 1, 2)))
	other := update("a", chainEntry(t1, 16, 3))
	other.ModelId = "other"
	f.mustReport(other)
	if _, err := f.client.PublishEvent(ctx(t), &pb.CacheEvent{Type: pb.CacheEvent_PREFIX_EVICTED, ReplicaId: "a", TenantId: "t", ModelId: "m", PrefixHash: key8(2)}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.client.PublishEvent(ctx(t), &pb.CacheEvent{Type: pb.CacheEvent_ALL_CLEARED, ReplicaId: "a", TenantId: "t", ModelId: "m"}); err != nil {
		t.Fatal(err)
	}
	// A marker after everything, so the filtered stream can end its read.
	f.mustReport(update("a", chainEntry(t1, 16, 99)))

	type ev struct {
		Type    pb.CacheEvent_Type
		Replica string
		Model   string
		Key     string
	}
	read := func(st interface {
		Recv() (*pb.CacheEvent, error)
	}, n int) []ev {
		var out []ev
		for range n {
			e, err := st.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if e.TenantId != "t" || e.TimestampUs == 0 {
				t.Fatalf("event %v", e)
			}
			out = append(out, ev{e.Type, e.ReplicaId, e.ModelId, fmt.Sprintf("%x", e.PrefixHash)})
		}
		return out
	}
	k := func(n uint64) string { return fmt.Sprintf("%x", key8(n)) }
	want := []ev{
		{pb.CacheEvent_PREFIX_ADDED, "a", "m", k(1)}, {pb.CacheEvent_PREFIX_ADDED, "a", "m", k(2)},
		{pb.CacheEvent_PREFIX_ADDED, "a", "m", k(99)},
	}
	if diff := cmp.Diff(want, read(added, 3)); diff != "" {
		t.Errorf("filtered stream (-want +got):\n%s", diff)
	}
	wantAll := []ev{
		{pb.CacheEvent_REPLICA_UPDATED, "a", "m", ""},
		{pb.CacheEvent_PREFIX_ADDED, "a", "m", k(1)}, {pb.CacheEvent_PREFIX_ADDED, "a", "m", k(2)},
		{pb.CacheEvent_REPLICA_UPDATED, "a", "other", ""}, {pb.CacheEvent_PREFIX_ADDED, "a", "other", k(3)},
		{pb.CacheEvent_PREFIX_EVICTED, "a", "m", k(2)},
		{pb.CacheEvent_ALL_CLEARED, "a", "m", ""},
		{pb.CacheEvent_REPLICA_UPDATED, "a", "m", ""}, {pb.CacheEvent_PREFIX_ADDED, "a", "m", k(99)},
	}
	if diff := cmp.Diff(wantAll, read(all, len(wantAll))); diff != "" {
		t.Errorf("unfiltered stream (-want +got):\n%s", diff)
	}
}

// TestSlowWatcherCutOff: a watcher that never reads is ended with
// RESOURCE_EXHAUSTED once its buffer fills, while every report is applied.
func TestSlowWatcherCutOff(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.WatcherBuffer = 64 })
	slow, err := f.client.StreamCacheEvents(ctx(t), &pb.StreamEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	eventtest.Eventually(t, "the watcher", func() bool { return f.watchers() == 1 })
	const blocks = 20000
	keys := make([]uint64, blocks)
	for i := range keys {
		keys[i] = uint64(i + 1)
	}
	var updates []*pb.CacheStateUpdate
	for i := 0; i < blocks; i += 1000 {
		updates = append(updates, update("a", chainEntry(t1, 16, keys[i:i+1000]...)))
	}
	f.mustReport(updates...)
	sc, ok := f.prod.Scope(scopeKey("t", "m", "vllm", ""))
	if !ok || sc.Table.PrefixCount() != blocks {
		t.Fatalf("ingestion lost blocks while a watcher lagged")
	}
	var recvErr error
	for recvErr == nil {
		_, recvErr = slow.Recv()
	}
	if status.Code(recvErr) != codes.ResourceExhausted {
		t.Fatalf("slow watcher ended with %v", recvErr)
	}
	if n := counterValue(t, f.reg, "conductor_grpc_watchers_cut_off_total", "", ""); n != 1 {
		t.Fatalf("cut-offs counted %v", n)
	}
	eventtest.Eventually(t, "the watcher to leave", func() bool { return f.watchers() == 0 })
}

func TestWatcherLimit(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.MaxWatchers = 1 })
	first, err := f.client.StreamCacheEvents(ctx(t), &pb.StreamEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	eventtest.Eventually(t, "the first watcher", func() bool { return f.watchers() == 1 })
	second, err := f.client.StreamMetrics(ctx(t), &pb.StreamMetricsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := second.Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("second watcher: %v", err)
	}
	_ = first
}

// TestStreamMetrics: the requested families, one message per series,
// current values.
func TestStreamMetrics(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.MetricsInterval = 20e6 })
	f.mustReport(update("a", chainEntry(t1, 16, 1, 2, 3, 4)))
	f.lookup(chainReq("vllm", 16, 1, 2, 3, 4))
	st, err := f.client.StreamMetrics(ctx(t), &pb.StreamMetricsRequest{Names: []string{"conductor_grpc_lookup_reasons_total", "conductor_grpc_lookup_duration_seconds"}})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]*pb.Metric{}
	for len(seen) < len(allReasons)+2 {
		m, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		seen[m.Name+"/"+m.Labels["reason"]] = m
	}
	want := &pb.Metric{Name: "conductor_grpc_lookup_reasons_total", Type: "counter", Labels: map[string]string{"reason": PrefixMatch}, Value: 1}
	if diff := cmp.Diff(want, seen["conductor_grpc_lookup_reasons_total/"+PrefixMatch], protocmp.Transform(), protocmp.IgnoreFields(&pb.Metric{}, "timestamp_us")); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if m := seen["conductor_grpc_lookup_duration_seconds_count/"]; m == nil || m.Type != "histogram" || m.Value != 1 {
		t.Errorf("histogram count %v", m)
	}
	for _, m := range seen {
		if !strings.HasPrefix(m.Name, "conductor_grpc_lookup_") {
			t.Errorf("unrequested metric %s", m.Name)
		}
	}
}
