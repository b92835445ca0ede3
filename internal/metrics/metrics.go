// Package metrics exports the service's state and traffic in the Prometheus
// text format, reading the index, registry and ingestion counters at scrape
// time so that the hot paths pay nothing for what is only read on scrape.
package metrics

import (
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/buildinfo"
	"github.com/mooncake-conductor-go/conductor/internal/events"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/hashing/hashcheck"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
	"github.com/mooncake-conductor-go/conductor/internal/tokenmemo"
	"github.com/mooncake-conductor-go/conductor/registry"
)

// Options name what is exported; any may be nil.
type Options struct {
	Index    *index.Index
	Registry *registry.Registry
	// Ingest, when set, reports the ingestion counters at scrape time:
	// it calls yield once per series, with its counter family (a key of
	// IngestFamilies), source type, reason ("" for none) and value. The
	// subscribers keep the counters; the app hands them over in these
	// terms, so this package knows nothing of the subscriber.
	Ingest func(yield func(family, sourceType, reason string, value uint64))
	// SourceStates names every state a service's source can be in, in
	// order: conductor_subscriber_state exports each from start-up.
	SourceStates []string
	// Events, when set, is exported as the decoders' figures
	// (conductor_events_group_kind_total, conductor_standard_hash_*).
	Events *events.Stats
	Memo   *hashing.Memo
	// Links, when set, is reported as conductor_link_memo_*.
	Links *hashing.Links
	// TokenMemo, when set, is reported as conductor_token_memo_*.
	TokenMemo *tokenmemo.Memo
	// Build, when set, is exported as conductor_build_info.
	Build *buildinfo.Info
	// HashChecks, when set, is exported as conductor_hash_check_total.
	HashChecks *hashcheck.Set
	// Extra are further collectors (the durable state's).
	Extra []prometheus.Collector
}

// Metrics owns one Prometheus registry (not the global one, so tests and
// several instances in one process never collide).
type Metrics struct {
	reg      *prometheus.Registry
	requests *prometheus.CounterVec
	query    prometheus.Histogram
	handler  fasthttp.RequestHandler
}

// New builds the metric set.
func New(opts Options) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "conductor_http_requests_total",
		Help: "HTTP requests by endpoint and status code.",
	}, []string{"endpoint", "status"})
	m.query = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "conductor_query_duration_seconds",
		Help: "Server time per /query request, decoding to encoding.",
		// 10 µs to ~100 ms.
		Buckets: prometheus.ExponentialBuckets(10e-6, 2.5, 11),
	})
	m.reg.MustRegister(m.requests, m.query,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&stateCollector{opts: opts})
	if b := opts.Build; b != nil {
		// The usual info-metric shape: constant 1, the facts in labels,
		// so a query can join them onto any other series.
		build := prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "conductor_build_info",
			Help: "1, labelled with the running build's version, commit, Go version and libzmq version.",
			ConstLabels: prometheus.Labels{
				"version": b.Version, "commit": b.Commit, "goversion": b.GoVersion, "libzmq": b.LibZMQ,
			},
		})
		build.Set(1)
		m.reg.MustRegister(build)
	}
	m.reg.MustRegister(opts.Extra...)
	m.handler = fasthttpadaptor.NewFastHTTPHandler(promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	return m
}

// ObserveRequest counts one HTTP request; /query latencies also feed the
// histogram.
func (m *Metrics) ObserveRequest(endpoint string, status int, elapsed time.Duration) {
	m.requests.WithLabelValues(endpoint, strconv.Itoa(status)).Inc()
	if endpoint == "/query" {
		m.query.Observe(elapsed.Seconds())
	}
}

// Serve answers a scrape.
func (m *Metrics) Serve(ctx *fasthttp.RequestCtx) { m.handler(ctx) }

// Gatherer exposes the registry to tests and to the gRPC door's
// StreamMetrics.
func (m *Metrics) Gatherer() prometheus.Gatherer { return m.reg }

// Registerer lets other front doors (the gRPC one) add their own series to
// the same export.
func (m *Metrics) Registerer() prometheus.Registerer { return m.reg }

