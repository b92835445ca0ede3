package etcdreg

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// StartTimeout bounds the first read of the shared registrations: a
// replica that cannot read them does not know its publishers, so it does
// not start (its orchestrator retries) rather than serve empty answers.
const StartTimeout = 30 * time.Second

// PeerListTimeout bounds the look-up of advertised peers at start; without
// an answer the replica starts from its own state directory.
const PeerListTimeout = 5 * time.Second

// Replica is one replica's link to the registrations it shares through
// etcd: the client it owns and, once Join has run, the Store. A nil
// *Replica is a single node, and every method is a no-op on it, so the
// app wires one path whether etcd is configured or not.
type Replica struct {
	cli   *clientv3.Client
	store *Store
}

// Connect makes the replica's etcd client (nil without endpoints). It
// does not wait for etcd.
func Connect(c ClientConfig) (*Replica, error) {
	if len(c.Endpoints) == 0 {
		return nil, nil
	}
	cli, err := NewClient(c)
	if err != nil {
		return nil, err
	}
	return &Replica{cli: cli}, nil
}

// BootstrapPeers are the peers to load a snapshot from: configured when
// given, else the replicas advertised under prefix (except self).
func (r *Replica) BootstrapPeers(configured []string, prefix, self string, log zerolog.Logger) []string {
	if len(configured) > 0 || r == nil {
		return configured
	}
	ctx, cancel := context.WithTimeout(context.Background(), PeerListTimeout)
	defer cancel()
	peers, err := Peers(ctx, r.cli, prefix, self)
	if err != nil {
		log.Warn().Err(err).Msg("cannot list peers in etcd; starting from the state directory")
		return nil
	}
	// Which peers were offered, and that etcd offered them, is what tells
	// a discovered bootstrap from a configured one in the log.
	log.Info().Strs("peers", peers).Msg("bootstrap peers found in etcd")
	return peers
}

// Join applies the shared registrations to opts.Registry (Open, bounded by
// StartTimeout) and hands it the store for later changes; the config
// file's registrations (opts.Static) stay local. opts.Client is the
// replica's own.
func (r *Replica) Join(opts Options, endpoints []string) error {
	if r == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	defer cancel()
	opts.Client = r.cli
	store, err := Open(ctx, opts)
	if err != nil {
		return err
	}
	r.store = store
	opts.Registry.SetStore(store)
	opts.Logger.Info().Strs("etcd", endpoints).Str("prefix", opts.Prefix).Int64("revision", store.Revision()).
		Int("services", len(opts.Registry.Services())).Msg("registrations shared through etcd")
	return nil
}

// Advertise offers this replica to new ones once it serves.
func (r *Replica) Advertise(url string) {
	if r != nil && r.store != nil && url != "" {
		r.store.Advertise(url)
	}
}

// Collectors are the shared store's metrics (none for a single node).
func (r *Replica) Collectors() []prometheus.Collector {
	if r == nil || r.store == nil {
		return nil
	}
	return []prometheus.Collector{r.store.Collector()}
}

// Leave stops applying shared changes and withdraws the advertisement;
// the registry keeps what it has, for the shutdown that follows. The
// client stays open until Close.
func (r *Replica) Leave() {
	if r == nil || r.store == nil {
		return
	}
	r.store.Close()
	r.store = nil
}

// Close leaves (if joined) and closes the client.
func (r *Replica) Close() {
	if r == nil {
		return
	}
	r.Leave()
	r.cli.Close()
}
