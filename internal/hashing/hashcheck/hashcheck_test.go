package hashcheck

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/rs/zerolog"

	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/hashvectors"
)

// vectorCase is a golden hash vector (testdata/hashing), expanded.
type vectorCase struct {
	ID      string
	Profile hashing.Profile
	BS      int
	Lora    string
	Salt    string
	Tokens  []int32
	Blocks  []vectorBlock
}

type vectorBlock struct {
	start, end int // positions
	digest     []byte
	key        uint64
}

func loadVectors(t testing.TB) []vectorCase {
	t.Helper()
	var out []vectorCase
	for _, c := range hashvectors.LoadPublic(t).Cases {
		pr := c.Profile
		p, err := hashing.Resolve(hashing.Spec{Strategy: pr.Strategy, Algorithm: pr.Algorithm, IndexProjection: pr.IndexProjection, PythonHashSeed: pr.PythonHashSeed})
		if err != nil {
			t.Fatalf("%s: %v", c.ID, err)
		}
		vc := vectorCase{ID: c.ID, Profile: p, BS: c.BlockSize}
		vc.Tokens, vc.Lora, vc.Salt = c.Expand()
		for _, e := range c.Expected {
			d, err := hex.DecodeString(e.Digest)
			if err != nil {
				t.Fatal(err)
			}
			key, err := strconv.ParseUint(e.Projected, 10, 64)
			if err != nil {
				t.Fatalf("%s: projected %q: %v", c.ID, e.Projected, err)
			}
			vc.Blocks = append(vc.Blocks, vectorBlock{e.Span[0], e.Span[1], d, key})
		}
		out = append(out, vc)
	}
	return out
}

// words are block b's token ids as an event carries them (bigram: pairs).
func (vc *vectorCase) words(b vectorBlock) []int32 {
	if vc.Profile.Strategy != hashing.StrategySGLangBigram {
		return vc.Tokens[b.start:b.end]
	}
	var w []int32
	for p := b.start; p < b.end; p++ {
		w = append(w, vc.Tokens[p], vc.Tokens[p+1])
	}
	return w
}

// everyBlock checks every block, so results are not sampled away.
var everyBlock = Options{Warmup: 1 << 30}

// TestGoldenVectors replays every golden chain as engines publish it and
// checks each block: as one event from the chain's start, block by block
// with integer parents (resolved through the checker's memory), and block
// by block with full digests. Every block matches; a wrong published hash
// does not.
func TestGoldenVectors(t *testing.T) {
	blocks := 0
	for _, vc := range loadVectors(t) {
		if len(vc.Blocks) == 0 {
			continue
		}
		t.Run(vc.ID, func(t *testing.T) {
			set := NewSet(everyBlock)
			startEx := Extras{Known: true, Salt: vc.Salt}
			for _, mode := range []string{"one event", "integer parents", "digest parents"} {
				c := set.Add(vc.ID+"/"+mode, &vc.Profile, vc.BS, vc.Lora)
				p := Root()
				for i, b := range vc.Blocks {
					pub := Published{Key: b.key}
					switch mode {
					case "integer parents":
						if i > 0 {
							p = FromKey(vc.Blocks[i-1].key)
						}
					case "digest parents":
						if i > 0 {
							p = FromDigest(vc.Blocks[i-1].digest)
						}
						pub.Digest = b.digest
					}
					r, next := c.Check(p, vc.words(b), startEx, pub)
					if r != Match {
						t.Fatalf("%s: block %d: %v", mode, i, r)
					}
					if !next.Known() {
						t.Fatalf("%s: block %d: a matched block's digest is not passed on", mode, i)
					}
					p = next
					blocks++
				}
			}
			// A published hash one bit off is a mismatch.
			c := set.Add(vc.ID+"/wrong", &vc.Profile, vc.BS, vc.Lora)
			b := vc.Blocks[0]
			if r, _ := c.Check(Root(), vc.words(b), startEx, Published{Key: b.key ^ 1}); r != Mismatch {
				t.Fatalf("wrong key: %v", r)
			}
			wrong := bytes.Clone(b.digest)
			wrong[0] ^= 0x80 // outside the key's bytes for vLLM: only a full compare sees it
			if r, _ := c.Check(Root(), vc.words(b), startEx, Published{Key: b.key, Digest: wrong}); r != Mismatch {
				t.Fatalf("wrong digest: %v", r)
			}
		})
	}
	if blocks == 0 {
		t.Fatal("no block checked")
	}
}

