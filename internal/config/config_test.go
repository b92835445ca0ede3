package config

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// noFile is an environment that names no config file, so only flags and
// the environment count; Load only reads it.
var noFile = map[string]string{"CONDUCTOR_CONFIG_PATH": "/nonexistent"}

// noFileWith is noFile with one more variable.
func noFileWith(k, v string) map[string]string {
	return map[string]string{"CONDUCTOR_CONFIG_PATH": "/nonexistent", k: v}
}

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "conductor_config.json")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

const static = `{"kvevent_instance": {"p0": {"endpoint": "tcp://127.0.0.1:5557", "type": "vLLM", "modelname": "m",
  "instance_id": "p0", "block_size": 16, "dp_rank": 0,
  "hash_profile": {"strategy": "vllm_v1", "algorithm": "sha256_cbor", "python_hash_seed": "0", "index_projection": "low64_be"}}}}`

func TestLoad(t *testing.T) {
	withPort := writeFile(t, `{"http_server_port": 14000}`)
	tests := []struct {
		name     string
		args     []string
		env      map[string]string
		port     int
		level    zerolog.Level
		warnings int
		static   int
		err      string
	}{
		{name: "missing file warns and keeps defaults", env: map[string]string{"CONDUCTOR_CONFIG_PATH": "/nonexistent/c.json"}, port: 13333, level: zerolog.InfoLevel, warnings: 1},
		{name: "file without port keeps 13333", env: map[string]string{"CONDUCTOR_CONFIG_PATH": writeFile(t, static)}, port: 13333, level: zerolog.InfoLevel, static: 1},
		{name: "file port", env: map[string]string{"CONDUCTOR_CONFIG_PATH": withPort}, port: 14000, level: zerolog.InfoLevel},
		{name: "env beats file", env: map[string]string{"CONDUCTOR_CONFIG_PATH": withPort, "CONDUCTOR_HTTP_PORT": "15000", "CONDUCTOR_LOG_LEVEL": "debug"}, port: 15000, level: zerolog.DebugLevel},
		{name: "flag beats env", args: []string{"--port", "16000", "--log-level", "ERROR"}, env: map[string]string{"CONDUCTOR_CONFIG_PATH": withPort, "CONDUCTOR_HTTP_PORT": "15000", "CONDUCTOR_LOG_LEVEL": "DEBUG"}, port: 16000, level: zerolog.ErrorLevel},
		{name: "flag config path", args: []string{"--config", withPort}, env: map[string]string{"CONDUCTOR_CONFIG_PATH": "/nonexistent"}, port: 14000, level: zerolog.InfoLevel},
		{name: "bad level", env: map[string]string{"CONDUCTOR_CONFIG_PATH": withPort, "CONDUCTOR_LOG_LEVEL": "LOUD"}, err: "invalid log level"},
		{name: "bad json", env: map[string]string{"CONDUCTOR_CONFIG_PATH": writeFile(t, `{`)}, err: "parse config"},
		{name: "bad static registration names it", env: map[string]string{"CONDUCTOR_CONFIG_PATH": writeFile(t, strings.Replace(static, `"block_size": 16`, `"block_size": 0`, 1))}, err: `kvevent_instance "p0": block_size: block_size must be positive`},
		{name: "static registration with unknown field", env: map[string]string{"CONDUCTOR_CONFIG_PATH": writeFile(t, strings.Replace(static, `"dp_rank": 0`, `"dp_rank": 0, "extra": 1`, 1))}, err: `unknown field "extra"`},
		{name: "static registration without a required member", env: map[string]string{"CONDUCTOR_CONFIG_PATH": writeFile(t, strings.Replace(static, `"dp_rank": 0,`, ``, 1))}, err: "dp_rank is required"},
		{name: "static registration without a profile member", env: map[string]string{"CONDUCTOR_CONFIG_PATH": writeFile(t, strings.Replace(static, `"algorithm": "sha256_cbor", `, ``, 1))}, err: "hash_profile.algorithm is required"},
		{name: "static registration breaking a profile rule", env: map[string]string{"CONDUCTOR_CONFIG_PATH": writeFile(t, strings.Replace(static, `"python_hash_seed": "0", `, ``, 1))}, err: "python_hash_seed is required for strategy vllm_v1"},
		{name: "static registration declaring KV-cache groups", env: map[string]string{"CONDUCTOR_CONFIG_PATH": writeFile(t, strings.Replace(static, `"dp_rank": 0,`, `"dp_rank": 0, "kv_cache_groups": [{"kind": "sliding_window", "block_size": 16, "sliding_window": 128}, {"kind": "full_attention", "block_size": 16}],`, 1))}, port: 13333, level: zerolog.InfoLevel, static: 1},
		{name: "static KV-cache group with an unknown member", env: map[string]string{"CONDUCTOR_CONFIG_PATH": writeFile(t, strings.Replace(static, `"dp_rank": 0,`, `"dp_rank": 0, "kv_cache_groups": [{"kind": "mamba", "block_size": 16, "dtype": "bf16"}],`, 1))}, err: `unknown field "dtype"`},
		{name: "static KV-cache group without a kind", env: map[string]string{"CONDUCTOR_CONFIG_PATH": writeFile(t, strings.Replace(static, `"dp_rank": 0,`, `"dp_rank": 0, "kv_cache_groups": [{"block_size": 16}],`, 1))}, err: "kind and block_size are required"},
		{name: "static KV-cache groups breaking a rule", env: map[string]string{"CONDUCTOR_CONFIG_PATH": writeFile(t, strings.Replace(static, `"dp_rank": 0,`, `"dp_rank": 0, "kv_cache_groups": [{"kind": "sliding_window", "block_size": 16}],`, 1))}, err: "kv_cache_groups: group 0: a sliding_window group needs sliding_window"},
		{name: "static registration at vLLM's defaults", env: map[string]string{"CONDUCTOR_CONFIG_PATH": writeFile(t, strings.Replace(static, `"algorithm": "sha256_cbor", "python_hash_seed": "0"`, `"algorithm": "sha256", "python_hash_seed": "vllm-none-hash"`, 1))}, port: 13333, level: zerolog.InfoLevel, static: 1},
		{name: "static registration under xxhash", env: map[string]string{"CONDUCTOR_CONFIG_PATH": writeFile(t, strings.Replace(static, `"algorithm": "sha256_cbor", "python_hash_seed": "0"`, `"algorithm": "xxhash_cbor", "python_hash_seed": "42"`, 1))}, port: 13333, level: zerolog.InfoLevel, static: 1},
		{name: "static xxhash without PYTHONHASHSEED", env: map[string]string{"CONDUCTOR_CONFIG_PATH": writeFile(t, strings.Replace(static, `"algorithm": "sha256_cbor", "python_hash_seed": "0"`, `"algorithm": "xxhash", "python_hash_seed": "vllm-none-hash"`, 1))}, err: "set PYTHONHASHSEED"},
		{name: "static registration with the standard hash", env: map[string]string{"CONDUCTOR_CONFIG_PATH": writeFile(t, strings.Replace(static, `"strategy": "vllm_v1", "algorithm": "sha256_cbor", "python_hash_seed": "0", "index_projection": "low64_be"`, `"strategy": "rfc1527", "algorithm": "xxh3_64", "seed": "7"`, 1))}, port: 13333, level: zerolog.InfoLevel, static: 1},
		{name: "static standard hash with a projection", env: map[string]string{"CONDUCTOR_CONFIG_PATH": writeFile(t, strings.Replace(static, `"strategy": "vllm_v1", "algorithm": "sha256_cbor", "python_hash_seed": "0"`, `"strategy": "rfc1527", "algorithm": "xxh3_64"`, 1))}, err: "index_projection"},
		{name: "static standard hash with a bad seed", env: map[string]string{"CONDUCTOR_CONFIG_PATH": writeFile(t, strings.Replace(static, `"strategy": "vllm_v1", "algorithm": "sha256_cbor", "python_hash_seed": "0", "index_projection": "low64_be"`, `"strategy": "rfc1527", "algorithm": "xxh3_64", "seed": "x"`, 1))}, err: "seed"},
		{name: "static registration with a string block size", env: map[string]string{"CONDUCTOR_CONFIG_PATH": writeFile(t, strings.Replace(static, `"block_size": 16`, `"block_size": "16"`, 1))}, err: "block_size"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load(tc.args, env(tc.env))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Port != tc.port || c.LogLevel != tc.level || len(c.Warnings) != tc.warnings || len(c.Static) != tc.static {
				t.Errorf("got port=%d level=%v warnings=%v static=%d", c.Port, c.LogLevel, c.Warnings, len(c.Static))
			}
			for i, svc := range c.StaticServices() {
				if svc.Key() != c.Static[i].Service.Key() {
					t.Errorf("StaticServices()[%d] is %s, Static[%d] is %s", i, svc.Key(), i, c.Static[i].Service.Key())
				}
			}
			if n := len(c.StaticServices()); n != len(c.Static) {
				t.Errorf("StaticServices gave %d services for %d registrations", n, len(c.Static))
			}
		})
	}
}

