package main

import (
	"context"
	"time"

	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/mooncake-conductor-go/conductor/config"
	"github.com/mooncake-conductor-go/conductor/etcdreg"
	"github.com/mooncake-conductor-go/conductor/registry"
)

// etcdStartTimeout bounds the first read of the shared registrations: a
// replica that cannot read them does not know its publishers, so it does
// not start (its orchestrator retries) rather than serve empty answers.
const etcdStartTimeout = 30 * time.Second

// shared is a replica's link to the registrations it shares through etcd
// (nil for a single node).
type shared struct {
	cli   *clientv3.Client
	store *etcdreg.Store
}

// openShared applies the shared registrations to reg and hands it the
// store for later changes; static are the config file's, which stay local.
func openShared(cfg *config.Config, reg *registry.Registry, log zerolog.Logger) (*shared, error) {
	if len(cfg.Etcd.Endpoints) == 0 {
		return nil, nil
	}
	cli, err := etcdreg.NewClient(etcdreg.ClientConfig{
		Endpoints: cfg.Etcd.Endpoints, CAFile: cfg.Etcd.CAFile, CertFile: cfg.Etcd.CertFile, KeyFile: cfg.Etcd.KeyFile,
		Username: cfg.Etcd.Username, Password: cfg.Etcd.Password,
	})
	if err != nil {
		return nil, err
	}
	static := make([]registry.Service, len(cfg.Static))
	for i, st := range cfg.Static {
		static[i] = st.Service
	}
	ctx, cancel := context.WithTimeout(context.Background(), etcdStartTimeout)
	defer cancel()
	store, err := etcdreg.Open(ctx, etcdreg.Options{Client: cli, Prefix: cfg.Etcd.Prefix, Registry: reg, Static: static, Logger: log})
	if err != nil {
		cli.Close()
		return nil, err
	}
	reg.SetStore(store)
	log.Info().Strs("etcd", cfg.Etcd.Endpoints).Str("prefix", cfg.Etcd.Prefix).Int64("revision", store.Revision()).
		Int("services", len(reg.Services())).Msg("registrations shared through etcd")
	return &shared{cli: cli, store: store}, nil
}

// close stops applying shared changes; the registry keeps what it has,
// for the shutdown that follows.
func (s *shared) close() {
	if s == nil {
		return
	}
	s.store.Close()
	s.cli.Close()
}
