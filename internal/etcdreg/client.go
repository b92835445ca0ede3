package etcdreg

import (
	"fmt"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

// ClientConfig is how a replica reaches etcd.
type ClientConfig struct {
	Endpoints []string
	// CAFile, CertFile and KeyFile turn on TLS: the CA that signed the
	// servers' certificates and, for client authentication, the replica's
	// own certificate and key. Any of them set means TLS.
	CAFile, CertFile, KeyFile string
	// Username and Password, when set, authenticate to etcd.
	Username, Password string
}

// reconnectMaxDelay caps the wait between reconnection attempts, so a
// replica notices an etcd that came back within about a second or two
// (gRPC's default cap is two minutes).
const reconnectMaxDelay = time.Second

// NewClient connects lazily: it does not wait for etcd, so a replica
// starts (and answers queries) whatever etcd is doing; the first request
// finds out.
func NewClient(c ClientConfig) (*clientv3.Client, error) {
	cfg := clientv3.Config{
		Endpoints:            c.Endpoints,
		DialTimeout:          5 * time.Second,
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 5 * time.Second,
		Username:             c.Username,
		Password:             c.Password,
		// etcd's client logs through zap; ours logs what matters itself.
		Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: reconnectMaxDelay},
			MinConnectTimeout: 2 * time.Second,
		})},
	}
	if c.CAFile != "" || c.CertFile != "" || c.KeyFile != "" {
		if (c.CertFile == "") != (c.KeyFile == "") {
			return nil, fmt.Errorf("etcd TLS: a client certificate needs its key and a key its certificate")
		}
		// Without a certificate this is server verification only.
		tc, err := transport.TLSInfo{CertFile: c.CertFile, KeyFile: c.KeyFile, TrustedCAFile: c.CAFile}.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("etcd TLS: %w", err)
		}
		cfg.TLS = tc
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd client: %w", err)
	}
	return cli, nil
}
