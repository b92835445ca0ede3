package hashing

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func stdProfile(t *testing.T, seed *string) Profile {
	t.Helper()
	p, err := Resolve(Spec{Strategy: StrategyRFC1527, Algorithm: AlgorithmXXH3_64, Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func chainKeys(p *Profile, bs int, toks []int32, salt string) []uint64 {
	c := AcquireChain()
	defer ReleaseChain(c)
	c.Reset(p, bs, toks, "", salt)
	var out []uint64
	for {
		k, cov, ok := c.Next()
		if !ok {
			return out
		}
		if cov != bs {
			panic("partial block")
		}
		out = append(out, k)
	}
}

// stdKeysWithMM is the standard chain with multimodal hashes in every block
// (sorted as the rule says), computed with the exported pieces ingest uses.
func stdKeysWithMM(seed uint64, bs int, toks []int32, mm []uint64) []uint64 {
	var out []uint64
	var prev uint64
	var buf []byte
	for i := 0; i+bs <= len(toks); i += bs {
		var l uint64
		l, buf = StdLocal(seed, toks[i:i+bs], SortedMM(mm), buf)
		if i > 0 {
			l = StdNext(seed, prev, l)
		}
		out = append(out, l)
		prev = l
	}
	return out
}

// TestRFC1527Vectors pins the spec's vectors (docs/hashing.md#standard-hash-rfc1527).
func TestRFC1527Vectors(t *testing.T) {
	zero := "0"
	def := stdProfile(t, nil)
	explicit := stdProfile(t, strp("1337"))
	if def != explicit {
		t.Fatalf("default seed profile %+v differs from seed 1337's %+v", def, explicit)
	}
	sevens := make([]int32, 16)
	for i := range sevens {
		sevens[i] = 7
	}
	for _, tc := range []struct {
		name string
		got  []uint64
		want []uint64
	}{
		{"1..32 seed 1337", chainKeys(&def, 16, seq(1, 32), ""), []uint64{16863443419780771464, 12466389667045779788}},
		{"1..64 seed 1337", chainKeys(&def, 16, seq(1, 64), ""), []uint64{16863443419780771464, 12466389667045779788, 960926348267535642, 4923844688253642376}},
		{"1..32 seed 0", chainKeys(ptr(stdProfile(t, &zero)), 16, seq(1, 32), ""), []uint64{15195734001507359261, 18166693838618995723}},
		{"partial tail ignored", chainKeys(&def, 16, seq(1, 47), ""), []uint64{16863443419780771464, 12466389667045779788}},
		{"sevens with mm {5,3}", stdKeysWithMM(1337, 16, sevens, []uint64{5, 3}), []uint64{14217333024976704104}},
		{"exported pieces = chain", stdKeysWithMM(1337, 16, seq(1, 64), nil), chainKeys(&def, 16, seq(1, 64), "")},
		{"salted query matches nothing", chainKeys(&def, 16, seq(1, 32), "s"), nil},
	} {
		if d := cmp.Diff(tc.want, tc.got); d != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, d)
		}
	}
}

// TestXXH3Reference checks the library against values of the C reference
// (libxxhash 0.8.1, XXH3_64bits_withSeed) over every XXH3 input-length
// class, including the long (> 240 bytes) path block sizes ≥ 61 reach.
func TestXXH3Reference(t *testing.T) {
	for _, v := range []struct {
		n    int
		seed uint64
		want uint64
	}{
		{1, 0, 6753703240600791563}, {1, 1337, 14936884975182126816}, {1, 18446744073709551615, 16247677805084210445},
		{4, 0, 9454816544954774652}, {4, 1337, 326329080087109040}, {4, 18446744073709551615, 5035185074825849877},
		{16, 0, 6087741233356089178}, {16, 1337, 6152159304834765799}, {16, 18446744073709551615, 5095279643507643589},
		{60, 0, 15781239683367900957}, {60, 1337, 18317217944719407659}, {60, 18446744073709551615, 4745662142817895191},
		{61, 0, 4569740439477013129}, {61, 1337, 5505848820997674616}, {61, 18446744073709551615, 12330882711205837218},
		{64, 0, 17173056362293529715}, {64, 1337, 14346105222872629547}, {64, 18446744073709551615, 17153439304786216133},
		{128, 0, 1941665075392644251}, {128, 1337, 14659660805502346787}, {128, 18446744073709551615, 3402520808286434329},
		{1024, 0, 16332494348801687135}, {1024, 1337, 9035317444157211932}, {1024, 18446744073709551615, 7683103323139226668},
	} {
		toks := make([]int32, v.n)
		for i := range toks {
			toks[i] = int32(uint32(uint64(i+1) * 2654435761))
		}
		if got, _ := StdLocal(v.seed, toks, nil, nil); got != v.want {
			t.Errorf("%d tokens, seed %d: got %d, want %d", v.n, v.seed, got, v.want)
		}
	}
}

func TestRFC1527Resolve(t *testing.T) {
	for _, tc := range []struct {
		name   string
		spec   Spec
		member string
	}{
		{"algorithm", Spec{Strategy: "rfc1527", Algorithm: "xxh3"}, "algorithm"},
		{"algorithm case", Spec{Strategy: "rfc1527", Algorithm: "XXH3_64"}, "algorithm"},
		{"projection", Spec{Strategy: "rfc1527", Algorithm: "xxh3_64", IndexProjection: "low64_be"}, "index_projection"},
		{"python seed", Spec{Strategy: "rfc1527", Algorithm: "xxh3_64", PythonHashSeed: strp("0")}, "python_hash_seed"},
		{"seed empty", Spec{Strategy: "rfc1527", Algorithm: "xxh3_64", Seed: strp("")}, "seed"},
		{"seed sign", Spec{Strategy: "rfc1527", Algorithm: "xxh3_64", Seed: strp("-1")}, "seed"},
		{"seed hex", Spec{Strategy: "rfc1527", Algorithm: "xxh3_64", Seed: strp("0x10")}, "seed"},
		{"seed overflow", Spec{Strategy: "rfc1527", Algorithm: "xxh3_64", Seed: strp("18446744073709551616")}, "seed"},
		{"seed on vllm", Spec{Strategy: "vllm_v1", Algorithm: "sha256", IndexProjection: "low64_be", PythonHashSeed: strp("0"), Seed: strp("1")}, "seed"},
		{"seed on sglang", Spec{Strategy: "sglang", Algorithm: "sha256_raw", IndexProjection: "first64_be", Seed: strp("1")}, "seed"},
	} {
		_, err := Resolve(tc.spec)
		var pe *ProfileError
		if !errors.As(err, &pe) || pe.Member != tc.member {
			t.Errorf("%s: got %v, want a ProfileError on %s", tc.name, err, tc.member)
		}
	}
	p := stdProfile(t, strp("18446744073709551615"))
	if p.StdSeed() != 1<<64-1 || p.Seed != "18446744073709551615" || !p.IsStandard() || p.Projection() != Native {
		t.Errorf("max seed profile: %+v", p)
	}
	if a, b := stdProfile(t, strp("7")), stdProfile(t, strp("007")); a == b {
		t.Errorf("seed texts 7 and 007 resolve to equal profiles; the text is kept as sent")
	}
}

func TestNativeWireForms(t *testing.T) {
	if k, err := KeyFromUint(Native, 1<<64-1); err != nil || k != 1<<64-1 {
		t.Errorf("uint: %d %v", k, err)
	}
	if _, err := KeyFromInt(Native, -1); err == nil {
		t.Errorf("negative int accepted")
	}
	if k, err := KeyFromBytes(Native, []byte{1, 2, 3, 4, 5, 6, 7, 8}); err != nil || k != 0x0102030405060708 {
		t.Errorf("bytes: %x %v", k, err)
	}
	if _, err := KeyFromBytes(Native, make([]byte, 32)); err == nil {
		t.Errorf("32-byte digest accepted as an rfc1527 key")
	}
}

// TestRFC1527Batches: the keys hashed ahead (Ready, TakeReady) and those
// hashed one by one (Next) interleave into the eager chain.
func TestRFC1527Batches(t *testing.T) {
	p := stdProfile(t, nil)
	toks := seq(1, 16*3000)
	want := chainKeys(&p, 16, toks, "")
	for _, step := range []int{1, 7, 33, 500} {
		c := AcquireChain()
		c.Reset(&p, 16, toks, "", "")
		var got []uint64
		for i := 0; ; i++ {
			if i%3 == 0 {
				if k, _, ok := c.Next(); ok {
					got = append(got, k)
					continue
				}
				break
			}
			n := c.Ready()
			if n == 0 {
				if _, _, ok := c.Next(); ok {
					t.Fatal("Ready said 0 with blocks left")
				}
				break
			}
			got, _, _ = c.TakeReady(min(n, step), got, nil, nil)
		}
		ReleaseChain(c)
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("step %d (-want +got):\n%s", step, d)
		}
	}
}

