// Package config assembles the service configuration from the config file,
// the environment and command-line flags, in increasing precedence.
package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/membudget"
	"github.com/mooncake-conductor-go/conductor/registry"
)

// DefaultMemoMiB sizes the prefix memo: about a thousand remembered 8K-token
// chains (tokens and digests), enough for the system prompts and live
// conversations of a fleet's router.
const DefaultMemoMiB = 64

// DefaultTokenMemoMiB sizes the token memo both doors share: about a
// thousand remembered 8K-token arrays (packed bytes and decoded ids) with
// one door, fewer with both (an entry then holds both doors' packings).
const DefaultTokenMemoMiB = 64

// DefaultLinkMemoMiB sizes the verified links (hashing.Links) that let
// queries skip SHA-256 for blocks ingest verified: two generations, each
// large enough for a 4-instance index of 1,000 8K-token prompts
// (hashing.LinkBytes per block; docs/index-memory.md).
const DefaultLinkMemoMiB = 128

// DefaultHashCheckEvery samples the ingest hash check at about one block in
// 64 after a service's first blocks: a profile mismatch shows within the
// first event or two, and the steady cost stays a few nanoseconds per
// ingested block (see hashcheck).
const DefaultHashCheckEvery = 64

// DefaultPort is the contract's default http_server_port. A config file
// without the key keeps it (upstream would bind port 0).
const DefaultPort = 13333

// Config is everything main needs to wire the service.
type Config struct {
	// Path is the config file that was read ("" if none existed).
	Path      string
	Addr      string // listen address, "" = all interfaces
	Port      int
	LogLevel  zerolog.Level
	LogFormat string // "json" or "console"
	// MemoBytes sizes the prefix memo for warm queries (0 disables).
	MemoBytes int
	// TokenMemoBytes sizes the one token memo both doors share, which
	// spares warm queries decoding their token ids (0 disables).
	TokenMemoBytes int
	// LinkMemoBytes sizes the verified links that let queries skip
	// SHA-256 for blocks ingest verified (0 disables).
	LinkMemoBytes int
	// IndexMemoryBytes bounds the index's accounted memory (0: unbounded).
	IndexMemoryBytes int64
	// Memory is the process's memory budget and its split
	// (--memory-mib); the sizes above are its parts.
	Memory membudget.Budget
	// AuthToken, when set, is required as a bearer token on /register and
	// /unregister.
	AuthToken string
	// GRPCAddr, when set, turns on the InferenceCache gRPC door there.
	GRPCAddr string
	// GRPCTLSCert and GRPCTLSKey are the door's PEM certificate and key
	// files: both or neither (plaintext).
	GRPCTLSCert, GRPCTLSKey string
	// ShowVersion is --version: print the build and exit.
	ShowVersion bool
	// DebugRoutes enables the operator routes (POST /debug/explain).
	DebugRoutes bool
	// PprofAddr, when not "", serves the Go runtime's profiles there, on a
	// listener of their own (off by default).
	PprofAddr string
	// HashCheckEvery is the sampling of the ingest hash check: after a
	// service's first blocks, about one block in this many is re-hashed
	// under its profile (0 turns the check off).
	HashCheckEvery int
	// StateDir is the state directory ("" keeps state in memory only);
	// StateReset moves its old contents aside first.
	StateDir   string
	StateReset bool
	// SnapshotInterval spaces index snapshots (0: only at shutdown);
	// CatchUpTimeout bounds how long /readyz waits for restored sources.
	SnapshotInterval time.Duration
	CatchUpTimeout   time.Duration
	// StaleRecovery is --stale-recovery: "auto" (a stale source takes the
	// first message after a short hold-off as a new baseline) or "off"
	// (the contract's rule: ignored until registered again).
	StaleRecovery string
	// Etcd, when it has endpoints, shares registrations across replicas.
	Etcd Etcd
	// BootstrapFrom are peer replicas to load the index from at start.
	BootstrapFrom []string
	// Static are the file's kvevent_instance registrations, by name order.
	Static []Static
	// Warnings are non-fatal findings to log once logging is set up.
	Warnings []string
}

