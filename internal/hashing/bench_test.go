package hashing

import (
	"crypto/sha256"
	"hash"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/zeebo/xxh3"
)

// Benchmarks hash one 16-token block per op, so ns/op is ns/block and
// allocs/op is allocs/block (the chain is Reset every 64 blocks, which is
// how a query uses it; that cost is included). Each profile has a matching
// "floor" that runs crypto/sha256.Sum256 over exactly the bytes the chain
// hashes (see floor), so the overhead of encoding and chaining is the ratio
// of the two.

const (
	benchBlockSize = 16
	benchTokens    = 64 * benchBlockSize // one prompt: 64 blocks
	benchPrompts   = 64                  // distinct prompts cycled through
)

// benchPrompt is a deterministic prompt of ids drawn uniformly from a
// 152k vocabulary (Qwen-sized), so item widths vary as in real prompts.
func benchPrompt() []int32 { return benchPromptSet(1)[0] }

// benchPromptSet returns n distinct prompts. Benchmarks cycle through 64 of
// them (64 Ki tokens) so that branch predictors cannot learn the token
// sequence, which would flatter branchy encoders.
func benchPromptSet(n int) [][]int32 {
	r := rand.New(rand.NewPCG(1, 2))
	out := make([][]int32, n)
	for i := range out {
		out[i] = make([]int32, benchTokens)
		for j := range out[i] {
			out[i][j] = int32(r.IntN(151936))
		}
	}
	return out
}

var benchProfiles = []struct {
	name     string
	strategy string
	alg      string
	proj     string
}{
	{"sha256_cbor", "vllm_v1", "sha256_cbor", "low64_be"},
	{"sha256_pickle", "vllm_v1", "sha256", "low64_be"},
	{"xxhash_cbor", "vllm_v1", "xxhash_cbor", "low64_be"},
	{"xxhash_pickle", "vllm_v1", "xxhash", "low64_be"},
	{"sglang", "sglang", "sha256_raw", "first64_be"},
	{"sglang_bigram", "sglang_bigram", "sha256_raw", "first64_be"},
}

var sinkKey uint64

// floor is the cheapest way crypto/sha256 hashes one byte string repeatedly:
// a reused state (Reset, Write, Sum into a fixed array), which measures a few
// percent faster than sha256.Sum256 here. It is the bar the chain is held to.
// For the XXH3-128 algorithms the floor is xxh3.Hash128 of the same bytes.
type floor struct {
	h   hash.Hash
	dig [32]byte
	xxh bool
}

func newFloor(p *Profile) *floor { return &floor{h: sha256.New(), xxh: p.kind.xxh()} }

func (f *floor) sum(in []byte) uint64 {
	if f.xxh {
		return xxh3.Hash128(in).Lo
	}
	f.h.Reset()
	f.h.Write(in)
	f.h.Sum(f.dig[:0])
	return uint64(f.dig[0])
}

func BenchmarkChain(b *testing.B) {
	prompts := benchPromptSet(benchPrompts)
	seed := "0"
	for _, bp := range benchProfiles {
		p := mustResolve(b, bp.strategy, bp.alg, bp.proj, &seed)
		// A realistic LoRA name; it enters every vLLM block and is ignored
		// by SGLang.
		const lora = "adapter-A"

		b.Run(bp.name, func(b *testing.B) {
			c := AcquireChain()
			defer ReleaseChain(c)
			q := 0
			c.Reset(&p, benchBlockSize, prompts[q], lora, "")
			b.ReportAllocs()
			for b.Loop() {
				k, _, ok := c.Next()
				if !ok {
					q = (q + 1) % len(prompts)
					c.Reset(&p, benchBlockSize, prompts[q], lora, "")
					k, _, _ = c.Next()
				}
				sinkKey += k
			}
		})

		// The floor hashes the very byte strings the chain hashed.
		inputs := slices.Concat(benchInputs(&p, prompts, lora)...)
		b.Run(bp.name+"_floor", func(b *testing.B) {
			b.ReportAllocs()
			f := newFloor(&p)
			i := 0
			for b.Loop() {
				sinkKey += f.sum(inputs[i])
				if i++; i == len(inputs) {
					i = 0
				}
			}
		})
	}
}

// BenchmarkChainVsFloor alternates one query's worth of chain blocks (64)
// with the floor over the same bytes and times every round of each
// separately, so both see the same machine load. It reports the medians over
// rounds and their ratio, and the ratio of the fastest rounds; on a shared,
// noisy host these are much steadier than dividing two separate benchmark
// results.
func BenchmarkChainVsFloor(b *testing.B) {
	prompts := benchPromptSet(benchPrompts)
	seed := "0"
	const lora = "adapter-A"
	for _, bp := range benchProfiles {
		p := mustResolve(b, bp.strategy, bp.alg, bp.proj, &seed)
		perPrompt := benchInputs(&p, prompts, lora)
		b.Run(bp.name, func(b *testing.B) {
			c := AcquireChain()
			defer ReleaseChain(c)
			f := newFloor(&p)
			var rounds abRounds
			q := 0
			b.ReportAllocs()
			for b.Loop() {
				q = (q + 1) % len(prompts)
				inputs := perPrompt[q]
				t0 := time.Now()
				c.Reset(&p, benchBlockSize, prompts[q], lora, "")
				for {
					k, _, ok := c.Next()
					if !ok {
						break
					}
					sinkKey += k
				}
				t1 := time.Now()
				for _, in := range inputs {
					sinkKey += f.sum(in)
				}
				rounds.add(t1.Sub(t0), time.Since(t1))
			}
			rounds.report(b, len(perPrompt[0]), "chain", "floor")
		})
	}
}

// benchInputs returns, per prompt, the exact byte strings the chain hashes.
func benchInputs(p *Profile, prompts [][]int32, lora string) [][][]byte {
	out := make([][][]byte, len(prompts))
	for i, toks := range prompts {
		for _, g := range runChain(p, benchBlockSize, toks, lora, "") {
			out[i] = append(out[i], g.input)
		}
	}
	return out
}

// abRounds keeps paired per-round timings of two alternating variants.
type abRounds struct {
	a, b [8192]time.Duration
	n    int
}

func (r *abRounds) add(a, b time.Duration) {
	i := r.n % len(r.a)
	r.a[i], r.b[i] = a, b
	r.n++
}

// report publishes per-block medians, their ratio, and the ratio of the
// fastest rounds (the least disturbed by other load).
func (r *abRounds) report(b *testing.B, blocksPerRound int, nameA, nameB string) {
	n := min(r.n, len(r.a))
	if n == 0 {
		return
	}
	a, bb := slices.Clone(r.a[:n]), slices.Clone(r.b[:n])
	slices.Sort(a)
	slices.Sort(bb)
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(blocksPerRound) }
	b.ReportMetric(per(a[n/2]), nameA+"-ns/block")
	b.ReportMetric(per(bb[n/2]), nameB+"-ns/block")
	b.ReportMetric(float64(a[n/2])/float64(bb[n/2]), "ratio")
	b.ReportMetric(float64(a[0])/float64(bb[0]), "min-ratio")
}
