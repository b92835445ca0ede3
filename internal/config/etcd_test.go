package config

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestEtcd(t *testing.T) {
	pw := writeFile(t, "s3cret\n")
	base := func(extra map[string]string) map[string]string {
		m := map[string]string{"CONDUCTOR_CONFIG_PATH": "/nonexistent"}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want Etcd
		err  bool
	}{
		{"off by default", nil, base(nil), Etcd{Prefix: DefaultEtcdPrefix}, false},
		{"flag endpoints", []string{"--etcd-endpoints", "http://a:2379, http://b:2379,"}, base(nil),
			Etcd{Endpoints: []string{"http://a:2379", "http://b:2379"}, Prefix: DefaultEtcdPrefix}, false},
		{"env everything", nil, base(map[string]string{
			"CONDUCTOR_ETCD_ENDPOINTS": "https://e:2379", "CONDUCTOR_ETCD_PREFIX": "/prod/", "CONDUCTOR_ETCD_CA": "ca.pem",
			"CONDUCTOR_ETCD_CERT": "c.pem", "CONDUCTOR_ETCD_KEY": "k.pem", "CONDUCTOR_ETCD_USER": "u", "CONDUCTOR_ETCD_PASSWORD": "p"}),
			Etcd{Endpoints: []string{"https://e:2379"}, Prefix: "/prod/", CAFile: "ca.pem", CertFile: "c.pem", KeyFile: "k.pem", Username: "u", Password: "p"}, false},
		{"flag wins over env", []string{"--etcd-prefix", "/a/"}, base(map[string]string{"CONDUCTOR_ETCD_PREFIX": "/b/"}), Etcd{Prefix: "/a/"}, false},
		{"password file", []string{"--etcd-user", "u", "--etcd-password-file", pw}, base(nil), Etcd{Prefix: DefaultEtcdPrefix, Username: "u", Password: "s3cret"}, false},
		{"missing password file", []string{"--etcd-user", "u", "--etcd-password-file", "/nonexistent/pw"}, base(nil), Etcd{}, true},
		{"password without user", nil, base(map[string]string{"CONDUCTOR_ETCD_PASSWORD": "p"}), Etcd{}, true},
		{"cert without key", []string{"--etcd-cert", "c.pem"}, base(nil), Etcd{}, true},
		{"prefix without slash", []string{"--etcd-prefix", "/x"}, base(nil), Etcd{}, true},
		{"bootstrap peers", nil, base(map[string]string{"CONDUCTOR_BOOTSTRAP_FROM": "http://a:1, https://b:2"}), Etcd{Prefix: DefaultEtcdPrefix}, false},
		{"bootstrap not a URL", []string{"--bootstrap-from", "a:1"}, base(nil), Etcd{}, true},
		{"advertise", []string{"--advertise-url", "http://10.0.0.5:13333"}, base(nil), Etcd{Prefix: DefaultEtcdPrefix, AdvertiseURL: "http://10.0.0.5:13333"}, false},
		{"advertise not a URL", nil, base(map[string]string{"CONDUCTOR_ADVERTISE_URL": "10.0.0.5"}), Etcd{}, true},
		{"empty prefix", []string{"--etcd-prefix", ""}, base(nil), Etcd{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load(tc.args, env(tc.env))
			if (err != nil) != tc.err {
				t.Fatalf("err %v", err)
			}
			if err == nil {
				if tc.name == "bootstrap peers" && !cmp.Equal(c.BootstrapFrom, []string{"http://a:1", "https://b:2"}) {
					t.Errorf("bootstrap peers %v", c.BootstrapFrom)
				}
				if d := cmp.Diff(tc.want, c.Etcd); d != "" {
					t.Errorf("etcd settings (-want +got):\n%s", d)
				}
			}
		})
	}
}