// Static is one registration from the config file.
type Static struct {
	Name    string
	Service registry.Service
}

// StaticServices returns the file's registrations as services, in Static's
// order.
func (c *Config) StaticServices() []registry.Service {
	out := make([]registry.Service, len(c.Static))
	for i, st := range c.Static {
		out[i] = st.Service
	}
	return out
}

// file is the JSON config file. kvevent_instance entries keep their raw
// JSON so that each is decoded strictly on its own (decodeStatic).
type file struct {
	HTTPServerPort  *int                       `json:"http_server_port"`
	KVEventInstance map[string]json.RawMessage `json:"kvevent_instance"`
}

// flags are the command line's values; set holds the names given
// explicitly, which is how a flag left at its (displayed) default yields to
// the environment and the config file.
type flags struct {
	fs        *flag.FlagSet
	path      *string
	port      *int
	addr      *string
	level     *string
	format    *string
	memo      *int
	tokenMemo *int
	links     *int
	indexMem  *string
	memory    *string
	tokenFile *string
	grpcAddr  *string
	grpcCert  *string
	grpcKey   *string
	version   *bool
	// debugRoutes is --debug-routes.
	debugRoutes *bool
	pprofAddr   *string
	hashCheck   *int
	stateDir    *string
	reset       *bool
	snapEvery   *time.Duration
	catchUp     *time.Duration
	staleRecov  *string
	etcd        etcdFlags
	set         map[string]bool
}

