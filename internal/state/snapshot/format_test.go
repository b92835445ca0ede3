package snapshot

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/mooncake-conductor-go/conductor/index"
)

var (
	ctxA = index.ContextKey{Tenant: "default", Model: "m", BlockSize: 16}
	ctxB = index.ContextKey{Tenant: "t", Model: "m2", Lora: "l", BlockSize: 32}
)

// sample builds a snapshot from a real index cut.
func sample(t testing.TB) *Snapshot {
	t.Helper()
	ix := index.New(index.Options{Stripes: 4})
	ta := ix.EnsureTable(ctxA)
	tb := ix.EnsureTable(ctxB)
	a0, a1 := ta.AddEngineOwner("a", 0), ta.AddEngineOwner("a", 1)
	b0 := tb.AddEngineOwner("b", 0)
	for k := uint64(0); k < 500; k++ {
		ta.Store(a0, index.Put{Key: k, Tier: index.Device})
		if k%2 == 0 {
			ta.Store(a1, index.Put{Key: k, Tier: index.CPULocal})
		}
		tb.Store(b0, index.Put{Key: k * 7, Tier: index.Disk})
	}
	// a1 serves a hybrid model: its layout and group words are kept
	ta.NoteGroup(a1, 0, index.GroupSpec{Kind: index.KindSliding, BlockSize: 16, SlidingWindow: 32})
	ta.NoteGroup(a1, 1, index.GroupSpec{Kind: index.KindFull, BlockSize: 16})
	for k := uint64(0); k < 500; k += 4 {
		ta.Store(a1, index.Put{Key: k, Tier: index.CPULocal, Group: 1})
	}
	scope := index.ScopeKey{Tenant: "acme", Model: "m", Scheme: "vllm", Adapter: "ad"}
	ts := ix.EnsureScope(scope)
	r0, r1 := ts.AddEngineOwner("r0", 0), ts.AddEngineOwner("r1", 0)
	for k := uint64(0); k < 300; k++ {
		ts.Store(r0, index.Put{Key: 1000 + k, Tier: index.Device, Replace: true})
		if k%3 == 0 {
			ts.Store(r1, index.Put{Key: 1000 + k, Tier: index.CPULocal, Replace: true})
		}
	}
	s := &Snapshot{
		Version: Version,
		Created: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC),
		Sources: []StreamPosition{
			{Key: "a|default|0", Type: "vLLM", Seq: 41, HasSeq: true, Digest: 0x9e3779b97f4a7c15, HasDigest: true},
			{Key: "a|default|1", Type: "vLLM", Seq: 7, HasSeq: true, Stale: true},
			{Key: "b|t|0", Type: "SGLang"},
			{Key: "master|default|0", Type: "Mooncake", Seq: 9, HasSeq: true, Bindings: []Binding{
				{Backend: "be", Tenant: "default", Identity: "obj-1", Tier: uint8(index.CPUShare), Model: "m", BlockSize: 16, Prefix: 3, FullHash: "00ff", Group: ""},
				{Backend: "be", Tenant: "t", Identity: "page", Tier: uint8(index.Disk), Model: "m2", Lora: "l", BlockSize: 32, Prefix: 14, FullHash: "abcd", Group: "g", Components: []string{"k", "v"}},
			}},
			// A standard-hash engine still catching up at the cut, with
			// its engine-hash map (in the order Read returns it).
			{Key: "std|default|0", Type: "SGLang", Seq: 12, HasSeq: true, CatchingUp: true, HasStdMap: true, StdMap: []StdEntry{
				{Group: 0, Tier: uint8(index.Device), Key: 5, H: 0xfeed, Reachable: true},
				{Group: 0, Tier: uint8(index.Device), Key: 1 << 63, Reachable: false},
				{Group: 0, Tier: uint8(index.Disk), Key: 5, H: 0xbeef, Reachable: true},
				{Group: 2, Tier: uint8(index.CPULocal), Key: 1, H: 7, Reachable: true},
			}},
			// One whose map is empty keeps it, empty.
			{Key: "std|default|1", Type: "vLLM", Seq: 1, HasSeq: true, HasStdMap: true},
		},
	}
	profiles := map[index.ContextKey]Profile{
		ctxA: {Strategy: "vllm_v1", Algorithm: "sha256_cbor", IndexProjection: "low64_be", PythonHashSeed: "0"},
		ctxB: {Strategy: "sglang", Algorithm: "sha256_raw", IndexProjection: "first64_be", PythonHashSeed: "0"},
	}
	for _, tc := range ix.BeginCut().Finish() {
		if tc.IsScope {
			sc := Scope{Scope: tc.Scope, Entries: tc.Entries, Blocks: tc.Blocks, Pairs: tc.Pairs}
			for _, o := range tc.Owners {
				sc.Owners = append(sc.Owners, o.Instance)
			}
			for i := range tc.Blocks {
				sc.Tokens = append(sc.Tokens, int32(16*i-1)) // the first has none
			}
			s.Scopes = append(s.Scopes, sc)
			continue
		}
		s.Contexts = append(s.Contexts, TableSection{Context: tc.Context, Profile: profiles[tc.Context], Owners: tc.Owners, Entries: tc.Entries, Blocks: tc.Blocks, Pairs: tc.Pairs, Layouts: tc.Layouts})
	}
	s.Replicas = []Replica{
		{Tenant: "acme", Model: "m", Replica: "r0", SilentNanos: int64(3 * time.Second), HasStats: true, StatsAgeNanos: int64(time.Minute),
			CacheMemoryBytes: 1 << 30, HitRate: 0.5, Pressure: 0.25, ClientVersion: "v1", T2HitTokens: 7, T2QueryTokens: 9},
		{Tenant: "acme", Model: "m", Replica: "r1", SilentNanos: int64(time.Hour)},
	}
	return s
}