var (
	descBlocks = prometheus.NewDesc("conductor_index_blocks",
		"Blocks held in a tier, per context.", []string{"tenant", "model", "lora", "block_size", "tier"}, nil)
	descPrefixes = prometheus.NewDesc("conductor_index_prefixes",
		"Distinct block keys held in any tier, per context.", []string{"tenant", "model", "lora", "block_size"}, nil)
	descOwners = prometheus.NewDesc("conductor_index_engine_owners",
		"Registered engine owners (instance, dp rank), per context.", []string{"tenant", "model", "lora", "block_size"}, nil)
	descContexts    = prometheus.NewDesc("conductor_contexts", "Indexed contexts.", nil, nil)
	descIndexMemory = prometheus.NewDesc("conductor_index_memory_bytes",
		"Accounted memory of the index: blocks, holders, reverse lists, holder sets and tables of every context and producer scope (docs/index-memory.md).", nil, nil)
	descIndexMemoryLimit = prometheus.NewDesc("conductor_index_memory_limit_bytes",
		"The index's memory budget (--index-memory-mib); 0 when unbounded.", nil, nil)
	descIndexEvictions = prometheus.NewDesc("conductor_index_evictions_total",
		"Blocks evicted, least recently stored first, to keep the index within its budget, by kind of table (context or scope).", []string{"kind"}, nil)
	descScopeBlocks = prometheus.NewDesc("conductor_scope_blocks",
		"Blocks held in a tier, per producer-fed scope (gRPC ReportCacheState).", []string{"tenant", "model", "scheme", "adapter", "tier"}, nil)
	descScopePrefixes = prometheus.NewDesc("conductor_scope_prefixes",
		"Distinct keys held in any tier, per producer-fed scope.", []string{"tenant", "model", "scheme", "adapter"}, nil)
	descScopeReplicas = prometheus.NewDesc("conductor_scope_replicas",
		"Replicas registered in a producer-fed scope.", []string{"tenant", "model", "scheme", "adapter"}, nil)
	descServices = prometheus.NewDesc("conductor_services", "Registered services by type.", []string{"type"}, nil)
	descState    = prometheus.NewDesc("conductor_subscriber_state",
		"1 for the current state of each service's subscriber, 0 for the others.", []string{"service", "type", "state"}, nil)
	descStale    = prometheus.NewDesc("conductor_stale_sources", "Services whose source is stale.", nil, nil)
	descRestarts = prometheus.NewDesc("conductor_publisher_restarts_total",
		"Publisher restarts detected per service (each a new epoch: the old process's entries dropped, the new stream indexed), since its source started.", []string{"service", "type"}, nil)
	descSvcRejected = prometheus.NewDesc("conductor_service_events_rejected_total",
		"Events rejected per service, by reason, since its source started (the same events conductor_events_rejected_total counts by source type).", []string{"service", "type", "reason"}, nil)
	descSvcIgnored = prometheus.NewDesc("conductor_service_events_ignored_total",
		"Events ignored or no-op per service, by reason, since its source started (the same events conductor_events_ignored_total counts by source type).", []string{"service", "type", "reason"}, nil)
	descRecoveries = prometheus.NewDesc("conductor_stale_recoveries_total",
		"Stale states a service's source left by itself (--stale-recovery auto), since it started.", []string{"service", "type"}, nil)
	descMemo = prometheus.NewDesc("conductor_hash_memo_lookups_total",
		"Query blocks whose digest came from the prefix memo (hit) or was hashed (miss).", []string{"result"}, nil)
	descTokenMemo = prometheus.NewDesc("conductor_token_memo_tokens_total",
		"Token ids of accepted /query bodies and LookupRoute requests copied from the token memo both doors share (hit) or decoded while it was consulted (miss).", []string{"result"}, nil)
	descTokenMemoBytes = prometheus.NewDesc("conductor_token_memo_bytes",
		"Memory held by the token memo's remembered arrays, for both doors (bounded by --token-memo-mib; emptied when nothing is left to look up).", nil, nil)
	descMemoBytes = prometheus.NewDesc("conductor_hash_memo_bytes",
		"Memory held by the prefix memo's remembered chains (bounded by --hash-memo-mib; emptied when the last context goes).", nil, nil)
	descStdMapBytes = prometheus.NewDesc("conductor_standard_hash_map_bytes",
		"Memory accounted to the engine-hash to standard-hash maps of sources registered with rfc1527 (bounded per source; released on unregister, stale and AllBlocksCleared).", nil, nil)
	descStdUnreachable = prometheus.NewDesc("conductor_standard_hash_unreachable_blocks_total",
		"Engine blocks under rfc1527 that no plain query can reach: extra keys the standard cannot fold, a partial page, or a parent that was unreachable.", nil, nil)
	descHashCheck = prometheus.NewDesc("conductor_hash_check_total",
		"Sampled event blocks re-hashed under the service's registered profile: match, mismatch (queries will not find that engine's blocks), or skipped (the event did not carry what re-hashing needs; see conductor_hash_check_skipped_total).", []string{"service", "result"}, nil)
	descHashSkipped = prometheus.NewDesc("conductor_hash_check_skipped_total",
		"Sampled event blocks the hash check could not re-hash, by what the event lacked (docs/events.md, \"The hash check\").", []string{"service", "reason"}, nil)
	descIngest = map[string]*prometheus.Desc{}
	// descGroupKinds counts hybrid models' events by KV-cache group kind
	// (docs/hybrid.md#metrics).
	descGroupKinds = prometheus.NewDesc("conductor_events_group_kind_total",
		"Applied vLLM BlockStored events that named a KV-cache group kind, by the kind's rule family: full_attention, sliding_window, chunked_local_attention, mamba, uncached or other.", []string{"kind"}, nil)
)