// newFlags declares the command line with the defaults the service really
// uses, so that --help shows them.
func newFlags() *flags {
	fl := flag.NewFlagSet("conductor", flag.ContinueOnError)
	// Load reports errors itself and main prints Usage on --help.
	fl.SetOutput(io.Discard)
	f := &flags{fs: fl, set: map[string]bool{}}
	f.path = fl.String("config", defaultConfigPath(), "config file (env CONDUCTOR_CONFIG_PATH); a missing file means defaults and one warning")
	f.port = fl.Int("port", DefaultPort, "HTTP port (env CONDUCTOR_HTTP_PORT, file http_server_port)")
	f.addr = fl.String("addr", "", "HTTP listen address (env CONDUCTOR_HTTP_ADDR; default all interfaces)")
	f.level = fl.String("log-level", "INFO", "DEBUG, INFO, WARN or ERROR (env CONDUCTOR_LOG_LEVEL)")
	f.format = fl.String("log-format", "json", "json, or console for people, coloured on a terminal (env CONDUCTOR_LOG_FORMAT)")
	f.memory = fl.String("memory-mib", "auto", "MiB the whole process keeps to: the Go runtime's soft limit, split among the index and every cache (docs/index-memory.md); auto is the smallest of cgroup v2 memory.max, cgroup v1 memory.limit_in_bytes and GOMEMLIMIT less a quarter (at least 40 MiB) of headroom, unbounded when none is known; 0 is unbounded (env CONDUCTOR_MEMORY_MIB)")
	f.memo = fl.Int("hash-memo-mib", DefaultMemoMiB, "override: MiB for the prefix memo that lets warm queries reuse remembered digest chains instead of hashing (default: its part of --memory-mib, at most 64); 0 disables (env CONDUCTOR_HASH_MEMO_MIB)")
	f.tokenMemo = fl.Int("token-memo-mib", DefaultTokenMemoMiB, "override: MiB for the token memo both doors share, which lets warm queries copy the remembered token ids of a body prefix instead of decoding them (default: its part of --memory-mib, at most 64); 0 disables (env CONDUCTOR_TOKEN_MEMO_MIB)")
	f.links = fl.Int("link-memo-mib", DefaultLinkMemoMiB, "override: MiB for the verified links that let queries skip SHA-256 for vLLM blocks ingest re-hashed and found as published, their verification backlog included (default: its part of --memory-mib, at most 128); 0 disables (env CONDUCTOR_LINK_MEMO_MIB)")
	f.indexMem = fl.String("index-memory-mib", "auto", "override: MiB for the index's accounted memory; at it the least recently stored blocks are evicted; auto is its part of --memory-mib (a quarter of it), unbounded when that is; 0 is unbounded (env CONDUCTOR_INDEX_MEMORY_MIB)")
	f.tokenFile = fl.String("auth-token-file", "", "file holding the bearer token required on /register and /unregister (env CONDUCTOR_AUTH_TOKEN_FILE, or the token in CONDUCTOR_AUTH_TOKEN; default off)")
	f.grpcAddr = fl.String("grpc-addr", "", "listen address of the InferenceCache gRPC door, e.g. :9090 (env CONDUCTOR_GRPC_ADDR; default off)")
	f.grpcCert = fl.String("grpc-tls-cert", "", "PEM certificate file for the gRPC door; needs --grpc-tls-key (env CONDUCTOR_GRPC_TLS_CERT; default plaintext)")
	f.grpcKey = fl.String("grpc-tls-key", "", "PEM key file for the gRPC door; needs --grpc-tls-cert (env CONDUCTOR_GRPC_TLS_KEY)")
	f.version = fl.Bool("version", false, "print version, commit, Go and libzmq versions and exit")
	f.hashCheck = fl.Int("hash-check-every", DefaultHashCheckEvery, "after each engine service's first 64 blocks, re-hash about one event block in this many under its hash profile to catch profile mismatches; 0 turns the check off (env CONDUCTOR_HASH_CHECK_EVERY)")
	f.debugRoutes = fl.Bool("debug-routes", false, "serve the operator routes, POST /debug/explain (env CONDUCTOR_DEBUG_ROUTES=1)")
	f.pprofAddr = fl.String("pprof-addr", "", `serve Go profiles (net/http/pprof, /debug/pprof/) on this address, e.g. 127.0.0.1:6060, apart from the API (env CONDUCTOR_PPROF_ADDR); default off`)
	f.stateDir = fl.String("state-dir", defaultStateDir(), `directory for registrations and index snapshots (env CONDUCTOR_STATE_DIR); "" keeps them in memory only`)
	f.reset = fl.Bool("state-reset", false, "move the state directory's old contents aside (nothing is deleted) and start empty")
	f.snapEvery = fl.Duration("snapshot-interval", DefaultSnapshotInterval, "time between index snapshots; 0 writes one only at shutdown (env CONDUCTOR_SNAPSHOT_INTERVAL)")
	f.catchUp = fl.Duration("catch-up-timeout", DefaultCatchUpTimeout, "how long /readyz waits for sources restored from a snapshot to catch up; the restored entries of those that have not are dropped then (env CONDUCTOR_CATCH_UP_TIMEOUT)")
	f.staleRecov = fl.String("stale-recovery", DefaultStaleRecovery, "auto: a stale source (messages lost beyond replay) drops its entries, then takes the first message after a 2 s hold-off as a new baseline; off: it is ignored until registered again, the contract's rule (env CONDUCTOR_STALE_RECOVERY)")
	f.etcd.declare(fl)
	return f
}

// Defaults of the durable-state settings.
const (
	DefaultSnapshotInterval = 10 * time.Second
	DefaultCatchUpTimeout   = 30 * time.Second
	DefaultStaleRecovery    = "auto"
)

// defaultStateDir is ~/.mooncake/conductor-state, or "" (memory only)
// when the home directory is unknown.
func defaultStateDir() string {
	home, err := os.UserHomeDir()
	if err != nil {
		return ""
	}
	return filepath.Join(home, ".mooncake", "conductor-state")
}

// durationSetting parses a duration flag's value or its environment
// variable's; zero is accepted only where allowZero says so.
func (f *flags) durationSetting(d *time.Duration, name string, flagVal time.Duration, env string, allowZero bool) error {
	v := f.pick(name, flagVal.String(), env)
	n, err := time.ParseDuration(v)
	if err != nil || n < 0 || (n == 0 && !allowZero) {
		return fmt.Errorf("invalid --%s %q", name, v)
	}
	*d = n
	return nil
}