func encode(t testing.TB, s *Snapshot) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := Write(&buf, s); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestRoundTrip(t *testing.T) {
	want := sample(t)
	got, err := Read(encode(t, want))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if l := got.Contexts[0].Layouts; len(l) != 2 || len(l[1].Groups) != 2 || l[1].Groups[0].SlidingWindow != 32 {
		t.Errorf("layouts %+v", l)
	}
	if want.Contexts[0].Pairs != 750 || want.Contexts[1].Pairs != 500 || want.Scopes[0].Pairs != 400 {
		t.Errorf("sample pairs %d, %d, %d", want.Contexts[0].Pairs, want.Contexts[1].Pairs, want.Scopes[0].Pairs)
	}
}

func TestEmptyRoundTrip(t *testing.T) {
	want := &Snapshot{Version: Version, Created: time.Unix(5, 0).UTC()}
	got, err := Read(encode(t, want))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func formatErr(t *testing.T, data []byte) string {
	t.Helper()
	_, err := Read(data)
	var fe *FormatError
	if !errors.As(err, &fe) {
		t.Fatalf("Read: %v, want a FormatError", err)
	}
	return fe.Reason
}

// Every truncation and every single-byte change is refused, never read
// as a smaller or different snapshot: each offset of the sample, not a
// sample of offsets.
func TestEveryTruncationAndFlipIsRefused(t *testing.T) {
	good := encode(t, sample(t))
	for n := range len(good) {
		formatErr(t, good[:n])
	}
	b := bytes.Clone(good)
	for i := range b {
		b[i] ^= 0x40
		formatErr(t, b)
		b[i] ^= 0x40
	}
	formatErr(t, append(bytes.Clone(good), 0))
}

func TestReasons(t *testing.T) {
	good := encode(t, sample(t))
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "truncated"},
		{"header only", good[:headerLen], "truncated: section 1"},
		{"cut in a section", good[:len(good)-10], "cut short"},
		{"bad magic", append([]byte("NOTASNAP"), good[8:]...), "bad magic"},
		{"future version", withVersion(good, Version+1), fmt.Sprintf("format version %d; this release reads versions %d to %d", Version+1, MinVersion, Version)},
		{"ancient version", withVersion(good, 0), "older than this release reads"},
		{"payload damaged", func() []byte { b := bytes.Clone(good); b[len(b)-3] ^= 1; return b }(), "checksum mismatch in section"},
		{"trailing bytes", append(bytes.Clone(good), 1, 2, 3), "3 bytes after the last section"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := formatErr(t, tc.data); !strings.Contains(got, tc.want) {
				t.Errorf("reason %q, want it to contain %q", got, tc.want)
			}
		})
	}
}

// A section whose checksum matches but whose entries are malformed (a
// writer bug, not disk damage) is refused too: nothing is half-loaded.
func TestMalformedEntriesRefused(t *testing.T) {
	s := sample(t)
	s.Contexts[0].Entries = s.Contexts[0].Entries[:len(s.Contexts[0].Entries)-1]
	if got := formatErr(t, encode(t, s)); !strings.Contains(got, "malformed index entries") {
		t.Errorf("reason %q", got)
	}
	s = sample(t)
	s.Contexts[1].Pairs++
	if got := formatErr(t, encode(t, s)); !strings.Contains(got, "metadata says") {
		t.Errorf("reason %q", got)
	}
	// Entries name owners by position: two positions for one owner would
	// restore as one, and lose the other's entries.
	for name, change := range map[string]func(*Snapshot){
		"owner twice": func(s *Snapshot) { s.Contexts[0].Owners[1] = s.Contexts[0].Owners[0] },
		"empty owner": func(s *Snapshot) { s.Contexts[0].Owners[0].Instance = "" },
	} {
		s = sample(t)
		change(s)
		if got := formatErr(t, encode(t, s)); !strings.Contains(got, "empty or listed twice") {
			t.Errorf("%s: reason %q", name, got)
		}
	}
}