var tierNames = [...]string{"device", "cpu_local", "cpu_share", "disk"}

// scopeTierNames are the producer tiers, as InferenceCache names them.
var scopeTierNames = [...]string{"T1", "T2", "T3"}

// ingestFamilies maps ingestion counter families (Options.Ingest) to
// exported names.
var ingestFamilies = map[string]string{
	"messages_received":  "conductor_messages_received_total",
	"messages_dropped":   "conductor_messages_dropped_total",
	"envelopes_rejected": "conductor_envelopes_rejected_total",
	"batches_rejected":   "conductor_batches_rejected_total",
	"events_applied":     "conductor_events_applied_total",
	"events_ignored":     "conductor_events_ignored_total",
	"events_rejected":    "conductor_events_rejected_total",
	"sequence_gaps":      "conductor_sequence_gaps_total",
	"replays":            "conductor_replays_total",
	"stale_transitions":  "conductor_stale_transitions_total",
}

func init() {
	for fam, name := range ingestFamilies {
		descIngest[fam] = prometheus.NewDesc(name, "Ingestion counter "+fam+" by source type and reason.", []string{"source_type", "reason"}, nil)
	}
}

// maxLabel bounds label values taken from client input (LoRA names may be
// 256 KiB) so one registration cannot bloat every scrape.
const maxLabel = 128

func clip(s string) string {
	if len(s) > maxLabel {
		return s[:maxLabel] + "…"
	}
	return s
}