// defaultConfigPath is ~/.mooncake/conductor_config.json, or "" when the
// home directory is unknown.
func defaultConfigPath() string {
	home, err := os.UserHomeDir()
	if err != nil {
		return ""
	}
	return filepath.Join(home, ".mooncake", "conductor_config.json")
}

// Usage is the service's part of the --help text: where settings come
// from, then every flag with its default. The synopsis and the list of
// verbs before it are the command line's (package main, verbs.go).
func Usage() string {
	var b strings.Builder
	b.WriteString("Precedence: flags, then environment, then the config file.\n\nFlags of serve:\n")
	f := newFlags()
	f.fs.SetOutput(&b)
	f.fs.PrintDefaults()
	return b.String()
}

// Defaults is the configuration with nothing set: every size, level and
// interval at its default, memory-only state, no registrations. Load starts
// from it; tests that build a service in process start from it too, so a
// new default reaches them without being repeated.
func Defaults() *Config {
	return &Config{Port: DefaultPort, LogLevel: zerolog.InfoLevel, LogFormat: "json", MemoBytes: DefaultMemoMiB << 20,
		TokenMemoBytes: DefaultTokenMemoMiB << 20, LinkMemoBytes: DefaultLinkMemoMiB << 20, HashCheckEvery: DefaultHashCheckEvery,
		SnapshotInterval: DefaultSnapshotInterval, CatchUpTimeout: DefaultCatchUpTimeout, StaleRecovery: DefaultStaleRecovery,
		Memory: membudget.Split(0, 0, "", nil)}
}

// Load reads configuration. args are the command-line arguments without the
// program name; getenv is os.Getenv in production. --help returns
// flag.ErrHelp; --version returns a Config with only ShowVersion set,
// reading no file.
func Load(args []string, getenv func(string) string) (*Config, error) {
	return load(args, getenv, processMemoryLimit)
}

