package hashing

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"strconv"
	"strings"
	"sync"
	"testing"
)

func allProfiles(t testing.TB, seed string) map[string]Profile {
	return map[string]Profile{
		"sha256_cbor":   mustResolve(t, "vllm_v1", "sha256_cbor", "low64_be", &seed),
		"sha256":        mustResolve(t, "vllm_v1", "sha256", "low64_be", &seed),
		"xxhash_cbor":   mustResolve(t, "vllm_v1", "xxhash_cbor", "low64_be", &seed),
		"xxhash":        mustResolve(t, "vllm_v1", "xxhash", "low64_be", &seed),
		"sglang":        mustResolve(t, "sglang", "sha256_raw", "first64_be", nil),
		"sglang_bigram": mustResolve(t, "sglang_bigram", "sha256_raw", "first64_be", nil),
	}
}

func seq(from, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(from + i)
	}
	return out
}

// The worked examples of docs/hashing.md (sections cbor-encoding,
// pickle-order and sglang-chain), as a direct
// check that does not depend on the vector files.
func TestSpecWorkedExamples(t *testing.T) {
	ps := allProfiles(t, "0")
	tests := []struct {
		profile    string
		bs         int
		toks       []int32
		lora, salt string
		keys       []uint64
		covered    []int
	}{
		{"sha256_cbor", 4, seq(1, 8), "", "", []uint64{2164874634404590027, 17270480062156288726}, []int{4, 4}},
		{"sha256_cbor", 4, seq(1, 8), "adapter-A", "tenant-salt", []uint64{17539136676481425472, 3818960430654273638}, []int{4, 4}},
		{"sha256", 4, seq(1, 8), "", "", []uint64{10362225831949560093, 12472515041799373675}, []int{4, 4}},
		{"sha256", 4, seq(1, 8), "adapter-A", "tenant-salt", []uint64{602575766154556200, 9046429590014662168}, []int{4, 4}},
		{"sha256", 4, seq(1, 8), "a", "a", []uint64{4614898502418698770, 18283503962791162323}, []int{4, 4}},
		{"sglang", 4, seq(1, 4), "", "", []uint64{14958615928728313947}, []int{4}},
		{"sglang", 4, seq(1, 4), "", "salty", []uint64{15676874802538137821}, []int{4}},
		{"sglang", 4, seq(1, 4), "any-lora", "salty", []uint64{15676874802538137821}, []int{4}},
		{"sglang", 2, seq(1, 3), "", "", []uint64{3817746824117602890, 4235023376947744322}, []int{2, 1}},
		{"sglang_bigram", 4, []int32{10, 20, 30, 40}, "", "", []uint64{15710792592378487421}, []int{3}},
		{"sglang", 4, []int32{11, 12, 13, 14, 21, 22, 23, 24, 31, 32, 33, 34, 41, 42, 43, 44}, "", "",
			[]uint64{0xf67c5ff154ee4961, 0xe1c873d83402d824, 0x71749b3c9f3e04bf, 0x921bc52e4f7533bb}, []int{4, 4, 4, 4}},
		{"xxhash_cbor", 16, seq(1, 32), "", "", []uint64{882618318818381833, 12890060145260523405}, []int{16, 16}},
		{"xxhash", 16, seq(1, 32), "", "", []uint64{11844795890135418255, 14253768906014549686}, []int{16, 16}},
		{"xxhash_cbor", 16, seq(1, 32), "adapter-A", "tenant-salt", []uint64{9109333782270447144, 17312180953328720644}, []int{16, 16}},
	}
	for i, tt := range tests {
		t.Run(strconv.Itoa(i)+"/"+tt.profile, func(t *testing.T) {
			p := ps[tt.profile]
			got := runChain(&p, tt.bs, tt.toks, tt.lora, tt.salt)
			if len(got) != len(tt.keys) {
				t.Fatalf("%d blocks, want %d", len(got), len(tt.keys))
			}
			for j, g := range got {
				if g.key != tt.keys[j] || g.covered != tt.covered[j] {
					t.Errorf("block %d = (%d, %d), want (%d, %d)", j, g.key, g.covered, tt.keys[j], tt.covered[j])
				}
			}
		})
	}
}

