package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mooncake-conductor-go/conductor/internal/hugepage"
)

// The huge-page collapser (internal/hugepage): its passes, the chunks the
// kernel could not collapse, and how much of the process is on huge pages.
var (
	descHugePasses = prometheus.NewDesc("conductor_huge_page_passes_total",
		"Passes that asked the kernel to put the process's fully used memory on transparent huge pages (--huge-pages, THP mode madvise).", nil, nil)
	descHugeFailed = prometheus.NewDesc("conductor_huge_page_collapse_failures_total",
		"Fully used 2 MiB chunks the kernel could not put on a huge page when a pass asked (no free huge page, pages it would not move); the next pass asks again.", nil, nil)
	descHugeBytes = prometheus.NewDesc("conductor_huge_page_bytes",
		"Anonymous memory of the process on transparent huge pages now (AnonHugePages of /proc/self/smaps_rollup).", nil, nil)
)

var hugePageDescs = []*prometheus.Desc{descHugePasses, descHugeFailed, descHugeBytes}

func collectHugePages(ch chan<- prometheus.Metric, c *hugepage.Collapser) {
	if c == nil {
		return
	}
	passes, failed := c.Stats()
	ch <- prometheus.MustNewConstMetric(descHugePasses, prometheus.CounterValue, float64(passes))
	ch <- prometheus.MustNewConstMetric(descHugeFailed, prometheus.CounterValue, float64(failed))
	if b := hugepage.AnonHugeBytes(); b >= 0 {
		ch <- prometheus.MustNewConstMetric(descHugeBytes, prometheus.GaugeValue, float64(b))
	}
}
