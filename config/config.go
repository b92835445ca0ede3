// Package config assembles the service configuration from the config file,
// the environment and command-line flags, in increasing precedence.
package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/rs/zerolog"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/mooncake-conductor-go/conductor/codec"
	"github.com/mooncake-conductor-go/conductor/registry"
)

// DefaultMemoMiB sizes the prefix memo: about a thousand remembered 8K-token
// chains (tokens and digests), enough for the system prompts and live
// conversations of a fleet's router.
const DefaultMemoMiB = 64

// DefaultTokenMemoMiB sizes the token memo: about a thousand remembered
// 8K-token arrays (packed bytes and decoded ids) as well.
const DefaultTokenMemoMiB = 64

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
	// TokenMemoBytes sizes the token memo, which spares warm queries
	// decoding their token ids (0 disables).
	TokenMemoBytes int
	// AuthToken, when set, is required as a bearer token on /register and
	// /unregister.
	AuthToken string
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

// file is the JSON config file. kvevent_instance entries keep their raw
// JSON so that they are validated by the very decoder /register uses.
type file struct {
	HTTPServerPort  *int                       `json:"http_server_port"`
	KVEventInstance map[string]json.RawMessage `json:"kvevent_instance"`
}

// Load reads configuration. args are the command-line arguments without the
// program name; getenv is os.Getenv in production.
func Load(args []string, getenv func(string) string) (*Config, error) {
	fl := flag.NewFlagSet("conductor", flag.ContinueOnError)
	path := fl.String("config", "", "config file (env CONDUCTOR_CONFIG_PATH, default ~/.mooncake/conductor_config.json)")
	port := fl.Int("port", 0, "HTTP port (env CONDUCTOR_HTTP_PORT, file http_server_port, default 13333)")
	addr := fl.String("addr", "", "HTTP listen address (env CONDUCTOR_HTTP_ADDR, default all interfaces)")
	level := fl.String("log-level", "", "DEBUG, INFO, WARN or ERROR (env CONDUCTOR_LOG_LEVEL, default INFO)")
	format := fl.String("log-format", "", "json or console (env CONDUCTOR_LOG_FORMAT, default json)")
	memo := fl.Int("hash-memo-mib", -1, "MiB for the prefix memo that lets warm queries reuse remembered digest chains instead of hashing (env CONDUCTOR_HASH_MEMO_MIB, default 64, 0 disables)")
	tokenMemo := fl.Int("token-memo-mib", -1, "MiB for the token memo that lets warm queries copy the remembered token ids of a body prefix instead of decoding them (env CONDUCTOR_TOKEN_MEMO_MIB, default 64, 0 disables)")
	tokenFile := fl.String("auth-token-file", "", "file holding the bearer token required on /register and /unregister (env CONDUCTOR_AUTH_TOKEN_FILE or CONDUCTOR_AUTH_TOKEN; default off)")
	if err := fl.Parse(args); err != nil {
		return nil, err
	}
	if fl.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fl.Args())
	}
	c := &Config{Port: DefaultPort, LogLevel: zerolog.InfoLevel, LogFormat: "json", MemoBytes: DefaultMemoMiB << 20, TokenMemoBytes: DefaultTokenMemoMiB << 20}

	p := first(*path, getenv("CONDUCTOR_CONFIG_PATH"))
	if p == "" {
		home, err := os.UserHomeDir()
		if err == nil {
			p = filepath.Join(home, ".mooncake", "conductor_config.json")
		}
	}
	if p != "" {
		if err := c.readFile(p); err != nil {
			return nil, err
		}
	}

	if v := first(*port, getenv("CONDUCTOR_HTTP_PORT")); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 65535 {
			return nil, fmt.Errorf("invalid HTTP port %q", v)
		}
		c.Port = n
	}
	c.Addr = first(*addr, getenv("CONDUCTOR_HTTP_ADDR"))
	if v := first(*level, getenv("CONDUCTOR_LOG_LEVEL")); v != "" {
		l, err := ParseLevel(v)
		if err != nil {
			return nil, err
		}
		c.LogLevel = l
	}
	if v := first(*format, getenv("CONDUCTOR_LOG_FORMAT")); v != "" {
		if v != "json" && v != "console" {
			return nil, fmt.Errorf("invalid log format %q: want json or console", v)
		}
		c.LogFormat = v
	}
	if err := memoSize(&c.MemoBytes, "hash", *memo, getenv("CONDUCTOR_HASH_MEMO_MIB")); err != nil {
		return nil, err
	}
	if err := memoSize(&c.TokenMemoBytes, "token", *tokenMemo, getenv("CONDUCTOR_TOKEN_MEMO_MIB")); err != nil {
		return nil, err
	}
	if f := first(*tokenFile, getenv("CONDUCTOR_AUTH_TOKEN_FILE")); f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("read auth token: %w", err)
		}
		c.AuthToken = strings.TrimSpace(string(b))
		if c.AuthToken == "" {
			return nil, fmt.Errorf("auth token file %s is empty", f)
		}
	} else {
		c.AuthToken = getenv("CONDUCTOR_AUTH_TOKEN")
	}
	return c, nil
}

// first returns the first non-empty of a flag value and an env value.
func first[T comparable](flagVal T, env string) string {
	var zero T
	if flagVal != zero {
		return fmt.Sprint(flagVal)
	}
	return env
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

// decodeStatic validates one static registration exactly as /register
// would: the JSON is re-encoded as MessagePack (integers stay integers) and
// fed to the same decoder.
func decodeStatic(raw json.RawMessage) (registry.Service, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return registry.Service{}, err
	}
	body, err := msgpack.Marshal(toMsgpack(v))
	if err != nil {
		return registry.Service{}, err
	}
	svc, e := codec.DecodeRegister(body, codec.DefaultLimits())
	if e != nil {
		return registry.Service{}, e
	}
	return svc, nil
}

func toMsgpack(v any) any {
	switch t := v.(type) {
	case json.Number:
		if i, err := t.Int64(); err == nil {
			return i
		}
		if u, err := strconv.ParseUint(t.String(), 10, 64); err == nil {
			return u
		}
		f, _ := t.Float64()
		return f
	case map[string]any:
		for k, e := range t {
			t[k] = toMsgpack(e)
		}
		return t
	case []any:
		for i, e := range t {
			t[i] = toMsgpack(e)
		}
		return t
	}
	return v
}

// memoSize sets *bytes from a MiB flag (if given, ≥ 0) or else the value
// of its environment variable (if set); a memo of 0 MiB is disabled.
func memoSize(bytes *int, name string, flag int, env string) error {
	v := env
	if flag >= 0 {
		v = strconv.Itoa(flag)
	}
	if v == "" {
		return nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > 1<<20 {
		return fmt.Errorf("invalid %s memo size %q MiB", name, v)
	}
	*bytes = n << 20
	return nil
}