// load is Load with the process's memory limit read through limit (tests
// pass their own).
func load(args []string, getenv func(string) string, limit func() MemoryLimit) (*Config, error) {
	f := newFlags()
	if err := f.fs.Parse(args); err != nil {
		return nil, err
	}
	if f.fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", f.fs.Args())
	}
	f.fs.Visit(func(fl *flag.Flag) { f.set[fl.Name] = true })
	if *f.version {
		return &Config{ShowVersion: true}, nil
	}
	c := Defaults()
	c.StateReset = *f.reset
	// An explicit --state-dir "" (memory only) wins over the environment.
	c.StateDir = f.pick("state-dir", *f.stateDir, getenv("CONDUCTOR_STATE_DIR"))
	if err := f.durationSetting(&c.SnapshotInterval, "snapshot-interval", *f.snapEvery, getenv("CONDUCTOR_SNAPSHOT_INTERVAL"), true); err != nil {
		return nil, err
	}
	if err := f.durationSetting(&c.CatchUpTimeout, "catch-up-timeout", *f.catchUp, getenv("CONDUCTOR_CATCH_UP_TIMEOUT"), false); err != nil {
		return nil, err
	}

	switch c.StaleRecovery = f.pick("stale-recovery", *f.staleRecov, getenv("CONDUCTOR_STALE_RECOVERY")); c.StaleRecovery {
	case "auto", "off":
	default:
		return nil, fmt.Errorf("invalid --stale-recovery %q: want auto or off", c.StaleRecovery)
	}

	if err := f.loadEtcd(c, getenv); err != nil {
		return nil, err
	}

	p := f.pick("config", *f.path, getenv("CONDUCTOR_CONFIG_PATH"))
	if p != "" {
		if err := c.readFile(p); err != nil {
			return nil, err
		}
	}

	// The port alone has a file value between the environment and the
	// default, so its flag default must not hide the file's.
	if f.set["port"] || getenv("CONDUCTOR_HTTP_PORT") != "" {
		v := f.pick("port", strconv.Itoa(*f.port), getenv("CONDUCTOR_HTTP_PORT"))
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 65535 {
			return nil, fmt.Errorf("invalid HTTP port %q", v)
		}
		c.Port = n
	}
	c.Addr = f.pick("addr", *f.addr, getenv("CONDUCTOR_HTTP_ADDR"))
	if v := f.pick("log-level", *f.level, getenv("CONDUCTOR_LOG_LEVEL")); v != "" {
		l, err := ParseLevel(v)
		if err != nil {
			return nil, err
		}
		c.LogLevel = l
	}
	if v := f.pick("log-format", *f.format, getenv("CONDUCTOR_LOG_FORMAT")); v != "" {
		if v != "json" && v != "console" {
			return nil, fmt.Errorf("invalid log format %q: want json or console", v)
		}
		c.LogFormat = v
	}
	if err := c.memoryParts(f, getenv, limit); err != nil {
		return nil, err
	}
	if tf := f.pick("auth-token-file", *f.tokenFile, getenv("CONDUCTOR_AUTH_TOKEN_FILE")); tf != "" {
		b, err := os.ReadFile(tf)
		if err != nil {
			return nil, fmt.Errorf("read auth token: %w", err)
		}
		c.AuthToken = strings.TrimSpace(string(b))
		if c.AuthToken == "" {
			return nil, fmt.Errorf("auth token file %s is empty", tf)
		}
	} else {
		c.AuthToken = getenv("CONDUCTOR_AUTH_TOKEN")
	}
	if v := f.pick("hash-check-every", strconv.Itoa(*f.hashCheck), getenv("CONDUCTOR_HASH_CHECK_EVERY")); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("invalid hash check sampling %q: want 0 (off) or a positive count of blocks", v)
		}
		c.HashCheckEvery = n
	}
	var err error
	if c.DebugRoutes, err = f.pickBool("debug-routes", *f.debugRoutes, "CONDUCTOR_DEBUG_ROUTES", getenv); err != nil {
		return nil, err
	}
	c.GRPCAddr = f.pick("grpc-addr", *f.grpcAddr, getenv("CONDUCTOR_GRPC_ADDR"))
	c.GRPCTLSCert = f.pick("grpc-tls-cert", *f.grpcCert, getenv("CONDUCTOR_GRPC_TLS_CERT"))
	c.GRPCTLSKey = f.pick("grpc-tls-key", *f.grpcKey, getenv("CONDUCTOR_GRPC_TLS_KEY"))
	if (c.GRPCTLSCert == "") != (c.GRPCTLSKey == "") {
		return nil, errors.New("gRPC TLS needs both --grpc-tls-cert and --grpc-tls-key, or neither")
	}
	if c.GRPCTLSCert != "" && c.GRPCAddr == "" {
		return nil, errors.New("gRPC TLS files are set but the gRPC door is off (--grpc-addr)")
	}
	c.PprofAddr = f.pick("pprof-addr", *f.pprofAddr, getenv("CONDUCTOR_PPROF_ADDR"))
	return c, nil
}

// pick returns a flag's value when it was given, else the environment's
// when set, else the flag's default.
func (f *flags) pick(name, flagVal, env string) string {
	if f.set[name] || env == "" {
		return flagVal
	}
	return env
}

// pickBool is pick for a boolean setting: the flag when given, otherwise
// the environment variable env when set (1, true, 0, false, as
// strconv.ParseBool reads them), otherwise the flag's default.
func (f *flags) pickBool(name string, flagVal bool, env string, getenv func(string) string) (bool, error) {
	v := getenv(env)
	if f.set[name] || v == "" {
		return flagVal, nil
	}
	on, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("invalid %s %q: want 1, true, 0 or false", env, v)
	}
	return on, nil
}

// ParseLevel maps the documented level names (case-insensitive) to zerolog.
func ParseLevel(s string) (zerolog.Level, error) {
	switch strings.ToUpper(s) {
	case "DEBUG":
		return zerolog.DebugLevel, nil
	case "INFO":
		return zerolog.InfoLevel, nil
	case "WARN", "WARNING":
		return zerolog.WarnLevel, nil
	case "ERROR":
		return zerolog.ErrorLevel, nil
	}
	return zerolog.NoLevel, fmt.Errorf("invalid log level %q: want DEBUG, INFO, WARN or ERROR", s)
}

