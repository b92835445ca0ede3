package grpcapi

import (
	"slices"
	"time"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/mooncake-conductor-go/conductor/internal/inferencecache/proto/inferencecache/v1alpha1"
)

// StreamCacheEvents sends every change to the index, from ZMQ events and
// from producers, that passes the request's filters, until the client goes
// away, the server stops, or the client falls more than the buffer behind
// (then RESOURCE_EXHAUSTED: ingestion never waits for a watcher).
func (s *Server) StreamCacheEvents(req *pb.StreamEventsRequest, stream grpc.ServerStreamingServer[pb.CacheEvent]) error {
	w, err := s.hub.subscribe(req)
	if err != nil {
		return err
	}
	defer s.hub.unsubscribe(w)
	ctx := stream.Context()
	for {
		select {
		case e := <-w.ch:
			if err := stream.Send(e.proto()); err != nil {
				return err
			}
		case <-w.over:
			return errCutOff(s.opts.WatcherBuffer)
		case <-s.hub.quit:
			return status.Error(codes.Unavailable, "server is stopping")
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}

// StreamMetrics sends, at once and then every MetricsInterval, the current
// value of every series of the requested metrics (all when names is
// empty): one Metric per series; a histogram gives its _count and _sum.
func (s *Server) StreamMetrics(req *pb.StreamMetricsRequest, stream grpc.ServerStreamingServer[pb.Metric]) error {
	if s.opts.Gatherer == nil {
		return status.Error(codes.Unimplemented, "no metrics are configured")
	}
	if err := s.hub.join(); err != nil {
		return err
	}
	s.hub.joined()
	defer s.hub.leave()
	names := req.GetNames()
	ctx := stream.Context()
	tk := time.NewTicker(s.opts.MetricsInterval)
	defer tk.Stop()
	for {
		fams, err := s.opts.Gatherer.Gather()
		if err != nil && len(fams) == 0 {
			return status.Errorf(codes.Internal, "gather metrics: %v", err)
		}
		ts := s.opts.Now().UnixMicro()
		for _, f := range fams {
			if len(names) > 0 && !slices.Contains(names, f.GetName()) {
				continue
			}
			for _, m := range metricMessages(f, ts) {
				if err := stream.Send(m); err != nil {
					return err
				}
			}
		}
		select {
		case <-tk.C:
		case <-s.hub.quit:
			return status.Error(codes.Unavailable, "server is stopping")
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}

// metricMessages turns one family into Metric messages.
func metricMessages(f *dto.MetricFamily, ts int64) []*pb.Metric {
	var out []*pb.Metric
	for _, m := range f.GetMetric() {
		lbl := make(map[string]string, len(m.GetLabel()))
		for _, l := range m.GetLabel() {
			lbl[l.GetName()] = l.GetValue()
		}
		add := func(name, typ string, v float64) {
			out = append(out, &pb.Metric{Name: name, Type: typ, Labels: lbl, Value: v, TimestampUs: ts})
		}
		switch f.GetType() {
		case dto.MetricType_COUNTER:
			add(f.GetName(), "counter", m.GetCounter().GetValue())
		case dto.MetricType_GAUGE:
			add(f.GetName(), "gauge", m.GetGauge().GetValue())
		case dto.MetricType_HISTOGRAM:
			add(f.GetName()+"_count", "histogram", float64(m.GetHistogram().GetSampleCount()))
			add(f.GetName()+"_sum", "histogram", m.GetHistogram().GetSampleSum())
		case dto.MetricType_SUMMARY:
			add(f.GetName()+"_count", "gauge", float64(m.GetSummary().GetSampleCount()))
			add(f.GetName()+"_sum", "gauge", m.GetSummary().GetSampleSum())
		default:
			add(f.GetName(), "gauge", m.GetUntyped().GetValue())
		}
	}
	return out
}
