package hashing

import (
	"encoding/hex"
	"testing"

	"github.com/mooncake-conductor-go/conductor/internal/testkit/hashvectors"
)

// TestBlockHasherMatchesVectors recomputes every block of every public
// vector from its parent digest alone, as an event check does: the first
// block from the chain's start, every later one from the previous digest.
func TestBlockHasherMatchesVectors(t *testing.T) {
	v := hashvectors.LoadPublic(t)
	var h BlockHasher
	blocks := 0
	for _, tc := range v.Cases {
		t.Run(tc.ID, func(t *testing.T) {
			pr := tc.Profile
			p := mustResolve(t, pr.Strategy, pr.Algorithm, pr.IndexProjection, pr.PythonHashSeed)
			toks, lora, salt := tc.Expand()
			var parent *[32]byte
			for i, e := range tc.Expected {
				words := toks[e.Span[0]:e.Span[1]]
				if pr.Strategy == StrategySGLangBigram {
					words = bigramWords(toks, e.Span[0], e.Span[1])
				}
				d, ok := h.Digest(&p, parent, words, lora, salt)
				if !ok {
					t.Fatalf("block %d: not hashed", i)
				}
				if got := hex.EncodeToString(d[:]); got != e.Digest {
					t.Fatalf("block %d: digest %s, want %s", i, got, e.Digest)
				}
				if k := hexKey(p.Key(&d)); k != e.ProjectedHex {
					t.Fatalf("block %d: key %s, want %s", i, k, e.ProjectedHex)
				}
				parent = &d
				blocks++
			}
		})
	}
	if blocks == 0 {
		t.Fatal("no blocks checked")
	}
}

// bigramWords spells out positions [start, end) as SGLang events carry
// them: each position's pair, flattened.
func bigramWords(toks []int32, start, end int) []int32 {
	var w []int32
	for p := start; p < end; p++ {
		w = append(w, toks[p], toks[p+1])
	}
	return w
}

func TestBlockHasherRefuses(t *testing.T) {
	seed := "0"
	vllm := mustResolve(t, StrategyVLLMV1, AlgorithmSHA256CBOR, ProjectionLow64BE, &seed)
	sg := mustResolve(t, StrategySGLang, AlgorithmSHA256Raw, ProjectionFirst64BE, nil)
	bi := mustResolve(t, StrategySGLangBigram, AlgorithmSHA256Raw, ProjectionFirst64BE, nil)
	var h BlockHasher
	for _, tc := range []struct {
		name  string
		p     *Profile
		words []int32
	}{
		{"no words", &vllm, nil},
		{"nil profile", nil, []int32{1}},
		{"zero profile", &Profile{}, []int32{1}},
		{"sglang negative id", &sg, []int32{1, -2}},
		{"bigram odd words", &bi, []int32{1, 2, 3}},
	} {
		if _, ok := h.Digest(tc.p, nil, tc.words, "", ""); ok {
			t.Errorf("%s: hashed", tc.name)
		}
	}
	// Refusals leave the hasher usable.
	if _, ok := h.Digest(&vllm, nil, []int32{1, 2}, "", ""); !ok {
		t.Error("hasher unusable after refusals")
	}
}

func TestChainDigestFollowsMemo(t *testing.T) {
	seed := "0"
	p := mustResolve(t, StrategyVLLMV1, AlgorithmSHA256CBOR, ProjectionLow64BE, &seed)
	toks := make([]int32, 64)
	for i := range toks {
		toks[i] = int32(i * 7)
	}
	want := runChain(&p, 4, toks, "", "")
	memo := NewMemo(1 << 20)
	for round := range 2 { // the second round reuses the remembered chain
		c := AcquireChain()
		c.Reset(&p, 4, toks, "", "")
		c.UseMemo(memo)
		if d := c.Digest(); d != [32]byte{} {
			t.Fatalf("round %d: digest before Next = %x", round, d)
		}
		for i := 0; ; i++ {
			if _, _, ok := c.Next(); !ok {
				break
			}
			if d := c.Digest(); d != want[i].digest {
				t.Fatalf("round %d block %d: digest %x, want %x", round, i, d, want[i].digest)
			}
		}
		ReleaseChain(c)
	}
	if hits, _ := memo.Stats(); hits == 0 {
		t.Fatal("the memo was never used; the test proves nothing about reuse")
	}
}
