package grpcapi

import (
	"encoding/binary"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mooncake-conductor-go/conductor/index"
	pb "github.com/mooncake-conductor-go/conductor/internal/inferencecache/proto/inferencecache/v1alpha1"
)

// event is one index change on its way to watchers; it is a value, so
// publishing allocates nothing per watcher.
type event struct {
	typ                    pb.CacheEvent_Type
	replica, model, tenant string
	adapter                string
	key                    uint64
	hasKey                 bool
	tsUS                   int64
}

func (e *event) proto() *pb.CacheEvent {
	ev := &pb.CacheEvent{Type: e.typ, ReplicaId: e.replica, ModelId: e.model, TenantId: e.tenant,
		TimestampUs: e.tsUS, AdapterId: e.adapter}
	if e.hasKey {
		ev.PrefixHash = binary.BigEndian.AppendUint64(nil, e.key)
	}
	return ev
}

// watcher is one stream's subscription: a filter and a bounded buffer.
// When the buffer is full the watcher is cut off (over closes) rather than
// making the publisher wait.
type watcher struct {
	model, tenant string
	types         uint32 // bit per CacheEvent_Type; 0: all
	ch            chan event
	over          chan struct{}
	cut           atomic.Bool
}

func (w *watcher) wants(e *event) bool {
	return (w.model == "" || w.model == e.model) && (w.tenant == "" || w.tenant == e.tenant) &&
		(w.types == 0 || w.types&(1<<uint(e.typ)) != 0)
}

// hub fans index changes out to watchers. It is the index's Watcher:
// Watching is one atomic load, so ingestion pays nothing while nobody
// watches, and Changed only ever does non-blocking sends.
type hub struct {
	max, buffer int
	now         func() time.Time
	m           *grpcMetrics

	mu      sync.Mutex
	list    atomic.Pointer[[]*watcher] // event watchers, copy on write
	streams int                        // event and metric watchers, under mu
	closed  bool
	quit    chan struct{}
}

func newHub(max, buffer int, now func() time.Time, m *grpcMetrics) *hub {
	h := &hub{max: max, buffer: buffer, now: now, m: m, quit: make(chan struct{})}
	h.list.Store(&[]*watcher{})
	return h
}

// join admits one more watcher stream (events or metrics); the caller
// counts it in the gauge (joined) once it is set up, so a watcher the
// gauge shows already receives events.
func (h *hub) join() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return status.Error(codes.Unavailable, "server is stopping")
	}
	if h.streams >= h.max {
		return status.Errorf(codes.ResourceExhausted, "too many watchers (limit %d)", h.max)
	}
	h.streams++
	return nil
}

// joined counts a set-up watcher stream in the gauge.
func (h *hub) joined() { h.m.watchers.Inc() }

func (h *hub) leave() {
	h.mu.Lock()
	h.streams--
	h.mu.Unlock()
	h.m.watchers.Dec()
}

func (h *hub) subscribe(req *pb.StreamEventsRequest) (*watcher, error) {
	if err := h.join(); err != nil {
		return nil, err
	}
	w := &watcher{model: req.GetModelId(), tenant: req.GetTenantId(),
		ch: make(chan event, h.buffer), over: make(chan struct{})}
	for _, t := range req.GetTypes() {
		if t > 0 && t < 32 {
			w.types |= 1 << uint(t)
		} else {
			w.types |= 1 << 31 // unknown types match nothing, but the filter is set
		}
	}
	h.mu.Lock()
	old := *h.list.Load()
	nl := append(append(make([]*watcher, 0, len(old)+1), old...), w)
	h.list.Store(&nl)
	h.mu.Unlock()
	h.joined()
	return w, nil
}

func (h *hub) unsubscribe(w *watcher) {
	h.mu.Lock()
	old := *h.list.Load()
	nl := make([]*watcher, 0, len(old))
	for _, x := range old {
		if x != w {
			nl = append(nl, x)
		}
	}
	h.list.Store(&nl)
	h.mu.Unlock()
	h.leave()
}

// closeAll ends every stream (server stop).
func (h *hub) closeAll() {
	h.mu.Lock()
	if !h.closed {
		h.closed = true
		close(h.quit)
	}
	h.mu.Unlock()
}

// Watching implements index.Watcher.
func (h *hub) Watching() bool { return len(*h.list.Load()) > 0 }

// Changed implements index.Watcher.
func (h *hub) Changed(c index.Change) {
	e := event{replica: c.Instance, tsUS: h.now().UnixMicro()}
	t := c.Table
	ctx := t.Context()
	e.model, e.tenant, e.adapter = ctx.Model, ctx.Tenant, ctx.Lora
	if e.tenant == ProbeTenant {
		return
	}
	switch c.Kind {
	case index.KeyAdded:
		e.typ, e.key, e.hasKey = pb.CacheEvent_PREFIX_ADDED, c.Key, true
	case index.KeyEvicted:
		e.typ, e.key, e.hasKey = pb.CacheEvent_PREFIX_EVICTED, c.Key, true
	case index.OwnerCleared:
		e.typ = pb.CacheEvent_ALL_CLEARED
	case index.OwnerUpdated:
		e.typ = pb.CacheEvent_REPLICA_UPDATED
	default:
		return
	}
	h.publish(&e)
}

// ReplicaStateChanged tells watchers that the ZMQ-fed source of instance's
// registration in context ctx changed state (connected, live, recovering,
// stale): a REPLICA_UPDATED, as the spec has it for a source that
// registers or changes state. The index cannot tell it, as the source's
// state is not in the index; the service calls it from the source's
// goroutine, and like every publish it never waits.
func (s *Server) ReplicaStateChanged(ctx index.ContextKey, instance string) {
	if ctx.Tenant == ProbeTenant || !s.hub.Watching() {
		return
	}
	s.hub.publish(&event{typ: pb.CacheEvent_REPLICA_UPDATED, replica: instance, model: ctx.Model,
		tenant: ctx.Tenant, adapter: ctx.Lora, tsUS: s.hub.now().UnixMicro()})
}

// publish offers e to every watcher that wants it, never waiting.
func (h *hub) publish(e *event) {
	for _, w := range *h.list.Load() {
		if w.cut.Load() || !w.wants(e) {
			continue
		}
		select {
		case w.ch <- *e:
		default:
			if w.cut.CompareAndSwap(false, true) {
				close(w.over)
				h.m.cutoffs.Inc()
			}
		}
	}
}

// errCutOff ends a watcher that fell behind.
func errCutOff(buffer int) error {
	return status.Error(codes.ResourceExhausted, "watcher fell behind: more than "+strconv.Itoa(buffer)+" events buffered; reconnect and resynchronise")
}
