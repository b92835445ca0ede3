package etcdreg

import (
	"context"
	"errors"
	"sort"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// PeerTTL is the lease a replica advertises its URL under: a replica that
// dies stops being offered to new ones within about this long.
const PeerTTL = 10 * time.Second

func peersPrefix(prefix string) string {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return prefix + "peers/"
}

// Peers lists the URLs replicas advertise under prefix, except self, in
// a stable order.
func Peers(ctx context.Context, cli *clientv3.Client, prefix, self string) ([]string, error) {
	resp, err := cli.Get(ctx, peersPrefix(prefix), clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	var out []string
	for _, kv := range resp.Kvs {
		if u := string(kv.Value); u != "" && u != self {
			out = append(out, u)
		}
	}
	sort.Strings(out)
	return out, nil
}

// Advertise keeps url under the peers prefix, on a lease kept alive until
// Close, so new replicas can find this one to bootstrap from. When etcd is
// away the lease may expire; it is granted again once etcd is back.
func (s *Store) Advertise(url string) {
	s.adDone = make(chan struct{})
	go s.advertise(url)
}

func (s *Store) advertise(url string) {
	defer close(s.adDone)
	key := peersPrefix(s.opts.Prefix) + url
	// held is the lease the key was last put under. Leaving revokes that
	// one, whichever path the loop left by: a key left on a live lease
	// would be offered to new replicas for a PeerTTL after this one
	// closed.
	var held clientv3.LeaseID
	defer func() {
		if held != 0 {
			s.revoke(held)
		}
	}()
	for s.ctx.Err() == nil {
		lease, err := s.cli.Grant(s.ctx, int64(PeerTTL/time.Second))
		if err == nil {
			if _, err = s.cli.Put(s.ctx, key, url, clientv3.WithLease(lease.ID)); err == nil {
				if held != 0 && held != lease.ID {
					s.revoke(held)
				}
				held = lease.ID
			} else {
				s.revoke(lease.ID)
			}
		}
		if err != nil {
			if s.ctx.Err() == nil {
				s.log.Debug().Err(err).Msg("cannot advertise this replica in etcd yet; retrying")
			}
			s.sleep(watchBackoff * 5)
			continue
		}
		ka, err := s.cli.KeepAlive(s.ctx, lease.ID)
		if err == nil {
			for range ka {
				// Drain the acknowledgements; the channel closes when the
				// lease is lost or the store closes.
			}
		}
		s.sleep(watchBackoff)
	}
}

// revoke ends lease and with it the keys put under it, within the store's
// timeout; a lease that cannot be revoked expires by itself after PeerTTL.
func (s *Store) revoke(lease clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.Timeout)
	defer cancel()
	if _, err := s.cli.Revoke(ctx, lease); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		s.log.Warn().Err(err).Msg("cannot withdraw this replica's advertised URL from etcd; it expires by itself")
	}
}
