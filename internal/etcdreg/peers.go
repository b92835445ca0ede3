package etcdreg

import (
	"context"
	"sort"
	"time"

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
	for s.ctx.Err() == nil {
		lease, err := s.cli.Grant(s.ctx, int64(PeerTTL/time.Second))
		if err == nil {
			_, err = s.cli.Put(s.ctx, key, url, clientv3.WithLease(lease.ID))
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
		if s.ctx.Err() != nil {
			// Leave at once rather than at the lease's end.
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, _ = s.cli.Revoke(ctx, lease.ID)
			cancel()
			return
		}
		s.sleep(watchBackoff)
	}
}
