package eventtest

import (
	"encoding/json"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/vmihailenco/msgpack/v5"
)

// Registration is a manifest registration: how a source would be
// registered with the service.
type Registration struct {
	Endpoint       string `json:"endpoint"`
	ReplayEndpoint string `json:"replay_endpoint"`
	Type           string `json:"type"`
	Modelname      string `json:"modelname"`
	LoraName       string `json:"lora_name"`
	TenantID       string `json:"tenant_id"`
	InstanceID     string `json:"instance_id"`
	BlockSize      int    `json:"block_size"`
	DPRank         int    `json:"dp_rank"`
	HashProfile    struct {
		Strategy        string  `json:"strategy"`
		Algorithm       string  `json:"algorithm"`
		PythonHashSeed  *string `json:"python_hash_seed"`
		IndexProjection string  `json:"index_projection"`
	} `json:"hash_profile"`
}

// Effect is one index change a fixture expects.
type Effect struct {
	Op       string   `json:"op"`
	Tier     string   `json:"tier"`
	Tiers    []string `json:"tiers"`
	Owner    string   `json:"owner"`
	Prefixes []string `json:"prefixes"`
	// Group is the KV-cache group of an engine store or remove (0 when
	// absent, docs/hybrid.md).
	Group     int    `json:"group"`
	BackendID string `json:"backend_id"`
	TenantID  string `json:"tenant_id"`
}

// Expect is what a fixture expects of the envelope, the batch and each event.
type Expect struct {
	Envelope    string   `json:"envelope"`
	Batch       string   `json:"batch"`
	SourceState string   `json:"source_state"`
	SeqAdvances *bool    `json:"seq_advances"`
	Effects     []Effect `json:"effects"`
	Events      []string `json:"events"`
	Message     string   `json:"message"`
	Role        string   `json:"role"`
}

// Fixture is one payload (or whole multipart message) and its expectation.
type Fixture struct {
	ID             string   `json:"id"`
	SourceType     string   `json:"source_type"`
	Registration   string   `json:"registration"`
	AlsoRegistered []string `json:"also_registered"`
	Requires       []string `json:"requires"`
	TopicHex       string   `json:"topic_hex"`
	PayloadFile    string   `json:"payload_file"`
	FramesFile     string   `json:"frames_file"`
	Expect         Expect   `json:"expect"`
}

// Manifest is the fixture directory's manifest.json.
type Manifest struct {
	Registrations map[string]Registration `json:"registrations"`
	Fixtures      []Fixture               `json:"fixtures"`
	byID          map[string]*Fixture
}

var (
	dirOnce      sync.Once
	dirVal       string
	dirErr       error
	manifestOnce sync.Once
	manifestVal  *Manifest
	manifestErr  error
)

// FixtureDir returns the event fixture directory, testdata/events at the
// module root. The root is found by walking up from the working directory
// (a package directory under go test) to go.mod, so any package at any
// depth finds the same files.
func FixtureDir(t testing.TB) string {
	t.Helper()
	dirOnce.Do(func() {
		dir, err := os.Getwd()
		if err != nil {
			dirErr = err
			return
		}
		for {
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
				dirVal = filepath.Join(dir, "testdata", "events")
				return
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				dirErr = fmt.Errorf("no go.mod above the working directory")
				return
			}
			dir = parent
		}
	})
	if dirErr != nil {
		t.Fatalf("find fixture directory: %v", dirErr)
	}
	return dirVal
}

// LoadManifest reads the manifest once per test binary.
func LoadManifest(t testing.TB) *Manifest {
	t.Helper()
	dir := FixtureDir(t)
	manifestOnce.Do(func() {
		b, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
		if err != nil {
			manifestErr = err
			return
		}
		m := &Manifest{}
		if err := json.Unmarshal(b, m); err != nil {
			manifestErr = err
			return
		}
		m.byID = map[string]*Fixture{}
		for i := range m.Fixtures {
			m.byID[m.Fixtures[i].ID] = &m.Fixtures[i]
		}
		manifestVal = m
	})
	if manifestErr != nil {
		t.Fatalf("load manifest: %v", manifestErr)
	}
	return manifestVal
}