func (c *Config) readFile(path string) error {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		c.Warnings = append(c.Warnings, fmt.Sprintf("config file %s not found; using defaults", path))
		return nil
	}
	if err != nil {
		return fmt.Errorf("read config %s: %w", path, err)
	}
	c.Path = path
	var f file
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&f); err != nil {
		return fmt.Errorf("parse config %s: %w", path, err)
	}
	if f.HTTPServerPort != nil {
		if *f.HTTPServerPort < 0 || *f.HTTPServerPort > 65535 {
			return fmt.Errorf("config %s: http_server_port %d is not a port", path, *f.HTTPServerPort)
		}
		c.Port = *f.HTTPServerPort
	}
	names := make([]string, 0, len(f.KVEventInstance))
	for n := range f.KVEventInstance {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		svc, err := decodeStatic(f.KVEventInstance[n])
		if err != nil {
			return fmt.Errorf("config %s: kvevent_instance %q: %w", path, n, err)
		}
		c.Static = append(c.Static, Static{Name: n, Service: svc})
	}
	return nil
}

// staticEntry is one kvevent_instance entry as the file spells it. Pointer
// fields tell an omitted member from a zero one, so the members /register
// requires are required here too.
type staticEntry struct {
	Endpoint       *string     `json:"endpoint"`
	ReplayEndpoint string      `json:"replay_endpoint"`
	Type           *string     `json:"type"`
	ModelName      *string     `json:"modelname"`
	LoraName       string      `json:"lora_name"`
	TenantID       string      `json:"tenant_id"`
	InstanceID     *string     `json:"instance_id"`
	BlockSize      *int        `json:"block_size"`
	DPRank         *int        `json:"dp_rank"`
	CacheGroup     *int        `json:"cache_group"`
	HashProfile    *staticSpec `json:"hash_profile"`
	// KVCacheGroups is /register's kv_cache_groups (docs/hybrid.md).
	KVCacheGroups []staticGroup `json:"kv_cache_groups"`
}

type staticGroup struct {
	Kind          *string `json:"kind"`
	BlockSize     *int    `json:"block_size"`
	SlidingWindow *int    `json:"sliding_window"`
	ChunkSize     *int    `json:"chunk_size"`
}

type staticSpec struct {
	Strategy        *string `json:"strategy"`
	Algorithm       *string `json:"algorithm"`
	IndexProjection *string `json:"index_projection"`
	PythonHashSeed  *string `json:"python_hash_seed"`
	Seed            *string `json:"seed"`
}

