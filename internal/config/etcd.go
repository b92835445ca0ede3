package config

import (
	"flag"
	"fmt"
	"os"
	"strings"
)

// Etcd is where replicas share their registrations; no endpoints means a
// single node that keeps them in its state directory.
type Etcd struct {
	Endpoints []string
	// Prefix holds this deployment's keys (default "/conductor/").
	Prefix string
	// CAFile, CertFile and KeyFile turn on TLS to etcd.
	CAFile, CertFile, KeyFile string
	// Username and Password authenticate to etcd when set.
	Username, Password string
	// AdvertiseURL is this replica's URL for peers ("" advertises none).
	AdvertiseURL string
}

// DefaultEtcdPrefix is where a deployment's keys live unless configured.
const DefaultEtcdPrefix = "/conductor/"

type etcdFlags struct {
	endpoints, prefix, ca, cert, key, user, passwordFile *string
	bootstrap, advertise                                 *string
}

func (e *etcdFlags) declare(fl *flag.FlagSet) {
	e.endpoints = fl.String("etcd-endpoints", "", "comma-separated etcd endpoints; when set, replicas share their registrations through etcd (env CONDUCTOR_ETCD_ENDPOINTS)")
	e.prefix = fl.String("etcd-prefix", DefaultEtcdPrefix, "key prefix of this deployment in etcd (env CONDUCTOR_ETCD_PREFIX)")
	e.ca = fl.String("etcd-ca", "", "CA certificate file for TLS to etcd (env CONDUCTOR_ETCD_CA)")
	e.cert = fl.String("etcd-cert", "", "client certificate file for TLS to etcd (env CONDUCTOR_ETCD_CERT)")
	e.key = fl.String("etcd-key", "", "client key file for TLS to etcd (env CONDUCTOR_ETCD_KEY)")
	e.user = fl.String("etcd-user", "", "etcd user name (env CONDUCTOR_ETCD_USER)")
	e.bootstrap = fl.String("bootstrap-from", "", "comma-separated base URLs of peer replicas to load the index snapshot from at start, tried in order before the state directory (env CONDUCTOR_BOOTSTRAP_FROM)")
	e.advertise = fl.String("advertise-url", "", "this replica's base URL as its peers reach it, advertised in etcd under a lease so new replicas can bootstrap from it (env CONDUCTOR_ADVERTISE_URL)")
	e.passwordFile = fl.String("etcd-password-file", "", "file holding the etcd user's password (env CONDUCTOR_ETCD_PASSWORD_FILE, or the password in CONDUCTOR_ETCD_PASSWORD)")
}

// loadEtcd fills c.Etcd from the flags and the environment.
func (f *flags) loadEtcd(c *Config, getenv func(string) string) error {
	e := &f.etcd
	for _, ep := range strings.Split(f.pick("etcd-endpoints", *e.endpoints, getenv("CONDUCTOR_ETCD_ENDPOINTS")), ",") {
		if ep = strings.TrimSpace(ep); ep != "" {
			c.Etcd.Endpoints = append(c.Etcd.Endpoints, ep)
		}
	}
	for _, u := range strings.Split(f.pick("bootstrap-from", *e.bootstrap, getenv("CONDUCTOR_BOOTSTRAP_FROM")), ",") {
		if u = strings.TrimSpace(u); u != "" {
			if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
				return fmt.Errorf("invalid --bootstrap-from URL %q: want http:// or https://", u)
			}
			c.BootstrapFrom = append(c.BootstrapFrom, u)
		}
	}
	c.Etcd.AdvertiseURL = f.pick("advertise-url", *e.advertise, getenv("CONDUCTOR_ADVERTISE_URL"))
	if u := c.Etcd.AdvertiseURL; u != "" && !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
		return fmt.Errorf("invalid --advertise-url %q: want http:// or https://", u)
	}
	c.Etcd.Prefix = f.pick("etcd-prefix", *e.prefix, getenv("CONDUCTOR_ETCD_PREFIX"))
	if c.Etcd.Prefix == "" || !strings.HasSuffix(c.Etcd.Prefix, "/") {
		return fmt.Errorf("invalid etcd prefix %q: want a non-empty prefix ending in /", c.Etcd.Prefix)
	}
	c.Etcd.CAFile = f.pick("etcd-ca", *e.ca, getenv("CONDUCTOR_ETCD_CA"))
	c.Etcd.CertFile = f.pick("etcd-cert", *e.cert, getenv("CONDUCTOR_ETCD_CERT"))
	c.Etcd.KeyFile = f.pick("etcd-key", *e.key, getenv("CONDUCTOR_ETCD_KEY"))
	if (c.Etcd.CertFile == "") != (c.Etcd.KeyFile == "") {
		return fmt.Errorf("--etcd-cert and --etcd-key go together")
	}
	c.Etcd.Username = f.pick("etcd-user", *e.user, getenv("CONDUCTOR_ETCD_USER"))
	if pf := f.pick("etcd-password-file", *e.passwordFile, getenv("CONDUCTOR_ETCD_PASSWORD_FILE")); pf != "" {
		b, err := os.ReadFile(pf)
		if err != nil {
			return fmt.Errorf("read etcd password: %w", err)
		}
		c.Etcd.Password = strings.TrimRight(string(b), "\r\n")
	} else {
		c.Etcd.Password = getenv("CONDUCTOR_ETCD_PASSWORD")
	}
	if c.Etcd.Password != "" && c.Etcd.Username == "" {
		return fmt.Errorf("an etcd password needs --etcd-user")
	}
	return nil
}