// TestSeedMattersOnlyAtChainStart: under another seed, a chain's first
// block mismatches, but a block hashed from a given parent digest still
// matches, which is why the warning names the seed only for the former.
func TestSeedMattersOnlyAtChainStart(t *testing.T) {
	for _, vc := range loadVectors(t) {
		if vc.Profile.Strategy != hashing.StrategyVLLMV1 || len(vc.Blocks) < 2 || vc.Profile.PythonHashSeed == "1" {
			continue
		}
		seed := "1"
		p, err := hashing.Resolve(hashing.Spec{Strategy: vc.Profile.Strategy, Algorithm: vc.Profile.Algorithm,
			IndexProjection: vc.Profile.IndexProjection, PythonHashSeed: &seed})
		if err != nil {
			t.Fatal(err)
		}
		c := NewSet(everyBlock).Add("s", &p, vc.BS, vc.Lora)
		ex := Extras{Known: true, Salt: vc.Salt}
		if r, _ := c.Check(Root(), vc.words(vc.Blocks[0]), ex, Published{Key: vc.Blocks[0].key}); r != Mismatch {
			t.Fatalf("%s: chain start under another seed: %v", vc.ID, r)
		}
		if r, _ := c.Check(FromDigest(vc.Blocks[0].digest), vc.words(vc.Blocks[1]), ex, Published{Key: vc.Blocks[1].key}); r != Match {
			t.Fatalf("%s: block from a given parent under another seed: %v", vc.ID, r)
		}
		return
	}
	t.Fatal("no vLLM vector with two blocks")
}

func vllmProfile(t testing.TB, alg string) hashing.Profile {
	seed := "0"
	p, err := hashing.Resolve(hashing.Spec{Strategy: hashing.StrategyVLLMV1, Algorithm: alg,
		IndexProjection: hashing.ProjectionLow64BE, PythonHashSeed: &seed})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestSkips: whatever the event does not pin down is skipped, never
// counted as a mismatch.
func TestSkips(t *testing.T) {
	p := vllmProfile(t, hashing.AlgorithmSHA256CBOR)
	toks := []int32{1, 2, 3, 4}
	const key0 = 2164874634404590027 // golden key of [1,2,3,4], bs 4, seed 0
	known := Extras{Known: true}
	for _, tc := range []struct {
		name   string
		parent Parent
		words  []int32
		ex     Extras
		pub    Published
		want   Result
		why    SkipReason
	}{
		{"control: a chain start matches", Root(), toks, known, Published{Key: key0}, Match, 0},
		{"unknown parent", Parent{}, toks, known, Published{Key: key0}, Skipped, SkipParentNotPinned},
		{"integer parent never verified", FromKey(42), toks, known, Published{Key: key0}, Skipped, SkipParentNotPinned},
		{"16-byte parent (xxhash)", FromDigest(make([]byte, 16)), toks, known, Published{Key: key0}, Skipped, SkipParentNotPinned},
		{"chain start, extras unknown", Root(), toks, Extras{}, Published{Key: key0}, Skipped, SkipNoExtraKeys},
		{"later block, extras unknown", FromDigest(make([]byte, 32)), toks, Extras{}, Published{Key: key0}, Skipped, SkipNoExtraKeys},
		{"foreign extra keys", Root(), toks, Extras{Known: true, Foreign: true}, Published{Key: key0}, Skipped, SkipForeignExtraKeys},
		{"short block", Root(), toks[:3], known, Published{Key: key0}, Skipped, SkipBlockShape},
		{"long block", Root(), append(toks, 5), known, Published{Key: key0}, Skipped, SkipBlockShape},
		{"no tokens", Root(), nil, known, Published{Key: key0}, Skipped, SkipNoTokenIDs},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewSet(everyBlock).Add("s", &p, 4, "")
			r, _ := c.Check(tc.parent, tc.words, tc.ex, tc.pub)
			if r != tc.want {
				t.Fatalf("%v, want %v", r, tc.want)
			}
			m, mm := c.Counts()
			if tc.want == Skipped && m+mm != 0 {
				t.Fatalf("a skip was counted as a check: %d/%d", m, mm)
			}
			var want [NumSkipReasons]uint64
			if tc.want == Skipped {
				want[tc.why] = 1
			}
			if got := c.Skips(); got != want {
				t.Errorf("skips %v, want %v (%s)", got, want, tc.why)
			}
		})
	}
}