// Pickle layouts (docs/hashing.md#pickle-order) that the vectors give only as
// lengths.
func TestPickleFrameExamples(t *testing.T) {
	p := allProfiles(t, "0")["sha256"]
	rep := func(v int32, n int) []int32 {
		out := make([]int32, n)
		for i := range out {
			out[i] = v
		}
		return out
	}
	g := runChain(&p, 13099, rep(2147483647, 13099), "", "")
	if len(g) != 1 || len(g[0].input) != 65548 || !bytes.HasPrefix(g[0].input, []byte{0x80, 5, 0x95, 1, 0, 1, 0, 0, 0, 0, 0}) {
		t.Errorf("B=13099: want one 65537-byte frame, total 65548; got %d bytes % x", len(g[0].input), g[0].input[:11])
	}
	g = runChain(&p, 13100, rep(2147483647, 13100), "", "")
	tail, _ := hex.DecodeString("950400000000000000" + "4e87942e")
	if len(g) != 1 || len(g[0].input) != 65562 || !bytes.HasSuffix(g[0].input, tail) {
		t.Errorf("B=13100: want a second 4-byte frame, total 65562; got %d bytes", len(g[0].input))
	}
	g = runChain(&p, 4, seq(1, 4), strings.Repeat("a", 65536), "")
	in := g[0].input
	want := []byte{0x80, 5, 0x95, 0x2e, 0, 0, 0, 0, 0, 0, 0}
	mid, _ := hex.DecodeString("7494" + "5800000100")
	end, _ := hex.DecodeString("950600000000000000" + "94859487942e")
	if len(in) != 65613 || !bytes.HasPrefix(in, want) || !bytes.Equal(in[11+46-2:11+46+5], mid) || !bytes.HasSuffix(in, end) {
		t.Errorf("large LoRA payload layout wrong (len %d)", len(in))
	}
	// Two payloads of 64 KiB leave a 1-byte frame (the LoRA's MEMOIZE)
	// between them, which CPython writes without a FRAME header.
	big := strings.Repeat("x", 65536)
	g = runChain(&p, 4, seq(1, 4), big, big+"y")
	in = g[0].input
	i := bytes.Index(in, []byte(big))
	j := i + len(big)
	if i < 0 || !bytes.Equal(in[j:j+6], []byte{0x94, 0x58, 1, 0, 1, 0}) {
		t.Errorf("headerless 1-byte frame between payloads missing: % x", in[j:j+6])
	}
	compareRef(t, refChain(p, 4, seq(1, 4), big, big+"y"), g)
}

func TestChainEdges(t *testing.T) {
	ps := allProfiles(t, "0")
	toks := seq(1, 10)
	cases := []struct {
		name    string
		p       *Profile
		bs      int
		toks    []int32
		blocks  int
		covered int
	}{
		{"nil profile", nil, 4, toks, 0, 0},
		{"zero profile", &Profile{}, 4, toks, 0, 0},
		{"zero block size", ptr(ps["sha256"]), 0, toks, 0, 0},
		{"negative block size", ptr(ps["sglang"]), -4, toks, 0, 0},
		{"vllm drops tail", ptr(ps["sha256_cbor"]), 4, toks, 2, 8},
		{"vllm short", ptr(ps["sha256"]), 11, toks, 0, 0},
		{"vllm empty", ptr(ps["sha256"]), 1, nil, 0, 0},
		{"sglang hashes tail", ptr(ps["sglang"]), 4, toks, 3, 10},
		{"sglang huge block", ptr(ps["sglang"]), 1 << 40, toks, 1, 10},
		{"sglang empty", ptr(ps["sglang"]), 4, nil, 0, 0},
		{"sglang negative id", ptr(ps["sglang"]), 4, []int32{1, 2, 3, 4, 5, -1}, 0, 0},
		{"bigram", ptr(ps["sglang_bigram"]), 4, toks, 3, 9},
		{"bigram one token", ptr(ps["sglang_bigram"]), 4, []int32{7}, 0, 0},
		{"bigram two tokens", ptr(ps["sglang_bigram"]), 4, []int32{7, 8}, 1, 1},
		{"bigram exact pages", ptr(ps["sglang_bigram"]), 3, seq(0, 7), 2, 6},
		{"bigram negative id", ptr(ps["sglang_bigram"]), 4, []int32{-5, 1, 2}, 0, 0},
		{"vllm negative ids hash", ptr(ps["sha256"]), 2, []int32{-1, -2147483648}, 1, 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := AcquireChain()
			defer ReleaseChain(c)
			c.Reset(tc.p, tc.bs, tc.toks, "lora", "salt")
			n, sum := 0, 0
			for {
				_, cov, ok := c.Next()
				if !ok {
					break
				}
				n++
				sum += cov
			}
			if n != tc.blocks || sum != tc.covered {
				t.Errorf("blocks %d covered %d, want %d %d", n, sum, tc.blocks, tc.covered)
			}
			for range 3 {
				if k, cov, ok := c.Next(); ok || k != 0 || cov != 0 {
					t.Fatal("Next after the end returned a block")
				}
			}
		})
	}
}