type stateCollector struct{ opts Options }

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descGroupKinds, descBlocks, descPrefixes, descOwners, descContexts, descIndexMemory, descIndexMemoryLimit, descIndexEvictions, descScopeBlocks, descScopePrefixes, descScopeReplicas, descServices, descState, descStale, descRestarts, descRecoveries, descSvcRejected, descSvcIgnored, descMemo, descMemoBytes, descTokenMemo, descTokenMemoBytes, descHashCheck, descHashSkipped, descStdMapBytes, descStdUnreachable, linkDescs[0], linkDescs[1], linkDescs[2], linkDescs[3], linkDescs[4]} {
		ch <- d
	}
	for _, d := range descIngest {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	if ix := c.opts.Index; ix != nil {
		tables := ix.Tables()
		ch <- prometheus.MustNewConstMetric(descContexts, prometheus.GaugeValue, float64(len(tables)))
		ch <- prometheus.MustNewConstMetric(descIndexMemory, prometheus.GaugeValue, float64(ix.MemoryBytes()))
		ch <- prometheus.MustNewConstMetric(descIndexMemoryLimit, prometheus.GaugeValue, float64(ix.MemoryLimit()))
		for _, k := range index.EvictionKinds {
			ch <- prometheus.MustNewConstMetric(descIndexEvictions, prometheus.CounterValue, float64(ix.Evictions(k)), k.String())
		}
		for _, t := range tables {
			k := t.Context()
			bs := strconv.Itoa(k.BlockSize)
			lbl := []string{clip(k.Tenant), clip(k.Model), clip(k.Lora), bs}
			for i, n := range t.TierBlocks() {
				ch <- prometheus.MustNewConstMetric(descBlocks, prometheus.GaugeValue, float64(n), append(lbl[:4:4], tierNames[i])...)
			}
			ch <- prometheus.MustNewConstMetric(descPrefixes, prometheus.GaugeValue, float64(t.PrefixCount()), lbl...)
			owners := 0
			for _, ranks := range t.Instances() {
				owners += len(ranks)
			}
			ch <- prometheus.MustNewConstMetric(descOwners, prometheus.GaugeValue, float64(owners), lbl...)
		}
		for _, t := range ix.Scopes() {
			k := t.ScopeKey()
			lbl := []string{clip(k.Tenant), clip(k.Model), clip(k.Scheme), clip(k.Adapter)}
			// Producer tiers: T1 is kept as device, T2 as the owner's
			// host tier (cpu_local), T3 as disk; scopes have no shared tier.
			tb := t.TierBlocks()
			for i, n := range [3]int{tb[index.Device], tb[index.CPULocal], tb[index.Disk]} {
				ch <- prometheus.MustNewConstMetric(descScopeBlocks, prometheus.GaugeValue, float64(n), append(lbl[:4:4], scopeTierNames[i])...)
			}
			ch <- prometheus.MustNewConstMetric(descScopePrefixes, prometheus.GaugeValue, float64(t.PrefixCount()), lbl...)
			ch <- prometheus.MustNewConstMetric(descScopeReplicas, prometheus.GaugeValue, float64(t.OwnerCount()), lbl...)
		}
	}
	if r := c.opts.Registry; r != nil {
		var byType [sourcetype.NumTypes]int
		stale := 0
		for _, s := range r.Services() {
			byType[s.Type]++
			if s.Stale {
				stale++
			}
			// Every state, 1 for the current one, so that a transition
			// shows as a change of value rather than a series appearing.
			known := false
			for _, st := range c.opts.SourceStates {
				v := 0.0
				if st == s.State {
					v, known = 1, true
				}
				ch <- prometheus.MustNewConstMetric(descState, prometheus.GaugeValue, v, clip(string(s.Key())), s.Type.String(), st)
			}
			if !known && s.State != "" {
				ch <- prometheus.MustNewConstMetric(descState, prometheus.GaugeValue, 1, clip(string(s.Key())), s.Type.String(), s.State)
			}
			ch <- prometheus.MustNewConstMetric(descRestarts, prometheus.CounterValue, float64(s.Restarts), clip(string(s.Key())), s.Type.String())
			ch <- prometheus.MustNewConstMetric(descRecoveries, prometheus.CounterValue, float64(s.StaleRecoveries), clip(string(s.Key())), s.Type.String())
			if s.Events != nil {
				svc, typ := clip(string(s.Key())), s.Type.String()
				s.Events.EventCounts(func(rejected bool, reason string, n uint64) {
					d := descSvcIgnored
					if rejected {
						d = descSvcRejected
					}
					ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(n), svc, typ, reason)
				})
			}
		}
		for typ, n := range byType {
			ch <- prometheus.MustNewConstMetric(descServices, prometheus.GaugeValue, float64(n), sourcetype.Type(typ).String())
		}
		ch <- prometheus.MustNewConstMetric(descStale, prometheus.GaugeValue, float64(stale))
	}
	if c.opts.Memo != nil {
		collectMemo(ch, descMemo, descMemoBytes, c.opts.Memo)
	}
	collectLinks(ch, c.opts.Links)
	ch <- prometheus.MustNewConstMetric(descStdMapBytes, prometheus.GaugeValue, float64(c.opts.Events.StandardMapBytes()))
	ch <- prometheus.MustNewConstMetric(descStdUnreachable, prometheus.CounterValue, float64(c.opts.Events.StandardUnreachableBlocks()))
	if c.opts.TokenMemo != nil {
		collectMemo(ch, descTokenMemo, descTokenMemoBytes, c.opts.TokenMemo)
	}
	for _, hc := range c.opts.HashChecks.Snapshot() {
		svc := clip(hc.Service)
		ch <- prometheus.MustNewConstMetric(descHashCheck, prometheus.CounterValue, float64(hc.Matches), svc, "match")
		ch <- prometheus.MustNewConstMetric(descHashCheck, prometheus.CounterValue, float64(hc.Mismatches), svc, "mismatch")
		ch <- prometheus.MustNewConstMetric(descHashCheck, prometheus.CounterValue, float64(hc.SkippedTotal()), svc, "skipped")
		for _, r := range hashcheck.SkipReasons() {
			ch <- prometheus.MustNewConstMetric(descHashSkipped, prometheus.CounterValue, float64(hc.Skipped[r]), svc, r.String())
		}
	}
	for k, n := range c.opts.Events.GroupKindEvents() {
		if kind := index.GroupKind(k); kind != index.KindUnreported {
			ch <- prometheus.MustNewConstMetric(descGroupKinds, prometheus.CounterValue, float64(n), kind.String())
		}
	}
	if c.opts.Ingest != nil {
		c.opts.Ingest(func(family, sourceType, reason string, value uint64) {
			if d, ok := descIngest[family]; ok {
				ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(value), sourceType, reason)
			}
		})
	}
}

// IngestFamilies lists the ingestion counter families exported (the
// families Options.Ingest may report), sorted.
func IngestFamilies() []string {
	return slices.Sorted(maps.Keys(ingestFamilies))
}

// memo is what both memos report: lookups by result and the memory held.
type memo interface {
	Stats() (hits, misses uint64)
	Bytes() int
}

// collectMemo sends a memo's lookups (by result) and memory.
func collectMemo(ch chan<- prometheus.Metric, lookups, bytes *prometheus.Desc, m memo) {
	hits, misses := m.Stats()
	ch <- prometheus.MustNewConstMetric(lookups, prometheus.CounterValue, float64(hits), "hit")
	ch <- prometheus.MustNewConstMetric(lookups, prometheus.CounterValue, float64(misses), "miss")
	ch <- prometheus.MustNewConstMetric(bytes, prometheus.GaugeValue, float64(m.Bytes()))
}