func TestAuthToken(t *testing.T) {
	tokenFile := writeFile(t, "  tok-123\n")
	empty := writeFile(t, "\n")
	base := noFile
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string
		err  bool
	}{
		{"off by default", nil, base, "", false},
		{"flag file", []string{"--auth-token-file", tokenFile}, base, "tok-123", false},
		{"env file", nil, map[string]string{"CONDUCTOR_CONFIG_PATH": "/nonexistent", "CONDUCTOR_AUTH_TOKEN_FILE": tokenFile}, "tok-123", false},
		{"env value", nil, map[string]string{"CONDUCTOR_CONFIG_PATH": "/nonexistent", "CONDUCTOR_AUTH_TOKEN": "v"}, "v", false},
		{"empty file", []string{"--auth-token-file", empty}, base, "", true},
		{"missing file", []string{"--auth-token-file", "/nonexistent/tok"}, base, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load(tc.args, env(tc.env))
			if (err != nil) != tc.err {
				t.Fatalf("err %v", err)
			}
			if err == nil && c.AuthToken != tc.want {
				t.Errorf("token %q, want %q", c.AuthToken, tc.want)
			}
		})
	}
}

func TestMemoSize(t *testing.T) {
	base := noFile
	withEnv := noFileWith
	hash := func(c *Config) int { return c.MemoBytes }
	token := func(c *Config) int { return c.TokenMemoBytes }
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		get  func(*Config) int
		want int
		err  bool
	}{
		{"hash default", nil, base, hash, DefaultMemoMiB << 20, false},
		{"hash env", nil, withEnv("CONDUCTOR_HASH_MEMO_MIB", "8"), hash, 8 << 20, false},
		{"hash flag beats env", []string{"--hash-memo-mib", "0"}, withEnv("CONDUCTOR_HASH_MEMO_MIB", "8"), hash, 0, false},
		{"hash bad env", nil, withEnv("CONDUCTOR_HASH_MEMO_MIB", "lots"), hash, 0, true},
		{"token default", nil, base, token, DefaultTokenMemoMiB << 20, false},
		{"token env", nil, withEnv("CONDUCTOR_TOKEN_MEMO_MIB", "3"), token, 3 << 20, false},
		{"token flag beats env", []string{"--token-memo-mib", "0"}, withEnv("CONDUCTOR_TOKEN_MEMO_MIB", "3"), token, 0, false},
		{"token env leaves hash", nil, withEnv("CONDUCTOR_TOKEN_MEMO_MIB", "3"), hash, DefaultMemoMiB << 20, false},
		{"token negative flag", []string{"--token-memo-mib", "-2"}, base, token, 0, true},
		{"hash flag at its default beats env", []string{"--hash-memo-mib", "64"}, withEnv("CONDUCTOR_HASH_MEMO_MIB", "8"), hash, 64 << 20, false},
		{"token bad env", nil, withEnv("CONDUCTOR_TOKEN_MEMO_MIB", "-1"), token, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load(tc.args, env(tc.env))
			if (err != nil) != tc.err {
				t.Fatalf("err %v", err)
			}
			if err == nil && tc.get(c) != tc.want {
				t.Errorf("memo bytes %d, want %d", tc.get(c), tc.want)
			}
		})
	}
}

