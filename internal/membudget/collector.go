package membudget

import "github.com/prometheus/client_golang/prometheus"

var (
	descBudget = prometheus.NewDesc("conductor_memory_budget_bytes",
		"Bytes of the process's memory budget (--memory-mib) given to each part: index (accounted), links, hash_memo, token_memo, receive (every source's receive queue and recovery buffer), and total (the whole budget); 0 for total, index and receive is unbounded, 0 for a cache is off.",
		[]string{"part"}, nil)
	descUsed = prometheus.NewDesc("conductor_memory_used_bytes",
		"Bytes each part of the memory budget holds now; for total, the process's resident size.",
		[]string{"part"}, nil)
)

// Collector exports the budget and what each part uses.
type Collector struct {
	b    Budget
	used map[Part]func() int64
}

// NewCollector exports b; used reads each part's use (Total among them).
func NewCollector(b Budget, used map[Part]func() int64) *Collector {
	return &Collector{b: b, used: used}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descBudget
	ch <- descUsed
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	for _, p := range append([]Part{Total}, Parts...) {
		size := c.b.Size[p]
		if p == Total {
			size = c.b.Total
		}
		ch <- prometheus.MustNewConstMetric(descBudget, prometheus.GaugeValue, float64(size), string(p))
		if f := c.used[p]; f != nil {
			ch <- prometheus.MustNewConstMetric(descUsed, prometheus.GaugeValue, float64(f()), string(p))
		}
	}
}