// TestSampling pins the deterministic schedule: every checkable block of
// the warm-up, then one block per Every blocks seen, at most MaxPerEvent
// per event, and credit for uncheckable stretches capped at one event's
// worth.
func TestSampling(t *testing.T) {
	p := vllmProfile(t, hashing.AlgorithmSHA256CBOR)
	toks := []int32{1, 2, 3, 4}
	ev := Event{Parent: Root(), Tokens: toks, BlockSize: 4, Keys: []uint64{2164874634404590027}, Extras: []Extras{{Known: true}}}
	c := NewSet(Options{Warmup: 10, Every: 8, MaxPerEvent: 3}).Add("s", &p, 4, "")
	var granted []int
	for range 10 + 8*5 {
		n := c.Sample(1)
		granted = append(granted, n)
		c.CheckEvent(&ev, n)
	}
	want := make([]int, 10+8*5)
	for i := range 10 {
		want[i] = 1
	}
	for i := 10 + 7; i < len(want); i += 8 {
		want[i] = 1
	}
	if diff := cmp.Diff(want, granted); diff != "" {
		t.Fatalf("grants (-want +got):\n%s", diff)
	}
	if m, mm := c.Counts(); m != 15 || mm != 0 {
		t.Fatalf("counts %d/%d, want 15 matches", m, mm)
	}
	// A long stretch of blocks that cannot be checked banks credit for at
	// most MaxPerEvent checks.
	for range 1000 {
		c.Sample(16)
	}
	if n := c.Sample(100); n != 3 {
		t.Fatalf("after a long uncheckable stretch: %d granted, want 3", n)
	}
	// Ungranted events are neither hashed nor counted.
	before, _ := c.Counts()
	c2 := NewSet(Options{Warmup: 1, Every: 1000}).Add("t", &p, 4, "")
	c2.CheckEvent(&ev, c2.Sample(1))
	for range 500 {
		c2.CheckEvent(&ev, c2.Sample(1))
	}
	if m, _ := c2.Counts(); m != 1 {
		t.Fatalf("%d checks, want only the warm-up's 1", m)
	}
	if after, _ := c.Counts(); after != before {
		t.Fatal("counts moved without checks")
	}
}

// TestChecksAreBoundedFraction: over a long run of one-block events, checks
// are the warm-up plus one in Every.
func TestChecksAreBoundedFraction(t *testing.T) {
	p := vllmProfile(t, hashing.AlgorithmSHA256CBOR)
	ev := Event{Parent: Root(), Tokens: []int32{1, 2, 3, 4}, BlockSize: 4, Keys: []uint64{2164874634404590027}, Extras: []Extras{{Known: true}}}
	c := NewSet(Options{}).Add("s", &p, 4, "")
	const n = 100_000
	for range n {
		c.CheckEvent(&ev, c.Sample(1))
	}
	m, _ := c.Counts()
	if want := uint64(DefaultWarmup + (n-DefaultWarmup)/DefaultEvery); m != want {
		t.Fatalf("%d checks of %d blocks, want %d", m, n, want)
	}
}