// Fixture returns the fixture called id or fails the test.
func (m *Manifest) Fixture(t testing.TB, id string) *Fixture {
	t.Helper()
	f, ok := m.byID[id]
	if !ok {
		t.Fatalf("no fixture %q", id)
	}
	return f
}

// Payload reads a fixture's payload frame.
func Payload(t testing.TB, f *Fixture) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(FixtureDir(t), f.PayloadFile))
	if err != nil {
		t.Fatalf("read payload of %s: %v", f.ID, err)
	}
	return b
}

// Frames reads a whole-message fixture's frames.
func Frames(t testing.TB, f *Fixture) [][]byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(FixtureDir(t), f.FramesFile))
	if err != nil {
		t.Fatalf("read frames of %s: %v", f.ID, err)
	}
	var frames [][]byte
	if err := msgpack.Unmarshal(b, &frames); err != nil {
		t.Fatalf("decode frames of %s: %v", f.ID, err)
	}
	return frames
}

// ParseU64 parses a decimal uint64 (the manifest writes them as strings
// because JSON numbers lose precision above 2^53).
func ParseU64(t testing.TB, s string) uint64 {
	t.Helper()
	v, ok := new(big.Int).SetString(s, 10)
	if !ok || !v.IsUint64() {
		t.Fatalf("bad uint64 %q", s)
	}
	return v.Uint64()
}

// ResolveProfile resolves a registration's hash profile or fails the test.
func ResolveProfile(t testing.TB, r Registration) hashing.Profile {
	t.Helper()
	p, err := hashing.Resolve(hashing.Spec{
		Strategy:        r.HashProfile.Strategy,
		Algorithm:       r.HashProfile.Algorithm,
		IndexProjection: r.HashProfile.IndexProjection,
		PythonHashSeed:  r.HashProfile.PythonHashSeed,
	})
	if err != nil {
		t.Fatalf("resolve profile: %v", err)
	}
	return p
}

// ContextOf is the index context a registration binds; an empty tenant is
// the default one.
func ContextOf(r Registration) index.ContextKey {
	tenant := r.TenantID
	if tenant == "" {
		tenant = "default"
	}
	return index.ContextKey{Tenant: tenant, Model: r.Modelname, Lora: r.LoraName, BlockSize: r.BlockSize}
}

// TierNames maps the manifest's tier names to index tiers.
var TierNames = map[string]index.Tier{"device": index.Device, "cpu_local": index.CPULocal, "cpu_share": index.CPUShare, "disk": index.Disk}

// ResultName checks a manifest event expectation ("applied", "ignored: …",
// "rejected: …", "no-op …") and returns the name of its result, as the
// events package's Result.String spells it.
func ResultName(t testing.TB, s string) string {
	t.Helper()
	for _, name := range []string{"applied", "ignored", "rejected", "no-op"} {
		if len(s) >= len(name) && s[:len(name)] == name {
			return name
		}
	}
	t.Fatalf("unknown event expectation %q", s)
	return ""
}

// Registration returns the registration called name or fails the test.
func (m *Manifest) Registration(t testing.TB, name string) Registration {
	t.Helper()
	r, ok := m.Registrations[name]
	if !ok {
		t.Fatalf("no registration %q", name)
	}
	return r
}

// Profiles resolves the named registrations' hash profiles by the context
// each binds: what a Mooncake source's lookup finds when those engines are
// registered too.
func (m *Manifest) Profiles(t testing.TB, names []string) map[index.ContextKey]*hashing.Profile {
	t.Helper()
	out := map[index.ContextKey]*hashing.Profile{}
	for _, name := range names {
		r := m.Registration(t, name)
		p := ResolveProfile(t, r)
		out[ContextOf(r)] = &p
	}
	return out
}
