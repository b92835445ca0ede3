package hashing

import (
	"encoding/hex"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mooncake-conductor-go/conductor/internal/testkit/hashvectors"
)

// TestVLLMAlgorithmVectors recomputes the generated file with the chain
// and compares all of it: roots, each block's hashed bytes, digest, key
// and event integer.
func TestVLLMAlgorithmVectors(t *testing.T) {
	var want hashvectors.Public
	hashvectors.Load(t, hashvectors.AlgorithmsFile, &want)
	if len(want.Cases) == 0 || len(want.Cases) != want.CaseCount || len(want.SeedRoots) == 0 {
		t.Fatalf("vector file has %d cases (says %d) and %d roots", len(want.Cases), want.CaseCount, len(want.SeedRoots))
	}
	algs := map[string]bool{}
	got := hashvectors.Public{Format: want.Format, CaseCount: len(want.Cases)}
	for _, sr := range want.SeedRoots {
		p := mustResolve(t, sr.Strategy, sr.Algorithm, "low64_be", sr.PythonHashSeed)
		in := hex.EncodeToString(rootInput(p.kind, p.PythonHashSeed))
		got.SeedRoots = append(got.SeedRoots, hashvectors.SeedRoot{Strategy: p.Strategy, Algorithm: p.Algorithm,
			PythonHashSeed: &p.PythonHashSeed, RootInputHex: &in, RootDigest: p.RootDigestHex()})
		algs[sr.Algorithm] = true
	}
	for _, a := range []string{"sha256", "sha256_cbor", "xxhash", "xxhash_cbor"} {
		if !algs[a] {
			t.Errorf("no vectors for algorithm %s", a)
		}
	}
	for _, tc := range want.Cases {
		pr := tc.Profile
		p := mustResolve(t, pr.Strategy, pr.Algorithm, pr.IndexProjection, pr.PythonHashSeed)
		toks, lora, salt := tc.Expand()
		g := tc
		g.RootDigest = p.RootDigestHex()
		g.TokenCount = len(toks)
		g.Expected = []hashvectors.Block{}
		start := 0
		for i, b := range runChain(&p, tc.BlockSize, toks, lora, salt) {
			key := strconv.FormatUint(b.key, 10)
			g.Expected = append(g.Expected, hashvectors.Block{
				Index: i, Span: [2]int{start, start + b.covered}, Covered: b.covered,
				InputHex: hex.EncodeToString(b.input), Digest: hex.EncodeToString(p.DigestBytes(&b.digest)),
				Projected: key, ProjectedHex: hexKey(b.key), WireInt: key,
			})
			start += b.covered
		}
		got.Cases = append(got.Cases, g)
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("chain differs from %s (-want +got):\n%s", hashvectors.AlgorithmsFile, d)
	}
}

// TestVLLMAlgorithmTable is engine-dialects.md §1's table (block size 16,
// tokens 1..32, no extra keys) and its LoRA + salt vector, written out so
// that they hold without any vector file.
func TestVLLMAlgorithmTable(t *testing.T) {
	tests := []struct {
		alg, seed, root string
		lora, salt      string
		digest0         string
		keys            [2]uint64
	}{
		{"sha256", "vllm-none-hash", "066b1e8987e027138e98701c46128929378935f9b6cd1549105ae6b4f0d71198", "", "",
			"7b255da405e1d722823892e4fef187b4d8ac78215d7f0dd2137bb037547f4caf", [2]uint64{1403909460543360175, 1643945449041937783}},
		{"sha256_cbor", "vllm-none-hash", "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0", "", "",
			"", [2]uint64{8866452693264111234, 807986237951177663}},
		{"xxhash", "0", "6fb31cc38bba6066183f7f2104b9c051", "", "",
			"6ba7d7fc1608e5f0a4612b1b0c87458f", [2]uint64{11844795890135418255, 14253768906014549686}},
		{"xxhash_cbor", "0", "1ebe36576dcb573f26b99533a20aaeca", "", "",
			"", [2]uint64{882618318818381833, 12890060145260523405}},
		{"xxhash", "random", "c65c9b784048f08f9df9ee060f014076", "", "",
			"", [2]uint64{4128142054948571106, 1459897094828647114}},
		{"xxhash_cbor", "42", "a9d2e63407fce1a26c9dc9d7fa2d7caf", "", "",
			"", [2]uint64{14255326629130133946, 8320077250611386183}},
		{"xxhash_cbor", "0", "1ebe36576dcb573f26b99533a20aaeca", "adapter-A", "tenant-salt",
			"86134ffad6228d857e6adacfc8b20e28", [2]uint64{9109333782270447144, 17312180953328720644}},
	}
	for _, tt := range tests {
		t.Run(tt.alg+"/"+tt.seed+"/"+tt.lora, func(t *testing.T) {
			p := mustResolve(t, "vllm_v1", tt.alg, "low64_be", &tt.seed)
			if got := p.RootDigestHex(); got != tt.root {
				t.Errorf("root_digest = %s, want %s", got, tt.root)
			}
			if len(tt.root) != 2*p.DigestLen() {
				t.Errorf("DigestLen = %d for a %d-character root", p.DigestLen(), len(tt.root))
			}
			got := runChain(&p, 16, seq(1, 32), tt.lora, tt.salt)
			if len(got) != 2 {
				t.Fatalf("%d blocks, want 2", len(got))
			}
			for i, g := range got {
				if g.key != tt.keys[i] || g.covered != 16 {
					t.Errorf("block %d = (%d, %d), want (%d, 16)", i, g.key, g.covered, tt.keys[i])
				}
				// Both event forms: the integer and the raw digest.
				raw := p.DigestBytes(&got[i].digest)
				if k, err := KeyFromBytes(p.Projection(), raw); err != nil || k != tt.keys[i] {
					t.Errorf("block %d: KeyFromBytes(%d-byte digest) = %d, %v", i, len(raw), k, err)
				}
				if k, err := KeyFromUint(p.Projection(), tt.keys[i]); err != nil || k != tt.keys[i] {
					t.Errorf("block %d: KeyFromUint = %d, %v", i, k, err)
				}
			}
			if tt.digest0 != "" {
				if d := hex.EncodeToString(p.DigestBytes(&got[0].digest)); d != tt.digest0 {
					t.Errorf("block 0 digest = %s, want %s", d, tt.digest0)
				}
			}
			if p.DigestLen() == 16 {
				// The parent inside block 1 is the full 16-byte digest.
				parent := p.DigestBytes(&got[0].digest)
				in := got[1].input
				var hdr []byte
				if tt.alg == "xxhash_cbor" {
					hdr = []byte{0x83, 0x50}
				} else {
					hdr = []byte{opShortBinBytes, 16}
				}
				if i := indexOf(in, append(hdr, parent...)); i < 0 {
					t.Errorf("block 1's input does not hold block 0's 16-byte digest")
				}
			}
		})
	}
}

func indexOf(b, sub []byte) int {
	for i := 0; i+len(sub) <= len(b); i++ {
		if string(b[i:i+len(sub)]) == string(sub) {
			return i
		}
	}
	return -1
}