func ptr(p Profile) *Profile { return &p }

// The chain is lazy: asking for k blocks hashes exactly k, and the values
// are the eager ones whatever the stopping point.
func TestChainLazyPrefix(t *testing.T) {
	for name, p := range allProfiles(t, "42") {
		t.Run(name, func(t *testing.T) {
			toks := seq(100, 70)
			want := refChain(p, 8, toks, "L", "S")
			c := AcquireChain()
			defer ReleaseChain(c)
			for k := 0; k <= len(want); k++ {
				c.Reset(&p, 8, toks, "L", "S")
				for i := 0; i < k; i++ {
					key, cov, ok := c.Next()
					if !ok || key != want[i].key || cov != want[i].covered {
						t.Fatalf("prefix %d block %d differs", k, i)
					}
				}
				if c.block != k {
					t.Fatalf("hashed %d blocks for a prefix of %d", c.block, k)
				}
			}
		})
	}
}

// docs/hashing.md#blocks-and-extra-keys: (lora="", salt="x") and (lora="x", no
// salt) share block 0 and differ from block 1 on (vLLM issue #44701); the salt
// changes every later block.
func TestVLLMExtraKeys(t *testing.T) {
	for _, alg := range []string{"sha256", "sha256_cbor", "xxhash", "xxhash_cbor"} {
		p := allProfiles(t, "0")[alg]
		toks := seq(1, 12)
		a := runChain(&p, 4, toks, "", "x")
		b := runChain(&p, 4, toks, "x", "")
		none := runChain(&p, 4, toks, "", "")
		if a[0].key != b[0].key {
			t.Errorf("%s: block 0 differs between salt-only and LoRA-only", alg)
		}
		if a[1].key == b[1].key || a[2].key == none[2].key {
			t.Errorf("%s: salt did not propagate through the chain", alg)
		}
		// Empty strings are absent.
		e := runChain(&p, 4, toks, "", "")
		for i := range e {
			if e[i].key != none[i].key {
				t.Errorf("%s: empty salt/LoRA changed block %d", alg, i)
			}
		}
	}
}

func TestSGLangSaltAndLoRA(t *testing.T) {
	ps := allProfiles(t, "0")
	for _, name := range []string{"sglang", "sglang_bigram"} {
		p := ps[name]
		toks := seq(5, 20)
		base := runChain(&p, 4, toks, "", "")
		lora := runChain(&p, 4, toks, "adapter", "")
		salted := runChain(&p, 4, toks, "", "s")
		for i := range base {
			if base[i].key != lora[i].key {
				t.Errorf("%s: LoRA entered block %d", name, i)
			}
			if base[i].key == salted[i].key {
				t.Errorf("%s: salt did not change block %d", name, i)
			}
		}
		// The all-zero root sentinel is never hashed: block 0 of an
		// unsalted chain has no prior at all.
		if bytes.HasPrefix(base[0].input, make([]byte, 32)) {
			t.Errorf("%s: unsalted page 0 starts with 32 zero bytes", name)
		}
	}
}

func TestChainAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation counts")
	}
	toks := benchPrompt()
	for name, p := range allProfiles(t, "0") {
		t.Run(name, func(t *testing.T) {
			c := AcquireChain()
			defer ReleaseChain(c)
			c.Reset(&p, 16, toks, "adapter-A", "tenant")
			for c.pos < c.limit { // warm-up: buffers reach their size
				c.Next()
			}
			allocs := testing.AllocsPerRun(20, func() {
				c.Reset(&p, 16, toks, "adapter-A", "tenant")
				for {
					if _, _, ok := c.Next(); !ok {
						break
					}
				}
			})
			if allocs != 0 {
				t.Errorf("%v allocations per query after warm-up, want 0", allocs)
			}
		})
	}
}