// TestOneWarningWithoutSecrets: a service's first mismatch logs one WARN
// naming the service and causes; later ones log nothing; token ids and the
// salt never appear.
func TestOneWarningWithoutSecrets(t *testing.T) {
	pickle := vllmProfile(t, hashing.AlgorithmSHA256)
	cbor := vllmProfile(t, hashing.AlgorithmSHA256CBOR)
	toks := []int32{9876501, 9876502, 9876503, 9876504}
	const salt = "s3cr3t-salt-value"
	// The engine hashes with pickle; the registration says CBOR.
	var h hashing.BlockHasher
	d, _ := h.Digest(&pickle, nil, toks, "adapter-x", salt)
	var logs bytes.Buffer
	c := NewSet(Options{Warmup: 100, Logger: zerolog.New(&logs)}).Add("vllm-0|default|0", &cbor, 4, "adapter-x")
	for range 5 {
		if r, _ := c.Check(Root(), toks, Extras{Known: true, Salt: salt}, Published{Key: pickle.Key(&d)}); r != Mismatch {
			t.Fatalf("%v", r)
		}
	}
	if m, mm := c.Counts(); m != 0 || mm != 5 {
		t.Fatalf("counts %d/%d", m, mm)
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("%d lines: %s", len(lines), logs.String())
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"level": "warn", "service": "vllm-0|default|0", "strategy": "vllm_v1", "algorithm": "sha256_cbor",
		"block_size": float64(4), "chain_start": true, "reproduced_with": "algorithm sha256",
	}
	if diff := cmp.Diff(want, got, cmpopts.IgnoreMapEntries(func(k string, _ any) bool {
		return k == "message" || k == "likely_causes"
	})); diff != "" {
		t.Errorf("warning (-want +got):\n%s", diff)
	}
	for _, cause := range []string{"python_hash_seed", "algorithm", "LoRA", "salt", "block_size"} {
		if !strings.Contains(got["likely_causes"].(string), cause) {
			t.Errorf("likely_causes lacks %q: %v", cause, got["likely_causes"])
		}
	}
	for _, secret := range []string{salt, "98765"} {
		if strings.Contains(logs.String(), secret) {
			t.Errorf("log contains %q: %s", secret, logs.String())
		}
	}
}

// TestSetLifecycle: a checker's series exist at zero from its creation and
// go with its service; a replaced checker's removal leaves the new one.
func TestSetLifecycle(t *testing.T) {
	p := vllmProfile(t, hashing.AlgorithmSHA256CBOR)
	s := NewSet(Options{})
	a := s.Add("a", &p, 4, "")
	b := s.Add("b", &p, 4, "")
	sorted := cmpopts.SortSlices(func(x, y Count) bool { return x.Service < y.Service })
	if diff := cmp.Diff([]Count{{Service: "a"}, {Service: "b"}}, s.Snapshot(), sorted); diff != "" {
		t.Fatalf("after Add (-want +got):\n%s", diff)
	}
	a.Check(Root(), []int32{1, 2, 3, 4}, Extras{Known: true}, Published{Key: 2164874634404590027})
	b.Check(Root(), []int32{1, 2, 3, 4}, Extras{Known: true}, Published{Key: 1})
	if diff := cmp.Diff([]Count{{Service: "a", Matches: 1}, {Service: "b", Mismatches: 1}}, s.Snapshot(), sorted); diff != "" {
		t.Fatalf("after checks (-want +got):\n%s", diff)
	}
	a2 := s.Add("a", &p, 4, "") // a restart: the new checker starts from zero
	s.Remove(a)                 // the old source stopping after it changes nothing
	if diff := cmp.Diff([]Count{{Service: "a"}, {Service: "b", Mismatches: 1}}, s.Snapshot(), sorted); diff != "" {
		t.Fatalf("after restart (-want +got):\n%s", diff)
	}
	s.Remove(a2)
	s.Remove(b)
	s.Remove(nil)
	if got := s.Snapshot(); len(got) != 0 {
		t.Fatalf("after Remove: %v", got)
	}
	var nilSet *Set
	if nilSet.Snapshot() != nil {
		t.Fatal("nil set snapshot")
	}
}

