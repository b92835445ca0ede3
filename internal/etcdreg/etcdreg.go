// Package etcdreg shares the dynamic registrations of a group of replicas
// through etcd. Each registration is one key, <prefix>services/<service
// key>, holding the /register body that recreates it. A /register on any
// replica is one etcd transaction that decides it against the whole shared
// set by the single-node rules and writes it only if the set has not moved
// since it was read, so two conflicting registrations sent at once to two
// replicas cannot both win. Every replica, the deciding one included,
// watches the prefix and applies what it sees to its own registry, in
// revision order: etcd is the one record, the registries are its copies.
//
// When etcd cannot be reached, changes answer registry.ErrNotRecorded
// after a bounded wait (the API's 503) while queries and running
// subscriptions carry on; the watch resumes from the last revision it
// applied when etcd is back, or re-reads the set after a compaction and
// applies only the differences, so unchanged subscriptions keep running.
package etcdreg

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/mooncake-conductor-go/conductor/internal/registration"
	"github.com/mooncake-conductor-go/conductor/registry"
)

// DefaultPrefix is where registrations live unless configured otherwise.
const DefaultPrefix = "/conductor/"

// DefaultTimeout bounds how long a registration change waits for etcd.
const DefaultTimeout = 5 * time.Second

// Options configure Open.
type Options struct {
	Client *clientv3.Client
	// Prefix is the key prefix of this deployment (DefaultPrefix if "").
	Prefix   string
	Registry *registry.Registry
	// Static are the config file's registrations: local to each replica
	// (every replica reads the same file), never written to etcd, but
	// shared registrations are checked against them.
	Static []registry.Service
	// Timeout bounds each change's wait for etcd (DefaultTimeout if 0).
	Timeout     time.Duration
	MaxServices int
	Logger      zerolog.Logger
}

// Store is the etcd-backed registry.Store of one replica.
type Store struct {
	opts   Options
	cli    *clientv3.Client
	reg    *registry.Registry
	prefix string // <prefix>services/
	log    zerolog.Logger
	static map[registry.ServiceKey]registry.Service

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	// adDone is closed when Advertise's goroutine ends (nil: none).
	adDone chan struct{}

	mu sync.Mutex
	// known is the shared set as last applied: service key -> body.
	known map[registry.ServiceKey]string
	// rev is the etcd revision the applied set reflects.
	rev int64
	// advanced is closed and replaced whenever rev moves.
	advanced chan struct{}
	// results keeps, per key, the outcome of applying its latest put, so
	// the replica that wrote it can answer with the local outcome.
	results map[registry.ServiceKey]applied

	stats stats
}

type applied struct {
	rev int64
	err error
}

// Open reads the shared set, applies it to the registry (engines first,
// as at start-up), and starts watching. ctx bounds the initial read: a
// replica that cannot read the shared set does not know its publishers and
// should not start.
func Open(ctx context.Context, opts Options) (*Store, error) {
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	s := &Store{
		opts: opts, cli: opts.Client, reg: opts.Registry, log: opts.Logger,
		prefix:   opts.Prefix + "services/",
		static:   make(map[registry.ServiceKey]registry.Service, len(opts.Static)),
		known:    make(map[registry.ServiceKey]string),
		advanced: make(chan struct{}),
		results:  make(map[registry.ServiceKey]applied),
		done:     make(chan struct{}),
	}
	for _, svc := range opts.Static {
		s.static[svc.Key()] = svc
	}
	s.initStats()
	if err := s.relist(ctx); err != nil {
		return nil, fmt.Errorf("read registrations from etcd: %w", err)
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	go s.watch()
	return s, nil
}

// Close stops the watch and withdraws the advertisement; the registry
// keeps what it has.
func (s *Store) Close() {
	s.cancel()
	<-s.done
	if s.adDone != nil {
		<-s.adDone
	}
}

// Revision is the etcd revision the registry reflects.
func (s *Store) Revision() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rev
}

func (s *Store) keyOf(k registry.ServiceKey) string { return s.prefix + string(k) }

// unavailable wraps an etcd failure as the API's 503.
func unavailable(err error) error {
	return fmt.Errorf("%w: etcd: %w", registry.ErrNotRecorded, err)
}