func TestChainPoolConcurrent(t *testing.T) {
	ps := allProfiles(t, "7")
	toks := benchPrompt()[:200]
	want := map[string][]refBlock{}
	for name, p := range ps {
		want[name] = refChain(p, 16, toks, "L", "S")
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				for name, p := range ps {
					c := AcquireChain()
					c.Reset(&p, 16, toks, "L", "S")
					stop := (g + i) % (len(want[name]) + 1)
					for j := 0; j < stop; j++ {
						k, _, ok := c.Next()
						if !ok || k != want[name][j].key {
							t.Errorf("%s: goroutine %d block %d differs", name, g, j)
							return
						}
					}
					ReleaseChain(c)
				}
			}
		}()
	}
	wg.Wait()
	ReleaseChain(nil)
}

// fuzzTokens turns fuzz bytes into int32 ids spread over every encoding
// width: each 4-byte word is arithmetically shifted right by its own low 5
// bits, so small, medium, huge and negative ids all occur.
func fuzzTokens(data []byte, total int) []int32 {
	var pat []int32
	for len(data) >= 4 {
		v := binary.LittleEndian.Uint32(data)
		pat = append(pat, int32(v)>>(v&31))
		data = data[4:]
	}
	if len(pat) == 0 {
		pat = []int32{0}
	}
	if total < len(pat) {
		return pat
	}
	out := make([]int32, total)
	for i := range out {
		out[i] = pat[i%len(pat)]
	}
	return out
}

