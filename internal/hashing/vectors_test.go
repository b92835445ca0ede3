package hashing

import (
	"bytes"
	"encoding/hex"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/mooncake-conductor-go/conductor/internal/testkit/hashvectors"
)

// gotBlock is what the lazy chain produced for one block, including the
// exact bytes it hashed.
type gotBlock struct {
	input   []byte
	digest  [32]byte
	key     uint64
	covered int
}

func runChain(p *Profile, bs int, toks []int32, lora, salt string) []gotBlock {
	c := AcquireChain()
	defer ReleaseChain(c)
	c.Reset(p, bs, toks, lora, salt)
	var out []gotBlock
	for {
		k, cov, ok := c.Next()
		if !ok {
			break
		}
		out = append(out, gotBlock{bytes.Clone(c.buf), c.parent, k, cov})
	}
	return out
}

func mustResolve(t testing.TB, strategy, algorithm, projection string, seed *string) Profile {
	t.Helper()
	p, err := Resolve(Spec{Strategy: strategy, Algorithm: algorithm, IndexProjection: projection, PythonHashSeed: seed})
	if err != nil {
		t.Fatalf("Resolve(%s/%s/%s): %v", strategy, algorithm, projection, err)
	}
	return p
}

func TestPublicSeedRoots(t *testing.T) {
	v := hashvectors.LoadPublic(t)
	if len(v.SeedRoots) == 0 {
		t.Fatal("no seed_roots in vectors")
	}
	for _, sr := range v.SeedRoots {
		name := sr.Strategy + "/" + sr.Algorithm + "/" + deref(sr.PythonHashSeed)
		t.Run(name, func(t *testing.T) {
			proj := "low64_be"
			if sr.Strategy != "vllm_v1" {
				proj = "first64_be"
			}
			p := mustResolve(t, sr.Strategy, sr.Algorithm, proj, sr.PythonHashSeed)
			if got := p.RootDigestHex(); got != sr.RootDigest {
				t.Errorf("root_digest = %s, want %s", got, sr.RootDigest)
			}
			if sr.RootInputHex != nil {
				if got := hex.EncodeToString(rootInput(p.kind, *sr.PythonHashSeed)); got != *sr.RootInputHex {
					t.Errorf("root input = %s, want %s", got, *sr.RootInputHex)
				}
			}
			if sr.Strategy != "vllm_v1" && p.PythonHashSeed != "0" {
				t.Errorf("SGLang python_hash_seed = %q, want \"0\"", p.PythonHashSeed)
			}
		})
	}
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

func TestPublicCases(t *testing.T) {
	v := hashvectors.LoadPublic(t)
	if len(v.Cases) != v.CaseCount || len(v.Cases) == 0 {
		t.Fatalf("have %d cases, file says %d", len(v.Cases), v.CaseCount)
	}
	blocks := 0
	for _, tc := range v.Cases {
		t.Run(tc.ID, func(t *testing.T) {
			pr := tc.Profile
			p := mustResolve(t, pr.Strategy, pr.Algorithm, pr.IndexProjection, pr.PythonHashSeed)
			if got := p.RootDigestHex(); got != tc.RootDigest {
				t.Errorf("root_digest = %s, want %s", got, tc.RootDigest)
			}
			toks, lora, salt := tc.Expand()
			if len(toks) != tc.TokenCount {
				t.Fatalf("expanded %d tokens, want %d", len(toks), tc.TokenCount)
			}
			got := runChain(&p, tc.BlockSize, toks, lora, salt)
			if len(got) != len(tc.Expected) {
				t.Fatalf("chain produced %d blocks, want %d", len(got), len(tc.Expected))
			}
			start, sum := 0, 0
			for i, e := range tc.Expected {
				g := got[i]
				blocks++
				if e.Index != i || e.Span[0] != start || e.Span[1]-e.Span[0] != e.Covered {
					t.Fatalf("block %d: malformed vector span %v", i, e.Span)
				}
				start = e.Span[1]
				sum += g.covered
				if g.covered != e.Covered {
					t.Errorf("block %d: covered = %d, want %d", i, g.covered, e.Covered)
				}
				checkInput(t, i, g.input, e.InputHex, e.InputLen, e.InputHeadHex, e.InputTailHex)
				if d := hex.EncodeToString(g.digest[:]); d != e.Digest {
					t.Errorf("block %d: digest = %s, want %s", i, d, e.Digest)
				}
				if k := strconv.FormatUint(g.key, 10); k != e.Projected {
					t.Errorf("block %d: key = %s, want %s", i, k, e.Projected)
				}
				if k := hexKey(g.key); k != e.ProjectedHex {
					t.Errorf("block %d: key hex = %s, want %s", i, k, e.ProjectedHex)
				}
				checkWireInt(t, i, p.Projection(), e.WireInt, g.key)
				if k, err := KeyFromHex(p.Projection(), e.Digest); err != nil || k != g.key {
					t.Errorf("block %d: KeyFromHex(digest) = %d, %v; want %d", i, k, err, g.key)
				}
				raw, _ := hex.DecodeString(e.Digest)
				if k, err := KeyFromBytes(p.Projection(), raw); err != nil || k != g.key {
					t.Errorf("block %d: KeyFromBytes(digest) = %d, %v; want %d", i, k, err, g.key)
				}
			}
			// docs/hashing.md#counting-hits: counts never exceed n, or n-1 for
			// bigram.
			limit := len(toks)
			if pr.Strategy == "sglang_bigram" {
				limit = max(len(toks)-1, 0)
			}
			if sum > limit {
				t.Errorf("sum of covered = %d exceeds %d", sum, limit)
			}
			// The eager reference must agree with the vectors too.
			compareRef(t, refChain(p, tc.BlockSize, toks, lora, salt), got)
		})
	}
	if blocks == 0 {
		t.Fatal("no blocks checked")
	}
}

func checkInput(t *testing.T, i int, got []byte, full string, n int, head, tail string) {
	t.Helper()
	if full != "" {
		if g := hex.EncodeToString(got); g != full {
			t.Errorf("block %d: input =\n %s\nwant\n %s", i, g, full)
		}
		return
	}
	if n == 0 {
		return
	}
	if len(got) != n {
		t.Errorf("block %d: input length = %d, want %d", i, len(got), n)
	}
	h, _ := hex.DecodeString(head)
	tl, _ := hex.DecodeString(tail)
	if !bytes.HasPrefix(got, h) {
		t.Errorf("block %d: input head mismatch", i)
	}
	if !bytes.HasSuffix(got, tl) {
		t.Errorf("block %d: input tail mismatch", i)
	}
}

// checkWireInt maps the integer an engine publishes back to the index key.
func checkWireInt(t *testing.T, i int, proj Projection, wire string, key uint64) {
	t.Helper()
	var k uint64
	var err error
	if strings.HasPrefix(wire, "-") || proj == First64BE {
		s, perr := strconv.ParseInt(wire, 10, 64)
		if perr != nil {
			t.Fatalf("block %d: bad wire_int %q", i, wire)
		}
		k, err = KeyFromInt(proj, s)
	} else {
		u, perr := strconv.ParseUint(wire, 10, 64)
		if perr != nil {
			t.Fatalf("block %d: bad wire_int %q", i, wire)
		}
		k, err = KeyFromUint(proj, u)
	}
	if err != nil || k != key {
		t.Errorf("block %d: wire_int %s -> %d, %v; want %d", i, wire, k, err, key)
	}
}

func hexKey(k uint64) string {
	s := strconv.FormatUint(k, 16)
	return strings.Repeat("0", 16-len(s)) + s
}

func compareRef(t *testing.T, want []refBlock, got []gotBlock) {
	t.Helper()
	if len(want) != len(got) {
		t.Fatalf("reference has %d blocks, chain %d", len(want), len(got))
	}
	for i := range want {
		if !bytes.Equal(want[i].input, got[i].input) {
			t.Fatalf("block %d: chain input differs from reference (len %d vs %d)", i, len(got[i].input), len(want[i].input))
		}
		if want[i].digest != got[i].digest || want[i].key != got[i].key || want[i].covered != got[i].covered {
			t.Fatalf("block %d: chain (%x, %d, %d) != reference (%x, %d, %d)", i,
				got[i].digest, got[i].key, got[i].covered, want[i].digest, want[i].key, want[i].covered)
		}
	}
}

type upstreamVectors struct {
	Profile struct {
		Strategy        string `json:"strategy"`
		Algorithm       string `json:"algorithm"`
		PythonHashSeed  string `json:"python_hash_seed"`
		RootDigest      string `json:"root_digest"`
		IndexProjection string `json:"index_projection"`
	} `json:"profile"`
	SeedRootVectors []struct {
		PythonHashSeed   string `json:"python_hash_seed"`
		CanonicalCBORHex string `json:"canonical_cbor_hex"`
		PickleHex        string `json:"pickle_hex"`
		RootDigest       string `json:"root_digest"`
	} `json:"seed_root_vectors"`
	Cases []struct {
		Name string `json:"name"`
		hashvectors.Query
		Expected []struct {
			Digest           string `json:"digest"`
			ProjectedHex     string `json:"projected_hex"`
			ProjectedDecimal string `json:"projected_decimal"`
			PickleHex        string `json:"pickle_hex"`
			PickleLen        int    `json:"pickle_len"`
		} `json:"expected"`
		IncorrectLow64ParentDigest string `json:"incorrect_low64_parent_digest"`
	} `json:"cases"`
}

func TestUpstreamFixtures(t *testing.T) {
	for _, file := range []string{"upstream/hash_golden_vectors.json", "upstream/hash_golden_vectors_sha256.json"} {
		t.Run(filepath.Base(file), func(t *testing.T) {
			var v upstreamVectors
			hashvectors.Load(t, file, &v)
			pr := v.Profile
			seed := pr.PythonHashSeed
			p := mustResolve(t, pr.Strategy, pr.Algorithm, pr.IndexProjection, &seed)
			if p.RootDigestHex() != pr.RootDigest {
				t.Errorf("profile root = %s, want %s", p.RootDigestHex(), pr.RootDigest)
			}
			if len(v.SeedRootVectors) == 0 || len(v.Cases) == 0 {
				t.Fatal("empty fixture")
			}
			for _, sr := range v.SeedRootVectors {
				s := sr.PythonHashSeed
				q := mustResolve(t, pr.Strategy, pr.Algorithm, pr.IndexProjection, &s)
				if q.RootDigestHex() != sr.RootDigest {
					t.Errorf("seed %q: root = %s, want %s", s, q.RootDigestHex(), sr.RootDigest)
				}
				want := sr.CanonicalCBORHex + sr.PickleHex
				if got := hex.EncodeToString(rootInput(q.kind, s)); got != want {
					t.Errorf("seed %q: root input = %s, want %s", s, got, want)
				}
			}
			for _, tc := range v.Cases {
				t.Run(tc.Name, func(t *testing.T) {
					toks, lora, salt := tc.Expand()
					got := runChain(&p, tc.BlockSize, toks, lora, salt)
					if len(got) != len(tc.Expected) {
						t.Fatalf("chain produced %d blocks, want %d", len(got), len(tc.Expected))
					}
					for i, e := range tc.Expected {
						g := got[i]
						if d := hex.EncodeToString(g.digest[:]); d != e.Digest {
							t.Errorf("block %d: digest = %s, want %s", i, d, e.Digest)
						}
						if hexKey(g.key) != e.ProjectedHex || strconv.FormatUint(g.key, 10) != e.ProjectedDecimal {
							t.Errorf("block %d: key = %d (%s), want %s (%s)", i, g.key, hexKey(g.key), e.ProjectedDecimal, e.ProjectedHex)
						}
						if g.covered != tc.BlockSize {
							t.Errorf("block %d: covered = %d, want %d", i, g.covered, tc.BlockSize)
						}
						if e.PickleHex != "" {
							if h := hex.EncodeToString(g.input); h != e.PickleHex {
								t.Errorf("block %d: pickle =\n %s\nwant\n %s", i, h, e.PickleHex)
							}
						}
						if e.PickleLen != 0 && len(g.input) != e.PickleLen {
							t.Errorf("block %d: pickle length = %d, want %d", i, len(g.input), e.PickleLen)
						}
					}
					if trap := tc.IncorrectLow64ParentDigest; trap != "" {
						if len(got) < 2 {
							t.Fatal("trap case needs two blocks")
						}
						if hex.EncodeToString(got[1].digest[:]) == trap {
							t.Error("block 1 was chained on the 64-bit key instead of the digest")
						}
					}
					compareRef(t, refChain(p, tc.BlockSize, toks, lora, salt), got)
				})
			}
		})
	}
}

func TestWireExamples(t *testing.T) {
	v := hashvectors.LoadPublic(t)
	if len(v.WireExamples) == 0 {
		t.Fatal("no wire_examples")
	}
	for _, w := range v.WireExamples {
		t.Run(w.IndexProjection+"/"+w.WireType+"/"+w.WireValue, func(t *testing.T) {
			proj := Low64BE
			if w.IndexProjection == "first64_be" {
				proj = First64BE
			}
			var k uint64
			var err error
			switch w.WireType {
			case "uint":
				u, perr := strconv.ParseUint(w.WireValue, 10, 64)
				if perr != nil {
					t.Fatal(perr)
				}
				k, err = KeyFromUint(proj, u)
			case "int":
				s, perr := strconv.ParseInt(w.WireValue, 10, 64)
				if perr != nil {
					t.Fatal(perr)
				}
				k, err = KeyFromInt(proj, s)
			case "bin":
				b, perr := hex.DecodeString(w.WireValue)
				if perr != nil {
					t.Fatal(perr)
				}
				k, err = KeyFromBytes(proj, b)
			case "hex":
				k, err = KeyFromHex(proj, w.WireValue)
			default:
				t.Fatalf("unknown wire_type %q", w.WireType)
			}
			if err != nil {
				t.Fatalf("error: %v", err)
			}
			if strconv.FormatUint(k, 10) != w.Key || hexKey(k) != w.KeyHex {
				t.Errorf("key = %d (%s), want %s (%s)", k, hexKey(k), w.Key, w.KeyHex)
			}
		})
	}
}
