package hashcheck

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/mooncake-conductor-go/conductor/internal/hashing"
)

func profileOf(t testing.TB, alg, seed string) hashing.Profile {
	t.Helper()
	p, err := hashing.Resolve(hashing.Spec{Strategy: hashing.StrategyVLLMV1, Algorithm: alg,
		IndexProjection: hashing.ProjectionLow64BE, PythonHashSeed: &seed})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestReproducedWithEveryAlgorithm: a registration that differs from the
// engine in its algorithm, its root or both gets one WARN naming the
// engine's actual choice, for every vLLM algorithm and the root of an
// engine without PYTHONHASHSEED (engine-dialects.md §1), whether the
// engine publishes integers or raw digests.
func TestReproducedWithEveryAlgorithm(t *testing.T) {
	tests := []struct {
		name                 string
		regAlg, regSeed      string
		engineAlg, engSeed   string
		reproduced           string
		lora, salt           string
		publishDigest, chain bool
	}{
		{"vllm defaults vs old advice", "sha256_cbor", "0", "sha256", "vllm-none-hash",
			"algorithm sha256, python_hash_seed vllm-none-hash", "", "", false, false},
		{"unset seed", "sha256", "0", "sha256", "vllm-none-hash", "python_hash_seed vllm-none-hash", "adapter-A", "salt", false, false},
		{"unset seed cbor", "sha256_cbor", "42", "sha256_cbor", "vllm-none-hash", "python_hash_seed vllm-none-hash", "", "", true, false},
		{"xxhash engine", "sha256", "0", "xxhash", "0", "algorithm xxhash", "", "", false, false},
		{"xxhash engine bin", "sha256", "0", "xxhash", "0", "algorithm xxhash", "", "salt", true, false},
		{"xxhash_cbor engine", "xxhash", "0", "xxhash_cbor", "0", "algorithm xxhash_cbor", "adapter-A", "", false, false},
		{"xxhash random", "xxhash_cbor", "0", "xxhash_cbor", "random", "python_hash_seed random", "", "", false, false},
		{"sha256 engine, xxhash registered", "xxhash", "0", "sha256", "0", "algorithm sha256", "", "", true, false},
		// Mid-chain (the parent a full digest): only the algorithms of
		// the parent's size can hash it.
		{"mid-chain cbor", "xxhash", "0", "xxhash_cbor", "0", "algorithm xxhash_cbor", "", "", true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := profileOf(t, tt.regAlg, tt.regSeed)
			eng := profileOf(t, tt.engineAlg, tt.engSeed)
			toks := []int32{11, 12, 13, 14, 15, 16, 17, 18}
			var h hashing.BlockHasher
			d0, _ := h.Digest(&eng, nil, toks[:4], tt.lora, tt.salt)
			parent, words, salt := Root(), toks[:4], tt.salt
			pub := Published{Key: eng.Key(&d0)}
			if tt.publishDigest {
				pub.Digest = bytes.Clone(eng.DigestBytes(&d0))
			}
			if tt.chain {
				// Block 1, published with its parent's digest: the
				// parent must be of the registered algorithm's size.
				d1, _ := h.Digest(&eng, &d0, toks[4:], tt.lora, "")
				parent, words, salt = FromDigest(eng.DigestBytes(&d0)), toks[4:], ""
				pub = Published{Key: eng.Key(&d1), Digest: bytes.Clone(eng.DigestBytes(&d1))}
			}
			var logs bytes.Buffer
			c := NewSet(Options{Warmup: 10, Logger: zerolog.New(&logs)}).Add("svc", &reg, 4, tt.lora)
			r, _ := c.Check(parent, words, Extras{Known: true, Salt: salt}, pub)
			if r != Mismatch {
				t.Fatalf("result %v, want mismatch", r)
			}
			var line map[string]any
			if err := json.Unmarshal(bytes.TrimSpace(logs.Bytes()), &line); err != nil {
				t.Fatalf("%v: %s", err, logs.String())
			}
			if got := line["reproduced_with"]; got != tt.reproduced {
				t.Errorf("reproduced_with = %v, want %q", got, tt.reproduced)
			}
			if strings.Contains(logs.String(), "1112131415") || (tt.salt != "" && strings.Contains(logs.String(), `"`+tt.salt+`"`)) {
				t.Errorf("the warning carries token ids or the salt: %s", logs.String())
			}
		})
	}
}

// TestXXHashChainsCheck: under xxhash profiles a chain checks from its
// first block on, with parents published as 16-byte digests or as
// integers of blocks verified before; a 32-byte parent (another
// algorithm's) is not pinned.
func TestXXHashChainsCheck(t *testing.T) {
	for _, alg := range []string{"xxhash", "xxhash_cbor"} {
		t.Run(alg, func(t *testing.T) {
			p := profileOf(t, alg, "42")
			toks := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
			var h hashing.BlockHasher
			var ds [3][32]byte
			for i := range ds {
				var parent *[32]byte
				if i > 0 {
					parent = &ds[i-1]
				}
				ds[i], _ = h.Digest(&p, parent, toks[4*i:4*i+4], "", "")
			}
			c := NewSet(Options{Warmup: 100}).Add("svc", &p, 4, "")
			ex := Extras{Known: true}
			// Raw digests throughout, in one event.
			ev := Event{Parent: Root(), Tokens: toks, BlockSize: 4, Extras: []Extras{ex, ex, ex}}
			for i := range ds {
				ev.Keys = append(ev.Keys, p.Key(&ds[i]))
				ev.Digests = append(ev.Digests, bytes.Clone(p.DigestBytes(&ds[i])))
			}
			if m, mm := c.CheckEvent(&ev, 3); m != 3 || mm != 0 {
				t.Fatalf("digest chain: %d matches, %d mismatches", m, mm)
			}
			// A later event naming its parent by 16-byte digest.
			r, _ := c.Check(FromDigest(p.DigestBytes(&ds[1])), toks[8:], ex, Published{Key: p.Key(&ds[2])})
			if r != Match {
				t.Errorf("16-byte parent: %v", r)
			}
			// And by integer key, remembered from the first event.
			r, _ = c.Check(FromKey(p.Key(&ds[1])), toks[8:], ex, Published{Key: p.Key(&ds[2])})
			if r != Match {
				t.Errorf("integer parent: %v", r)
			}
			// A 32-byte parent cannot be an xxhash block's.
			var wide [32]byte
			r, _ = c.Check(FromDigest(wide[:]), toks[8:], ex, Published{Key: p.Key(&ds[2])})
			if r != Skipped || c.Skips()[SkipParentNotPinned] != 1 {
				t.Errorf("32-byte parent: %v, skips %v", r, c.Skips())
			}
			if _, mm := c.Counts(); mm != 0 {
				t.Errorf("%d mismatches", mm)
			}
		})
	}
}
