package grpcapi

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"

	pb "github.com/mooncake-conductor-go/conductor/internal/inferencecache/proto/inferencecache/v1alpha1"
)

// grpcMetrics are the door's own series; the index's are exported by the
// metrics package, which already covers producer-fed scopes.
type grpcMetrics struct {
	requests *prometheus.CounterVec
	lookup   prometheus.Histogram
	reasons  *prometheus.CounterVec
	applied  prometheus.Counter
	dropped  *prometheus.CounterVec
	watchers prometheus.Gauge
	cutoffs  prometheus.Counter

	// The series every lookup counts, resolved once: a vector's lookup
	// hashes its label values on every call.
	byReason map[string]prometheus.Counter
	// lookupOK is LookupRoute's OK series, made on first use (as the
	// vector would) and then kept.
	lookupOK func() prometheus.Counter
}

// reason counts one LookupRoute answer.
func (m *grpcMetrics) reason(code string) {
	if c, ok := m.byReason[code]; ok {
		c.Inc()
		return
	}
	m.reasons.WithLabelValues(code).Inc()
}

// call counts one finished call of method (its full name) with code.
func (m *grpcMetrics) call(method string, code codes.Code) {
	if code == codes.OK && method == pb.InferenceCache_LookupRoute_FullMethodName {
		m.lookupOK().Inc()
		return
	}
	m.requests.WithLabelValues(methodLabel(method), code.String()).Inc()
}

func newMetrics(r prometheus.Registerer) (*grpcMetrics, error) {
	m := &grpcMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "conductor_grpc_requests_total",
			Help: "gRPC calls by method and status code.",
		}, []string{"method", "code"}),
		lookup: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "conductor_grpc_lookup_duration_seconds",
			Help:    "Server time per LookupRoute call.",
			Buckets: prometheus.ExponentialBuckets(5e-6, 2.5, 12),
		}),
		reasons: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "conductor_grpc_lookup_reasons_total",
			Help: "LookupRoute answers by reason code.",
		}, []string{"reason"}),
		applied: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "conductor_grpc_producer_blocks_applied_total",
			Help: "Blocks (chain blocks and exact entries) applied from ReportCacheState.",
		}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "conductor_grpc_producer_entries_dropped_total",
			Help: "Producer prefix entries dropped, by reason.",
		}, []string{"reason"}),
		watchers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "conductor_grpc_watchers",
			Help: "Connected StreamCacheEvents and StreamMetrics watchers.",
		}),
		cutoffs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "conductor_grpc_watchers_cut_off_total",
			Help: "Watchers ended with RESOURCE_EXHAUSTED for falling behind.",
		}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.lookup, m.reasons, m.applied, m.dropped, m.watchers, m.cutoffs} {
		if err := r.Register(c); err != nil {
			return nil, err
		}
	}
	// Every reason starts at zero, so dashboards see the full set.
	m.byReason = make(map[string]prometheus.Counter, len(allReasons))
	for _, r := range allReasons {
		m.byReason[r] = m.reasons.WithLabelValues(r)
	}
	m.lookupOK = sync.OnceValue(func() prometheus.Counter {
		return m.requests.WithLabelValues(methodLabel(pb.InferenceCache_LookupRoute_FullMethodName), codes.OK.String())
	})
	for _, r := range allDropReasons {
		m.dropped.WithLabelValues(r)
	}
	return m, nil
}