// Register decides svc against the shared set in one transaction and
// returns once this replica has applied it.
func (s *Store) Register(svc registry.Service) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.Timeout)
	defer cancel()
	key := svc.Key()
	body := string(registration.Encode(&svc))
	for {
		resp, err := s.cli.Get(ctx, s.prefix, clientv3.WithPrefix())
		if err != nil {
			s.stats.failures.WithLabelValues("register").Inc()
			return false, unavailable(err)
		}
		existing, modRev := s.decodeSet(resp.Kvs, key)
		identical, err := registry.Check(existing, svc, s.opts.MaxServices)
		if err != nil {
			return false, err
		}
		if identical {
			if modRev == 0 {
				// The config file's own registration: local only.
				return s.reg.Apply(svc)
			}
			if err := s.waitApplied(ctx, modRev); err != nil {
				return false, err
			}
			// Identical: nothing changes, except that a stale source
			// restarts, as on a single node.
			return s.reg.Apply(svc)
		}
		// Written only if no registration changed since the read.
		txn, err := s.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(s.prefix), "<", resp.Header.Revision+1).WithPrefix()).
			Then(clientv3.OpPut(s.keyOf(key), body)).
			Commit()
		if err != nil {
			s.stats.failures.WithLabelValues("register").Inc()
			return false, unavailable(err)
		}
		if !txn.Succeeded {
			continue // the set moved; decide again on the new one
		}
		rev := txn.Header.Revision
		if err := s.waitApplied(ctx, rev); err != nil {
			return true, nil // recorded; the watch applies it shortly
		}
		s.mu.Lock()
		res := s.results[key]
		s.mu.Unlock()
		if res.rev == rev && res.err != nil {
			// The source could not be set up here: take the registration
			// back unless it changed meanwhile, and answer the error.
			_, derr := s.cli.Txn(ctx).
				If(clientv3.Compare(clientv3.ModRevision(s.keyOf(key)), "=", rev)).
				Then(clientv3.OpDelete(s.keyOf(key))).Commit()
			if derr != nil {
				s.log.Error().Err(derr).Str("service", string(key)).Msg("could not take back a shared registration whose source failed to start")
			}
			return false, res.err
		}
		return true, nil
	}
}

// Unregister deletes the shared registration; a config-file registration
// is removed locally, as on a single node.
func (s *Store) Unregister(key registry.ServiceKey) error {
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.Timeout)
	defer cancel()
	resp, err := s.cli.Delete(ctx, s.keyOf(key))
	if err != nil {
		s.stats.failures.WithLabelValues("unregister").Inc()
		return unavailable(err)
	}
	if resp.Deleted == 0 {
		if _, ok := s.static[key]; ok {
			return s.reg.Remove(key)
		}
		return fmt.Errorf("%w: %s", registry.ErrNotFound, key)
	}
	// Deleted either way; should the wait time out, the watch removes it
	// shortly.
	_ = s.waitApplied(ctx, resp.Header.Revision)
	return nil
}

// decodeSet turns the shared set into services, adding the config file's
// registrations whose keys it does not hold; modRev is the etcd revision
// of key's record (0 when etcd does not hold it).
func (s *Store) decodeSet(kvs []*mvccpb.KeyValue, key registry.ServiceKey) (set []registry.Service, modRev int64) {
	seen := make(map[registry.ServiceKey]bool, len(kvs))
	for _, kv := range kvs {
		svc, err := registration.DecodeService(kv.Value)
		if err != nil {
			s.log.Warn().Str("key", string(kv.Key)).Err(err).Msg("etcd holds a registration this release cannot read; ignored")
			continue
		}
		if svc.Key() == key {
			modRev = kv.ModRevision
		}
		seen[svc.Key()] = true
		set = append(set, svc)
	}
	for k, svc := range s.static {
		if !seen[k] {
			set = append(set, svc)
		}
	}
	return set, modRev
}

