package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mooncake-conductor-go/conductor/internal/hashing"
)

// The verified links (hashing.Links): blocks queries took from them
// instead of hashing, blocks ingest verified into them, and their memory.
var (
	descLinkHits = prometheus.NewDesc("conductor_link_memo_hits_total",
		"Query blocks whose digest came from a link ingest verified instead of SHA-256.", nil, nil)
	descLinkRecorded = prometheus.NewDesc("conductor_link_memo_recorded_total",
		"Stored vLLM blocks ingest re-hashed, found as published, and recorded as links.", nil, nil)
	descLinkBytes = prometheus.NewDesc("conductor_link_memo_bytes",
		"Memory held by the verified links (bounded by --link-memo-mib; emptied when the last context goes).", nil, nil)
	descLinkShed = prometheus.NewDesc("conductor_link_verify_shed_total",
		"Stored vLLM blocks left unverified because their source's waiting verification was full; queries hash them, answers are unchanged.", nil, nil)
	descLinkPending = prometheus.NewDesc("conductor_link_verify_pending_blocks",
		"Stored vLLM blocks already in the index whose verification waits for their source to be idle.", nil, nil)
)

var linkDescs = []*prometheus.Desc{descLinkHits, descLinkRecorded, descLinkBytes, descLinkShed, descLinkPending}

func collectLinks(ch chan<- prometheus.Metric, l *hashing.Links) {
	if l == nil {
		return
	}
	hits, _, recorded := l.Stats()
	ch <- prometheus.MustNewConstMetric(descLinkHits, prometheus.CounterValue, float64(hits))
	ch <- prometheus.MustNewConstMetric(descLinkRecorded, prometheus.CounterValue, float64(recorded))
	ch <- prometheus.MustNewConstMetric(descLinkBytes, prometheus.GaugeValue, float64(l.Bytes()))
	ch <- prometheus.MustNewConstMetric(descLinkShed, prometheus.CounterValue, float64(l.Shed()))
	ch <- prometheus.MustNewConstMetric(descLinkPending, prometheus.GaugeValue, float64(l.Pending()))
}