// withVersion rewrites data's format version and reseals its header.
func withVersion(data []byte, v uint32) []byte {
	b := bytes.Clone(data)
	binary.LittleEndian.PutUint32(b[8:], v)
	binary.LittleEndian.PutUint64(b[headerLen-8:], xxhash.Sum64(b[:headerLen-8]))
	return b
}

// A version 1 file (no producer-fed sections) is still read; one that
// claims version 1 but holds version 2 sections is refused.
func TestVersion1StillRead(t *testing.T) {
	want := olderSample(t, 1)
	want.Scopes, want.Replicas = nil, nil
	got, err := Read(withVersion(encode(t, want), 1))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if got := formatErr(t, withVersion(encode(t, olderSample(t, 1)), 1)); !strings.Contains(got, "section kind 3 in a version 1 file") {
		t.Errorf("reason %q", got)
	}
}

// olderSample is the sample without what version 3 added (no source
// catching up, no engine-hash map), as a release writing version v would
// have it.
func olderSample(t *testing.T, v uint32) *Snapshot {
	s := sample(t)
	s.Version = v
	s.Sources = s.Sources[:4]
	return s
}

// A version 2 file (no engine-hash maps, no catching_up) is still read,
// its sources as they were; one that claims version 2 but holds a key of
// version 3 is refused, whichever key.
func TestVersion2StillRead(t *testing.T) {
	want := olderSample(t, 2)
	got, err := Read(withVersion(encode(t, want), 2))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	for name, change := range map[string]func(*StreamPosition){
		"std_map":     func(s *StreamPosition) { s.HasStdMap = true },
		"catching_up": func(s *StreamPosition) { s.CatchingUp = true },
	} {
		s := olderSample(t, 2)
		change(&s.Sources[0])
		if got := formatErr(t, withVersion(encode(t, s), 2)); !strings.Contains(got, "keys of version 3 in a version 2 file") {
			t.Errorf("%s: reason %q", name, got)
		}
	}
}

// An engine-hash map whose section checksum matches but whose records are
// wrong refuses the whole file.
func TestMalformedStdMapRefused(t *testing.T) {
	good := sample(t).Sources[4].StdMap
	for _, tc := range []struct {
		name string
		es   []StdEntry
		want string
	}{
		{"repeated", append(slices.Clone(good), good[len(good)-1]), "out of order or repeated"},
		{"tier", []StdEntry{{Tier: uint8(index.CPUShare), Key: 1, H: 1, Reachable: true}}, "tier 2"},
		{"unreachable with a hash", []StdEntry{{Key: 1, H: 9}}, "unreachable block"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := sample(t)
			s.Sources[4].StdMap = tc.es
			if got := formatErr(t, encode(t, s)); !strings.Contains(got, tc.want) {
				t.Errorf("reason %q, want %q", got, tc.want)
			}
		})
	}
	// Records cut short, and flags no writer sets: forged past the writer.
	for name, bin := range map[string][]byte{
		"cut":   make([]byte, stdRecordLen+1),
		"flags": append(make([]byte, 5), append([]byte{2}, make([]byte, 16)...)...),
	} {
		if _, err := decodeStdMap(bin); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
}

// A scope section whose checksum matches but whose content is wrong is
// refused, and with it the whole file.
func TestMalformedScopeRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*Snapshot)
		want   string
	}{
		{"entries cut", func(s *Snapshot) { s.Scopes[0].Entries = s.Scopes[0].Entries[:len(s.Scopes[0].Entries)-1] }, "malformed index entries"},
		{"pairs", func(s *Snapshot) { s.Scopes[0].Pairs++ }, "metadata says"},
		{"owner twice", func(s *Snapshot) { s.Scopes[0].Owners[1] = s.Scopes[0].Owners[0] }, "listed twice"},
		{"no scheme", func(s *Snapshot) { s.Scopes[0].Scope.Scheme = "" }, "without tenant, model or scheme"},
		{"negative age", func(s *Snapshot) { s.Replicas[0].SilentNanos = -1 }, "negative age"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := sample(t)
			tc.change(s)
			if got := formatErr(t, encode(t, s)); !strings.Contains(got, tc.want) {
				t.Errorf("reason %q, want %q", got, tc.want)
			}
		})
	}
	// Token counts that do not match the blocks are refused on write
	// too; forge them past the writer by editing the encoded section.
	s := sample(t)
	s.Scopes[0].Tokens = s.Scopes[0].Tokens[:len(s.Scopes[0].Tokens)-1]
	var buf bytes.Buffer
	if err := Write(&buf, s); err == nil {
		t.Error("Write took fewer token counts than blocks")
	}
}