func TestHelpAndVersion(t *testing.T) {
	for _, h := range []string{"-h", "--help", "-help"} {
		if _, err := Load([]string{h}, env(nil)); !errors.Is(err, flag.ErrHelp) {
			t.Errorf("%s: err %v, want flag.ErrHelp", h, err)
		}
	}
	// --version reads no file: a broken one must not stop it.
	bad := writeFile(t, "{")
	c, err := Load([]string{"--version"}, env(map[string]string{"CONDUCTOR_CONFIG_PATH": bad}))
	if err != nil || !c.ShowVersion {
		t.Fatalf("--version: %+v, %v", c, err)
	}
	c, err = Load(nil, env(map[string]string{"CONDUCTOR_CONFIG_PATH": "/nonexistent"}))
	if err != nil || c.ShowVersion {
		t.Fatalf("no flags: ShowVersion %v, %v", c.ShowVersion, err)
	}
	if _, err := Load([]string{"--no-such-flag"}, env(nil)); err == nil || !strings.Contains(err.Error(), "no-such-flag") {
		t.Errorf("unknown flag: %v", err)
	}
}

// TestUsageShowsRealDefaults: --help states the values the service runs
// with when nothing else sets them.
func TestUsageShowsRealDefaults(t *testing.T) {
	u := Usage()
	for _, want := range []string{
		"-hash-memo-mib int\n", "(default 64)", "-port int\n", "(default 13333)",
		`(default "INFO")`, `(default "json")`, "-version", "conductor_config.json",
	} {
		if !strings.Contains(u, want) {
			t.Errorf("usage lacks %q:\n%s", want, u)
		}
	}
	if strings.Contains(u, "default -1") {
		t.Errorf("usage shows a sentinel default:\n%s", u)
	}
	// Both memo flags and the hash-check sampling carry their real
	// default, and the removed answer cache has no flag.
	if n := strings.Count(u, "(default 64)"); n != 3 {
		t.Errorf("%d flags show (default 64), want 3 (both memos, hash check)", n)
	}
	if strings.Contains(u, "answer-cache") {
		t.Errorf("usage names the removed answer cache:\n%s", u)
	}
}