// FuzzChainMatchesReference drives the lazy chain, for every profile,
// against the eager reference encoders above: same input bytes, digests,
// keys and covered counts for every block. For pickle it also checks that
// the single-frame fast path, whenever it claims a block, emits exactly what
// the general framer does. Sizes reach past the 64 KiB frame target through
// long LoRA/salt strings, long seeds and large blocks.
func FuzzChainMatchesReference(f *testing.F) {
	f.Add(uint8(0), uint32(0), uint16(0), uint16(4), []byte("\x01\x00\x00\x00\x02\x00\x00\x00"), uint16(8), "adapter-A", "tenant-salt", uint8(0), uint8(0))
	f.Add(uint8(1), uint32(42), uint16(1), uint16(3), []byte("\xff\xff\xff\xff\x00\x01\x00\x00"), uint16(0), "a", "a", uint8(0), uint8(0))
	f.Add(uint8(1), uint32(0), uint16(0), uint16(2), []byte("é\x00\x00\x00"), uint16(6), "é", "é", uint8(0), uint8(0))
	f.Add(uint8(1), uint32(7), uint16(0), uint16(13100), []byte("\xff\xff\xff\x7f"), uint16(13100), "", "", uint8(0), uint8(0))
	f.Add(uint8(1), uint32(7), uint16(0), uint16(4), []byte("\x05\x00\x00\x00"), uint16(9), "ab", "ab", uint8(3), uint8(2))
	f.Add(uint8(0), uint32(4294967295), uint16(3), uint16(16), []byte("\x10\x00\x01\x00"), uint16(40), "L", "", uint8(1), uint8(0))
	f.Add(uint8(1), uint32(1), uint16(40000), uint16(1), []byte("\x17\x00\x00\x00"), uint16(3), "", "s", uint8(0), uint8(1))
	f.Add(uint8(2), uint32(0), uint16(0), uint16(4), []byte("\x0a\x00\x00\x00\x14\x00\x00\x00"), uint16(11), "", "salty", uint8(0), uint8(0))
	f.Add(uint8(3), uint32(0), uint16(0), uint16(4), []byte("\x0a\x00\x00\x00\x14\x00\x00\x00"), uint16(11), "", "", uint8(0), uint8(0))
	f.Add(uint8(6), uint32(0), uint16(0), uint16(5), []byte("\x0a\x00\x00\x80"), uint16(20), "x", "y", uint8(0), uint8(0))
	f.Add(uint8(5), uint32(0), uint16(0), uint16(64), []byte{}, uint16(0), "", "", uint8(0), uint8(0))
	f.Add(uint8(8), uint32(0), uint16(0), uint16(16), []byte("\x01\x00\x00\x00"), uint16(48), "adapter-A", "tenant-salt", uint8(0), uint8(0))
	f.Add(uint8(9), uint32(42), uint16(0), uint16(4), []byte("\xff\xff\xff\xff\x00\x01\x00\x00"), uint16(12), "a", "a", uint8(0), uint8(0))
	f.Add(uint8(13), uint32(0), uint16(0), uint16(13100), []byte("\xff\xff\xff\x7f"), uint16(13100), "", "", uint8(0), uint8(0))
	f.Add(uint8(16), uint32(0), uint16(0), uint16(16), []byte("\x01\x00\x00\x00"), uint16(32), "", "", uint8(0), uint8(0))
	f.Add(uint8(17), uint32(0), uint16(0), uint16(16), []byte("\x01\x00\x00\x00"), uint16(32), "L", "s", uint8(1), uint8(0))
	f.Fuzz(func(t *testing.T, sel uint8, seedNum uint32, seedZeros uint16, bs uint16, tokData []byte, total uint16, lora, salt string, loraBig, saltBig uint8) {
		// Mode bit 2 selects the literal "random" seed, bit 3 the XXH3-128
		// algorithms for vLLM, bit 4 the seed of an engine without
		// PYTHONHASHSEED (SHA-256 only).
		seed := strconv.FormatUint(uint64(seedNum), 10)
		switch {
		case sel&4 != 0:
			seed = "random"
		case sel&16 != 0 && sel&8 == 0:
			seed = SeedVLLMNoneHash
		case seedZeros > 0:
			seed = strings.Repeat("0", int(seedZeros)%70000) + seed
		}
		cborAlg, pickleAlg := "sha256_cbor", "sha256"
		if sel&8 != 0 {
			cborAlg, pickleAlg = "xxhash_cbor", "xxhash"
		}
		specs := []Spec{
			{"vllm_v1", cborAlg, "low64_be", &seed, nil},
			{"vllm_v1", pickleAlg, "low64_be", &seed, nil},
			{"sglang", "sha256_raw", "first64_be", nil, nil},
			{"sglang_bigram", "sha256_raw", "first64_be", nil, nil},
		}
		p, err := Resolve(specs[sel%4])
		if err != nil {
			t.Fatal(err)
		}
		if p.kind.vllm() {
			if want := refRoot(p.Algorithm, seed); p.RootDigest != want {
				t.Fatalf("root for seed of %d bytes: %x, reference %x", len(seed), p.RootDigest, want)
			}
		}
		// Long names straddle the 64 KiB payload threshold.
		grow := func(s string, big uint8) string {
			if big == 0 {
				return s
			}
			if s == "" {
				s = "z"
			}
			target := 65536 - 2 + int(big%5) // 65534 … 65538 bytes
			if big >= 128 {
				target = 65536*2 + int(big)
			}
			return strings.Repeat(s, target/len(s)+1)[:target]
		}
		lora, salt = grow(lora, loraBig), grow(salt, saltBig)
		toks := fuzzTokens(tokData, int(total))
		block := int(bs)
		got := runChain(&p, block, toks, lora, salt)
		compareRef(t, refChain(p, block, toks, lora, salt), got)

		if p.kind != kindVLLMPickle && p.kind != kindVLLMXXHPickle {
			return
		}
		// Fast path vs general framer, block by block.
		parent := p.RootDigest
		n := p.DigestLen()
		for i := 0; block > 0 && (i+1)*block <= len(toks); i++ {
			s := salt
			if i > 0 {
				s = ""
			}
			part := toks[i*block : (i+1)*block]
			general := encodePickleBlockGeneral(nil, parent[32-n:], part, lora, s)
			var fast []byte
			ok := false
			if len(lora) < frameTarget && len(s) < frameTarget {
				fast, ok = encodePickleBlockFast(nil, parent[32-n:], part, appendPickleTail(nil, lora, s))
			}
			if ok && !bytes.Equal(fast, general) {
				t.Fatalf("block %d: fast path differs from general framer", i)
			}
			// The fast path must take every block that is one frame of at
			// most 64 KiB without large payloads (it may decline others).
			small := len(lora) < frameTarget && len(s) < frameTarget
			if !ok && small && fitsOneFrame(general) && len(general)-11 <= frameTarget {
				t.Fatalf("block %d: fast path declined a %d-byte single-frame block", i, len(general))
			}
			parent = got[i].digest
		}
	})
}

// fitsOneFrame reports whether a pickle is PROTO, one FRAME and nothing else.
func fitsOneFrame(b []byte) bool {
	return len(b) >= 11 && b[2] == opFrame && binary.LittleEndian.Uint64(b[3:]) == uint64(len(b)-11)
}