// BenchmarkChainStandard is BenchmarkChain's measure (ns/op = ns/block of
// 16 tokens) for the standard hash, one block at a time (Next) and in the
// batches a query's walk takes (Ready/TakeReady), with the SHA-256 chain
// (sha256_cbor) interleaved in the same run for comparison.
func BenchmarkChainStandard(b *testing.B) {
	prompts := benchPromptSet(benchPrompts)
	seed := "0"
	cbor := mustResolve(b, "vllm_v1", "sha256_cbor", "low64_be", &seed)
	std, err := Resolve(Spec{Strategy: StrategyRFC1527, Algorithm: AlgorithmXXH3_64})
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name  string
		p     *Profile
		batch bool
	}{{"sha256_cbor", &cbor, false}, {"rfc1527_next", &std, false}, {"rfc1527_batch", &std, true}} {
		b.Run(bc.name, func(b *testing.B) {
			c := AcquireChain()
			defer ReleaseChain(c)
			q, at := 0, 0
			c.Reset(bc.p, benchBlockSize, prompts[q], "", "")
			keys := make([]uint64, 0, 1024)
			covs, hints := make([]int, 0, 1024), make([]uint32, 0, 1024)
			b.ReportAllocs()
			for b.Loop() {
				if bc.batch {
					if len(keys) == 0 {
						if c.Ready() == 0 {
							q = (q + 1) % len(prompts)
							c.Reset(bc.p, benchBlockSize, prompts[q], "", "")
							c.Ready()
						}
						keys, covs, hints = c.TakeReady(1024, keys[:0], covs[:0], hints[:0])
						at = 0
					}
					sinkKey += keys[at]
					if at++; at == len(keys) {
						keys = keys[:0]
					}
					continue
				}
				k, _, ok := c.Next()
				if !ok {
					q = (q + 1) % len(prompts)
					c.Reset(bc.p, benchBlockSize, prompts[q], "", "")
					k, _, _ = c.Next()
				}
				sinkKey += k
			}
		})
	}
}