// waitApplied waits until the registry reflects revision rev.
func (s *Store) waitApplied(ctx context.Context, rev int64) error {
	for {
		s.mu.Lock()
		if s.rev >= rev {
			s.mu.Unlock()
			return nil
		}
		ch := s.advanced
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// advance records that the registry reflects rev; the caller holds mu.
func (s *Store) advance(rev int64) {
	if rev > s.rev {
		s.rev = rev
		close(s.advanced)
		s.advanced = make(chan struct{})
	}
}

// watchBackoff spaces attempts to re-establish a failed watch.
const watchBackoff = 200 * time.Millisecond

// watch applies every change under the prefix in revision order until
// Close. The client re-establishes a broken watch itself from the next
// revision; a watch that ends anyway is re-opened from there, and one
// whose revision was compacted away re-reads the set.
func (s *Store) watch() {
	defer close(s.done)
	for s.ctx.Err() == nil {
		s.mu.Lock()
		from := s.rev + 1
		s.mu.Unlock()
		wctx, cancel := context.WithCancel(s.ctx)
		ch := s.cli.Watch(wctx, s.prefix, clientv3.WithPrefix(), clientv3.WithRev(from), clientv3.WithPrevKV())
		relist := false
		for wr := range ch {
			if wr.CompactRevision != 0 || errors.Is(wr.Err(), rpctypes.ErrCompacted) {
				relist = true
				break
			}
			if err := wr.Err(); err != nil {
				s.stats.failures.WithLabelValues("watch").Inc()
				s.log.Warn().Err(err).Msg("etcd watch failed; re-opening it")
				break
			}
			s.applyEvents(wr.Events)
		}
		cancel()
		if relist {
			s.stats.relists.Inc()
			s.log.Warn().Int64("from", from).Msg("etcd compacted past the watch; re-reading the registrations")
			for s.ctx.Err() == nil {
				rctx, rcancel := context.WithTimeout(s.ctx, s.opts.Timeout)
				err := s.relist(rctx)
				rcancel()
				if err == nil {
					break
				}
				s.stats.failures.WithLabelValues("relist").Inc()
				s.log.Warn().Err(err).Msg("cannot re-read the registrations from etcd; retrying")
				s.sleep(watchBackoff)
			}
			continue
		}
		s.sleep(watchBackoff)
	}
}

func (s *Store) sleep(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-s.ctx.Done():
	}
}

// applyEvents applies one watch response's changes.
func (s *Store) applyEvents(evs []*clientv3.Event) {
	for _, ev := range evs {
		key := registry.ServiceKey(strings.TrimPrefix(string(ev.Kv.Key), s.prefix))
		switch ev.Type {
		case clientv3.EventTypePut:
			s.put(key, string(ev.Kv.Value), ev.Kv.ModRevision)
		case clientv3.EventTypeDelete:
			s.del(key)
		}
		s.mu.Lock()
		s.advance(ev.Kv.ModRevision)
		s.mu.Unlock()
	}
}

// put applies a shared registration; a changed body replaces the old one.
func (s *Store) put(key registry.ServiceKey, body string, rev int64) {
	s.mu.Lock()
	old, had := s.known[key]
	s.known[key] = body
	s.mu.Unlock()
	if had && old == body {
		return
	}
	svc, err := registration.DecodeService([]byte(body))
	if err == nil && svc.Key() != key {
		err = fmt.Errorf("record under key %s is for service %s", key, svc.Key())
	}
	if err != nil {
		s.log.Warn().Str("service", string(key)).Err(err).Msg("etcd holds a registration this release cannot read; ignored")
		return
	}
	if had {
		if rerr := s.reg.Remove(key); rerr != nil && !errors.Is(rerr, registry.ErrNotFound) {
			s.log.Warn().Str("service", string(key)).Err(rerr).Msg("could not remove a replaced shared registration")
		}
	}
	_, err = s.reg.Apply(svc)
	if err != nil {
		s.log.Warn().Str("service", string(key)).Err(err).Msg("shared registration not applied on this replica")
	}
	s.mu.Lock()
	s.results[key] = applied{rev: rev, err: err}
	if err != nil && s.known[key] == body {
		// Not applied, so not known as applied: the next relist tries
		// again instead of skipping an unchanged body, and this replica
		// does not stay without a registration the others have.
		delete(s.known, key)
	}
	s.mu.Unlock()
}

// del removes a shared registration.
func (s *Store) del(key registry.ServiceKey) {
	s.mu.Lock()
	_, had := s.known[key]
	delete(s.known, key)
	delete(s.results, key)
	s.mu.Unlock()
	if !had {
		return
	}
	if err := s.reg.Remove(key); err != nil && !errors.Is(err, registry.ErrNotFound) {
		s.log.Warn().Str("service", string(key)).Err(err).Msg("could not remove a shared registration")
	}
}

// relist reads the whole shared set and applies only its differences
// from what is applied: at start, and after a compaction.
func (s *Store) relist(ctx context.Context) error {
	resp, err := s.cli.Get(ctx, s.prefix, clientv3.WithPrefix())
	if err != nil {
		return err
	}
	now := make(map[registry.ServiceKey]*mvccpb.KeyValue, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		now[registry.ServiceKey(strings.TrimPrefix(string(kv.Key), s.prefix))] = kv
	}
	s.mu.Lock()
	var gone []registry.ServiceKey
	for k := range s.known {
		if _, ok := now[k]; !ok {
			gone = append(gone, k)
		}
	}
	s.mu.Unlock()
	for _, k := range gone {
		s.del(k)
	}
	_ = registry.EnginesFirst(resp.Kvs, func(kv *mvccpb.KeyValue) bool { return isEngineBody(kv.Value) }, func(kv *mvccpb.KeyValue) error {
		s.put(registry.ServiceKey(strings.TrimPrefix(string(kv.Key), s.prefix)), string(kv.Value), kv.ModRevision)
		return nil
	})
	s.mu.Lock()
	s.advance(resp.Header.Revision)
	s.mu.Unlock()
	return nil
}

// isEngineBody reports whether a record is an engine's; an unreadable one
// counts as an engine, and put reports it.
func isEngineBody(b []byte) bool {
	svc, err := registration.DecodeService(b)
	return err != nil || svc.IsEngine()
}