// TestFlagDefaultsYield: a flag left at its default never hides the
// environment or the file, and a flag given explicitly wins even when it
// repeats the default.
func TestFlagDefaultsYield(t *testing.T) {
	withPort := writeFile(t, `{"http_server_port": 14000}`)
	for _, tc := range []struct {
		name   string
		args   []string
		env    map[string]string
		port   int
		level  zerolog.Level
		format string
	}{
		{"env level over default", nil, map[string]string{"CONDUCTOR_CONFIG_PATH": withPort, "CONDUCTOR_LOG_LEVEL": "DEBUG"}, 14000, zerolog.DebugLevel, "json"},
		{"explicit default level over env", []string{"--log-level", "INFO"}, map[string]string{"CONDUCTOR_CONFIG_PATH": withPort, "CONDUCTOR_LOG_LEVEL": "DEBUG"}, 14000, zerolog.InfoLevel, "json"},
		{"explicit default port over file", []string{"--port", "13333"}, map[string]string{"CONDUCTOR_CONFIG_PATH": withPort}, 13333, zerolog.InfoLevel, "json"},
		{"explicit port 0", []string{"--port", "0"}, map[string]string{"CONDUCTOR_CONFIG_PATH": withPort}, 0, zerolog.InfoLevel, "json"},
		{"env format", nil, map[string]string{"CONDUCTOR_CONFIG_PATH": "/nonexistent", "CONDUCTOR_LOG_FORMAT": "console"}, 13333, zerolog.InfoLevel, "console"},
		{"explicit json format over env", []string{"--log-format", "json"}, map[string]string{"CONDUCTOR_CONFIG_PATH": "/nonexistent", "CONDUCTOR_LOG_FORMAT": "console"}, 13333, zerolog.InfoLevel, "json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load(tc.args, env(tc.env))
			if err != nil {
				t.Fatal(err)
			}
			if c.Port != tc.port || c.LogLevel != tc.level || c.LogFormat != tc.format {
				t.Errorf("port %d level %v format %s", c.Port, c.LogLevel, c.LogFormat)
			}
		})
	}
}

// TestBoolSettings: --debug-routes (off by default)
// take the flag, else the environment variable, else the default, and
// refuse a variable that is not a boolean.
func TestBoolSettings(t *testing.T) {
	for _, s := range []struct {
		flag, env string
		def       bool
		get       func(*Config) bool
	}{
		{"debug-routes", "CONDUCTOR_DEBUG_ROUTES", false, func(c *Config) bool { return c.DebugRoutes }},
	} {
		withEnv := func(v string) map[string]string { return noFileWith(s.env, v) }
		for _, tc := range []struct {
			name string
			args []string
			env  map[string]string
			want bool
			err  bool
		}{
			{"default", nil, noFile, s.def, false},
			{"flag", []string{"--" + s.flag}, noFile, true, false},
			{"flag false", []string{"--" + s.flag + "=false"}, noFile, false, false},
			{"env on", nil, withEnv("1"), true, false},
			{"env off", nil, withEnv("false"), false, false},
			{"flag beats env", []string{"--" + s.flag}, withEnv("0"), true, false},
			{"explicit false beats env", []string{"--" + s.flag + "=false"}, withEnv("1"), false, false},
			{"bad env", nil, withEnv("yes please"), false, true},
		} {
			t.Run(s.flag+"/"+tc.name, func(t *testing.T) {
				c, err := Load(tc.args, env(tc.env))
				if (err != nil) != tc.err {
					t.Fatalf("err %v", err)
				}
				if err == nil && s.get(c) != tc.want {
					t.Errorf("%s %v, want %v", s.flag, s.get(c), tc.want)
				}
			})
		}
	}
}

