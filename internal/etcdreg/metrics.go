package etcdreg

import "github.com/prometheus/client_golang/prometheus"

// stats are the store's metrics: the revision applied (replicas that agree
// show the same one), and the etcd operations that failed, which is how an
// unreachable etcd shows.
type stats struct {
	revision prometheus.GaugeFunc
	failures *prometheus.CounterVec
	relists  prometheus.Counter
}

func (s *Store) initStats() {
	g := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "conductor_etcd_applied_revision",
		Help: "The etcd revision of the shared registrations this replica has applied.",
	}, func() float64 { return float64(s.Revision()) })
	s.stats = stats{
		revision: g,
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "conductor_etcd_failures_total",
			Help: "etcd operations that failed, by operation (register, unregister, watch, relist).",
		}, []string{"op"}),
		relists: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "conductor_etcd_relists_total",
			Help: "Times the whole shared set was read again after the watch fell behind a compaction.",
		}),
	}
	for _, op := range []string{"register", "unregister", "watch", "relist"} {
		s.stats.failures.WithLabelValues(op)
	}
}

// Collector exports the store's metrics.
func (s *Store) Collector() prometheus.Collector { return collector{s} }

type collector struct{ s *Store }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	c.s.stats.revision.Describe(ch)
	c.s.stats.failures.Describe(ch)
	c.s.stats.relists.Describe(ch)
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	c.s.stats.revision.Collect(ch)
	c.s.stats.failures.Collect(ch)
	c.s.stats.relists.Collect(ch)
}