// TestSkipCountsAndNote: an event that stops being checkable at a block
// counts that block and every later granted one as skipped for the same
// reason, and only a service's first skip logs its INFO, naming what is
// missing (never token ids).
func TestSkipCountsAndNote(t *testing.T) {
	p := vllmProfile(t, hashing.AlgorithmSHA256CBOR)
	var logs bytes.Buffer
	s := NewSet(Options{Logger: zerolog.New(&logs), Warmup: 100})
	c := s.Add("svc|default|0", &p, 4, "")
	// Three blocks without extra_keys: all three skipped.
	ev := Event{Parent: Root(), Tokens: []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, BlockSize: 4, Keys: []uint64{1, 2, 3}}
	if m, mm := c.CheckEvent(&ev, c.Sample(3)); m+mm != 0 {
		t.Fatalf("checked %d/%d blocks without extra_keys", m, mm)
	}
	// A matching first block, then a token run too short for the rest.
	ev = Event{Parent: Root(), Tokens: []int32{1, 2, 3, 4}, BlockSize: 4, Keys: []uint64{2164874634404590027, 5, 6},
		Extras: []Extras{{Known: true}, {Known: true}, {Known: true}}}
	if m, _ := c.CheckEvent(&ev, c.Sample(3)); m != 1 {
		t.Fatalf("%d matches, want 1", m)
	}
	c.Skip(SkipNoTokenIDs, 4)
	var want [NumSkipReasons]uint64
	want[SkipNoExtraKeys], want[SkipBlockShape], want[SkipNoTokenIDs] = 3, 2, 4
	if got := c.Skips(); got != want {
		t.Errorf("skips %v, want %v", got, want)
	}
	snap := s.Snapshot()
	if len(snap) != 1 || snap[0].Skipped != want || snap[0].SkippedTotal() != 9 || snap[0].Matches != 1 {
		t.Errorf("snapshot %+v", snap)
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("%d log lines, want one INFO:\n%s", len(lines), logs.String())
	}
	var l map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &l); err != nil {
		t.Fatal(err)
	}
	if l["level"] != "info" || l["missing"] != "no_extra_keys" || l["service"] != "svc|default|0" ||
		!strings.Contains(l["detail"].(string), "extra_keys") {
		t.Errorf("note %v", l)
	}
	for i, r := range SkipReasons() {
		if int(r) != i || r.String() == "unknown" || skipHelp[r] == "" {
			t.Errorf("reason %d: %q, help %q", i, r, skipHelp[r])
		}
	}
}

// TestBlocksAfterAMismatch: the blocks after one whose hash did not match
// (a chain from its first block, integer hashes) are skipped as following
// the mismatch, in that event and in a later one continuing it, and only
// the mismatch's WARN is logged: no INFO blaming parent_not_pinned, which
// says the events lack something they do not.
func TestBlocksAfterAMismatch(t *testing.T) {
	p := vllmProfile(t, hashing.AlgorithmSHA256CBOR)
	var logs bytes.Buffer
	s := NewSet(Options{Logger: zerolog.New(&logs), Warmup: 100})
	c := s.Add("svc|default|0", &p, 4, "")
	known := []Extras{{Known: true}, {Known: true}, {Known: true}}
	ev := Event{Parent: Root(), Tokens: []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, BlockSize: 4, Keys: []uint64{41, 42, 43}, Extras: known}
	if m, mm := c.CheckEvent(&ev, c.Sample(3)); m != 0 || mm != 1 {
		t.Fatalf("%d matches, %d mismatches; want the first block mismatched", m, mm)
	}
	next := Event{Parent: FromKey(43), Tokens: []int32{13, 14, 15, 16}, BlockSize: 4, Keys: []uint64{44}, Extras: known[:1]}
	c.CheckEvent(&next, c.Sample(1))
	// a parent never seen is still not pinned
	other := Event{Parent: FromKey(99), Tokens: []int32{13, 14, 15, 16}, BlockSize: 4, Keys: []uint64{45}, Extras: known[:1]}
	var want [NumSkipReasons]uint64
	want[SkipParentMismatched] = 3 // two in the event, one in the next
	if got := c.Skips(); got != want {
		t.Errorf("after the mismatch: skips %v, want %v", got, want)
	}
	c.CheckEvent(&other, c.Sample(1))
	want[SkipParentNotPinned] = 1
	if got := c.Skips(); got != want {
		t.Errorf("skips %v, want %v", got, want)
	}
	var levels []string
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var l map[string]any
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatal(err)
		}
		levels = append(levels, fmt.Sprint(l["level"], " ", l["missing"]))
	}
	// the WARN, then the INFO of the one block that really lacked a
	// verified parent
	if diff := cmp.Diff([]string{"warn <nil>", "info parent_not_pinned"}, levels); diff != "" {
		t.Errorf("log lines (-want +got):\n%s\n%s", diff, logs.String())
	}
}