// decodeStatic decodes one static registration strictly (unknown members
// and wrong types are errors, required members must be present) and checks
// it with the rules /register applies, registry.NewService.
func decodeStatic(raw json.RawMessage) (registry.Service, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var e staticEntry
	if err := dec.Decode(&e); err != nil {
		return registry.Service{}, err
	}
	if dec.More() {
		return registry.Service{}, errors.New("trailing data after the registration")
	}
	for _, req := range []struct {
		set  bool
		name string
	}{
		{e.Endpoint != nil, "endpoint"}, {e.Type != nil, "type"}, {e.ModelName != nil, "modelname"},
		{e.InstanceID != nil, "instance_id"}, {e.BlockSize != nil, "block_size"}, {e.DPRank != nil, "dp_rank"},
		{e.HashProfile != nil, "hash_profile"},
	} {
		if !req.set {
			return registry.Service{}, fmt.Errorf("%s is required", req.name)
		}
	}
	hp := e.HashProfile
	for _, req := range []struct {
		set  bool
		name string
	}{{hp.Strategy != nil, "strategy"}, {hp.Algorithm != nil, "algorithm"},
		// the standard hash (rfc1527) has no projection
		{hp.IndexProjection != nil || (hp.Strategy != nil && *hp.Strategy == hashing.StrategyRFC1527), "index_projection"}} {
		if !req.set {
			return registry.Service{}, fmt.Errorf("hash_profile.%s is required", req.name)
		}
	}
	var groups []registry.GroupDecl
	if e.KVCacheGroups != nil {
		groups = []registry.GroupDecl{}
		for i, g := range e.KVCacheGroups {
			if g.Kind == nil || g.BlockSize == nil {
				return registry.Service{}, fmt.Errorf("kv_cache_groups[%d]: kind and block_size are required", i)
			}
			d := registry.GroupDecl{Kind: *g.Kind, BlockSize: *g.BlockSize}
			if g.SlidingWindow != nil {
				if *g.SlidingWindow <= 0 {
					return registry.Service{}, fmt.Errorf("kv_cache_groups[%d]: sliding_window must be positive", i)
				}
				d.SlidingWindow = *g.SlidingWindow
			}
			if g.ChunkSize != nil {
				if *g.ChunkSize <= 0 {
					return registry.Service{}, fmt.Errorf("kv_cache_groups[%d]: chunk_size must be positive", i)
				}
				d.ChunkSize = *g.ChunkSize
			}
			groups = append(groups, d)
		}
	}
	return registry.NewService(registry.Registration{
		KVCacheGroups: groups,
		Endpoint:      *e.Endpoint, ReplayEndpoint: e.ReplayEndpoint, Type: *e.Type, ModelName: *e.ModelName,
		LoraName: e.LoraName, TenantID: e.TenantID, InstanceID: *e.InstanceID,
		BlockSize: *e.BlockSize, DPRank: *e.DPRank, CacheGroup: e.CacheGroup,
		HashProfile: hashing.Spec{Strategy: *hp.Strategy, Algorithm: *hp.Algorithm, IndexProjection: deref(hp.IndexProjection), PythonHashSeed: hp.PythonHashSeed, Seed: hp.Seed},
	})
}

// memoryParts resolves --memory-mib and splits it; a part's own flag or
// environment variable, when given, overrides its share.
func (c *Config) memoryParts(f *flags, getenv func(string) string, processLimit func() MemoryLimit) error {
	total, limit, err := memoryBudget(f.pick("memory-mib", *f.memory, getenv("CONDUCTOR_MEMORY_MIB")), processLimit)
	if err != nil {
		return err
	}
	overrides := map[membudget.Part]int64{}
	for _, m := range []struct {
		part      membudget.Part
		flag, env string
		val       int
	}{
		{membudget.HashMemo, "hash-memo-mib", "CONDUCTOR_HASH_MEMO_MIB", *f.memo},
		{membudget.TokenMemo, "token-memo-mib", "CONDUCTOR_TOKEN_MEMO_MIB", *f.tokenMemo},
		{membudget.Links, "link-memo-mib", "CONDUCTOR_LINK_MEMO_MIB", *f.links},
	} {
		if !f.set[m.flag] && getenv(m.env) == "" {
			continue
		}
		var n int
		if err := memoSize(&n, strings.ReplaceAll(string(m.part), "_", " "), f.pick(m.flag, strconv.Itoa(m.val), getenv(m.env))); err != nil {
			return err
		}
		overrides[m.part] = int64(n)
	}
	ib, ok, err := indexMemory(f.pick("index-memory-mib", *f.indexMem, getenv("CONDUCTOR_INDEX_MEMORY_MIB")))
	if err != nil {
		return err
	}
	if ok {
		overrides[membudget.Index] = ib
	}
	c.Memory = membudget.Split(total, limit.Bytes, limit.Source, overrides)
	sz := c.Memory.Size
	c.IndexMemoryBytes = sz[membudget.Index]
	c.MemoBytes, c.TokenMemoBytes = int(sz[membudget.HashMemo]), int(sz[membudget.TokenMemo])
	c.LinkMemoBytes = int(sz[membudget.Links])
	return nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// memoSize sets *bytes from a size in MiB; a memo of 0 MiB is disabled.
func memoSize(bytes *int, name string, v string) error {
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > 1<<20 {
		return fmt.Errorf("invalid %s size %q MiB", name, v)
	}
	*bytes = n << 20
	return nil
}
