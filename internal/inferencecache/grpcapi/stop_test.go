package grpcapi

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/mooncake-conductor-go/conductor/internal/inferencecache/proto/inferencecache/v1alpha1"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
)

// streams is how many watcher streams (events and metrics) hold a slot.
func (f *fixture) streams() int {
	f.srv.hub.mu.Lock()
	defer f.srv.hub.mu.Unlock()
	return f.srv.hub.streams
}

// TestStopEndsOpenStreams: Stop does not wait for watchers to hang up. An
// open StreamCacheEvents and an open StreamMetrics both end with
// Unavailable ("server is stopping") and their slots are given back.
func TestStopEndsOpenStreams(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.MetricsInterval = time.Hour })
	events, err := f.client.StreamCacheEvents(ctx(t), &pb.StreamEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	metrics, err := f.client.StreamMetrics(ctx(t), &pb.StreamMetricsRequest{Names: []string{"conductor_grpc_watchers"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := metrics.Recv(); err != nil { // the first report: the stream is set up
		t.Fatal(err)
	}
	eventtest.Eventually(t, "both streams", func() bool { return f.streams() == 2 && f.watchers() == 1 })

	stopped := make(chan struct{})
	go func() { f.srv.Stop(); close(stopped) }()
	ended := map[string]error{}
	if ev, err := events.Recv(); err == nil {
		t.Fatalf("StreamCacheEvents: %v arrived although nothing changed", ev)
	} else {
		ended["StreamCacheEvents"] = err
	}
	for {
		if _, err := metrics.Recv(); err != nil {
			ended["StreamMetrics"] = err
			break
		}
	}
	for name, err := range ended {
		if s := status.Convert(err); s.Code() != codes.Unavailable || s.Message() != "server is stopping" {
			t.Errorf("%s ended with %v, want Unavailable: server is stopping", name, err)
		}
	}
	<-stopped
	if n, w := f.streams(), f.watchers(); n != 0 || w != 0 {
		t.Errorf("after Stop %d watcher slots are held and %d event watchers listed", n, w)
	}
}