func TestHashCheckEvery(t *testing.T) {
	base := noFile
	withEnv := func(v string) map[string]string { return noFileWith("CONDUCTOR_HASH_CHECK_EVERY", v) }
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want int
		err  bool
	}{
		{"default", nil, base, DefaultHashCheckEvery, false},
		{"env", nil, withEnv("8"), 8, false},
		{"env off", nil, withEnv("0"), 0, false},
		{"flag beats env", []string{"--hash-check-every", "1"}, withEnv("8"), 1, false},
		{"flag off", []string{"--hash-check-every=0"}, base, 0, false},
		{"negative flag", []string{"--hash-check-every", "-1"}, base, 0, true},
		{"bad env", nil, withEnv("often"), 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load(tc.args, env(tc.env))
			if (err != nil) != tc.err {
				t.Fatalf("err %v", err)
			}
			if err == nil && c.HashCheckEvery != tc.want {
				t.Errorf("HashCheckEvery %d, want %d", c.HashCheckEvery, tc.want)
			}
		})
	}
}

func TestGRPCDoor(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none.json")
	tests := []struct {
		name            string
		args            []string
		env             map[string]string
		addr, cert, key string
		err             string
	}{
		{name: "off by default"},
		{name: "flag", args: []string{"--grpc-addr", ":9090"}, addr: ":9090"},
		{name: "env", env: map[string]string{"CONDUCTOR_GRPC_ADDR": ":9091"}, addr: ":9091"},
		{name: "flag over env", args: []string{"--grpc-addr", ":1"}, env: map[string]string{"CONDUCTOR_GRPC_ADDR": ":2"}, addr: ":1"},
		{name: "tls pair", args: []string{"--grpc-addr", ":1", "--grpc-tls-cert", "c.pem"}, env: map[string]string{"CONDUCTOR_GRPC_TLS_KEY": "k.pem"}, addr: ":1", cert: "c.pem", key: "k.pem"},
		{name: "cert alone", args: []string{"--grpc-addr", ":1", "--grpc-tls-cert", "c.pem"}, err: "both"},
		{name: "key alone", env: map[string]string{"CONDUCTOR_GRPC_ADDR": ":1", "CONDUCTOR_GRPC_TLS_KEY": "k.pem"}, err: "both"},
		{name: "tls without the door", args: []string{"--grpc-tls-cert", "c.pem", "--grpc-tls-key", "k.pem"}, err: "off"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load(append([]string{"--config", missing}, tc.args...), env(tc.env))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one mentioning %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.GRPCAddr != tc.addr || c.GRPCTLSCert != tc.cert || c.GRPCTLSKey != tc.key {
				t.Fatalf("got %q %q %q", c.GRPCAddr, c.GRPCTLSCert, c.GRPCTLSKey)
			}
		})
	}
}

func TestStaleRecovery(t *testing.T) {
	base := noFile
	withEnv := func(v string) map[string]string { return noFileWith("CONDUCTOR_STALE_RECOVERY", v) }
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string
		err  bool
	}{
		{"default", nil, base, "auto", false},
		{"env off", nil, withEnv("off"), "off", false},
		{"flag beats env", []string{"--stale-recovery", "auto"}, withEnv("off"), "auto", false},
		{"flag off", []string{"--stale-recovery=off"}, base, "off", false},
		{"bad flag", []string{"--stale-recovery", "never"}, base, "", true},
		{"bad env", nil, withEnv("Auto"), "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load(tc.args, env(tc.env))
			if (err != nil) != tc.err {
				t.Fatalf("err %v", err)
			}
			if err == nil && c.StaleRecovery != tc.want {
				t.Errorf("StaleRecovery %q, want %q", c.StaleRecovery, tc.want)
			}
		})
	}
}
