package main

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/mooncake-conductor-go/conductor/internal/config"
	"github.com/mooncake-conductor-go/conductor/internal/etcdreg"
	"github.com/mooncake-conductor-go/conductor/registry"
)

// etcdStartTimeout bounds the first read of the shared registrations: a
// replica that cannot read them does not know its publishers, so it does
// not start (its orchestrator retries) rather than serve empty answers.
const etcdStartTimeout = 30 * time.Second

// peerListTimeout bounds the look-up of advertised peers at start; without
// an answer the replica starts from its own state directory.
const peerListTimeout = 5 * time.Second

// shared is a replica's link to the registrations it shares through etcd
// (nil for a single node).
type shared struct {
	cli   *clientv3.Client
	store *etcdreg.Store
}

// connectEtcd makes the replica's etcd client (nil without endpoints). It
// does not wait for etcd.
func connectEtcd(cfg *config.Config) (*clientv3.Client, error) {
	if len(cfg.Etcd.Endpoints) == 0 {
		return nil, nil
	}
	return etcdreg.NewClient(etcdreg.ClientConfig{
		Endpoints: cfg.Etcd.Endpoints, CAFile: cfg.Etcd.CAFile, CertFile: cfg.Etcd.CertFile, KeyFile: cfg.Etcd.KeyFile,
		Username: cfg.Etcd.Username, Password: cfg.Etcd.Password,
	})
}

// bootstrapPeers are the peers to load a snapshot from: --bootstrap-from
// when given, else the replicas advertised in etcd.
func bootstrapPeers(cfg *config.Config, cli *clientv3.Client, log zerolog.Logger) []string {
	if len(cfg.BootstrapFrom) > 0 || cli == nil {
		return cfg.BootstrapFrom
	}
	ctx, cancel := context.WithTimeout(context.Background(), peerListTimeout)
	defer cancel()
	peers, err := etcdreg.Peers(ctx, cli, cfg.Etcd.Prefix, cfg.Etcd.AdvertiseURL)
	if err != nil {
		log.Warn().Err(err).Msg("cannot list peers in etcd; starting from the state directory")
		return nil
	}
	// Which peers were offered, and that etcd offered them, is what tells
	// a discovered bootstrap from a configured one in the log.
	log.Info().Strs("peers", peers).Msg("bootstrap peers found in etcd")
	return peers
}

// openShared applies the shared registrations to reg and hands it the
// store for later changes; the config file's registrations stay local.
// On error it closes cli.
func openShared(cfg *config.Config, cli *clientv3.Client, reg *registry.Registry, log zerolog.Logger) (*shared, error) {
	if cli == nil {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), etcdStartTimeout)
	defer cancel()
	store, err := etcdreg.Open(ctx, etcdreg.Options{Client: cli, Prefix: cfg.Etcd.Prefix, Registry: reg, Static: cfg.StaticServices(), Logger: log})
	if err != nil {
		cli.Close()
		return nil, err
	}
	reg.SetStore(store)
	log.Info().Strs("etcd", cfg.Etcd.Endpoints).Str("prefix", cfg.Etcd.Prefix).Int64("revision", store.Revision()).
		Int("services", len(reg.Services())).Msg("registrations shared through etcd")
	return &shared{cli: cli, store: store}, nil
}

// advertise offers this replica to new ones once it serves.
func (s *shared) advertise(url string) {
	if s != nil && url != "" {
		s.store.Advertise(url)
	}
}

// collectors are the shared store's metrics (none for a single node).
func (s *shared) collectors() []prometheus.Collector {
	if s == nil {
		return nil
	}
	return []prometheus.Collector{s.store.Collector()}
}

// close stops applying shared changes and withdraws the advertisement;
// the registry keeps what it has, for the shutdown that follows.
func (s *shared) close() {
	if s == nil {
		return
	}
	s.store.Close()
	s.cli.Close()
}
