package hashing

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"unsafe"

	"pgregory.net/rapid"

	"github.com/mooncake-conductor-go/conductor/internal/memostore"
)

type keyCov struct {
	key uint64
	cov int
}

func keysOf(p *Profile, bs int, toks []int32, lora, salt string, m *Memo) []keyCov {
	return keysOfKept(p, bs, toks, lora, salt, m, false)
}

// keysOfKept is keysOf with Chain.KeepTokens when keep is set; toks must
// then never be modified again.
func keysOfKept(p *Profile, bs int, toks []int32, lora, salt string, m *Memo, keep bool) []keyCov {
	c := AcquireChain()
	defer ReleaseChain(c)
	c.Reset(p, bs, toks, lora, salt)
	if keep {
		c.KeepTokens()
	}
	c.UseMemo(m)
	var out []keyCov
	for {
		k, cov, ok := c.Next()
		if !ok {
			return out
		}
		out = append(out, keyCov{k, cov})
	}
}

// TestMemoAnswersAreIdentical: random queries drawn from a few shared
// prefixes, across every profile, tenants' salts and LoRA names, give the
// same keys with and without one shared, deliberately small memo (so it
// wraps and evicts), and the memo does get hits.
func TestMemoAnswersAreIdentical(t *testing.T) {
	profiles := allProfiles(t, "42")
	names := make([]string, 0, len(profiles))
	for n := range profiles {
		names = append(names, n)
	}
	memo := NewMemo(64 << 10)
	rapid.Check(t, func(rt *rapid.T) {
		name := rapid.SampledFrom(names).Draw(rt, "profile")
		p := profiles[name]
		bs := rapid.SampledFrom([]int{1, 2, 4, 16}).Draw(rt, "bs")
		prefix := rapid.IntRange(0, 3).Draw(rt, "prefix")
		n := rapid.IntRange(0, 80).Draw(rt, "n")
		toks := make([]int32, n)
		r := rand.New(rand.NewPCG(uint64(prefix), 7))
		for i := range toks {
			toks[i] = int32(r.IntN(300))
		}
		if n > 0 && rapid.Bool().Draw(rt, "diverge") {
			toks[rapid.IntRange(0, n-1).Draw(rt, "at")] = rapid.Int32Range(-5, 1<<20).Draw(rt, "tok")
		}
		lora := rapid.SampledFrom([]string{"", "a", "ä", "adapter-1", string(make([]byte, 300))}).Draw(rt, "lora")
		salt := rapid.SampledFrom([]string{"", "a", "tenant-1", "tenant-2", string(make([]byte, 2000))}).Draw(rt, "salt")
		want := keysOf(&p, bs, toks, lora, salt, nil)
		got := keysOfKept(&p, bs, toks, lora, salt, memo, rapid.Bool().Draw(rt, "keep"))
		if fmt.Sprint(want) != fmt.Sprint(got) {
			rt.Fatalf("%s bs=%d lora=%q salt=%q: memo %v, plain %v", name, bs, lora, salt, got, want)
		}
	})
	// And a repeated query is answered from the memo.
	p := profiles["sha256_cbor"]
	toks := seq(5, 64)
	first := keysOf(&p, 16, toks, "", "salt", memo)
	before, _ := memo.Stats()
	again := keysOf(&p, 16, toks, "", "salt", memo)
	if after, _ := memo.Stats(); after-before != uint64(len(again)) || fmt.Sprint(first) != fmt.Sprint(again) {
		t.Errorf("repeated query: %d hits for %d blocks", after-before, len(again))
	}
}

// TestMemoConcurrent shares one memo between goroutines under -race, one
// of them resetting it now and then (what dropping the last context does
// while queries may still run): every answer stays exact.
func TestMemoConcurrent(t *testing.T) {
	p := allProfiles(t, "0")["sha256_cbor"]
	memo := NewMemo(1 << 16)
	toks := make([]int32, 256)
	for i := range toks {
		toks[i] = int32(i)
	}
	want := keysOf(&p, 16, toks, "", "", nil)
	if len(want) != 16 {
		t.Fatalf("%d blocks", len(want))
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
				memo.Reset()
				runtime.Gosched()
			}
		}
	}()
	var queries sync.WaitGroup
	for g := 0; g < 4; g++ {
		queries.Add(1)
		go func(g int) {
			defer queries.Done()
			for i := 0; i < 200; i++ {
				salt := ""
				if i%3 == 0 {
					salt = fmt.Sprint("s", g, i) // fills and wraps the ring
				}
				got := keysOf(&p, 16, toks, "", salt, memo)
				if salt == "" && fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("goroutine %d: keys differ with a shared memo", g)
					return
				}
			}
		}(g)
	}
	queries.Wait()
	close(stop)
	wg.Wait()
}

func TestNilMemo(t *testing.T) {
	if NewMemo(0) != nil {
		t.Fatal("NewMemo(0) should disable memoization")
	}
	var m *Memo
	if h, mi := m.Stats(); h != 0 || mi != 0 {
		t.Fatal("nil memo stats")
	}
}

// BenchmarkWarmChain compares a fully warm 8K-token vLLM query with and
// without the memo (the cold cost is the "without" line plus one insert per
// block).
func BenchmarkWarmChain(b *testing.B) {
	p := allProfiles(b, "0")["sha256_cbor"]
	toks := make([]int32, 8192)
	for i := range toks {
		toks[i] = int32(i * 7919 % 150000)
	}
	for _, withMemo := range []bool{false, true} {
		b.Run(fmt.Sprintf("memo=%v", withMemo), func(b *testing.B) {
			var m *Memo
			if withMemo {
				m = NewMemo(64 << 20)
				keysOf(&p, 16, toks, "", "", m)
			}
			c := AcquireChain()
			b.ReportAllocs()
			for b.Loop() {
				c.Reset(&p, 16, toks, "", "")
				c.UseMemo(m)
				for {
					if _, _, ok := c.Next(); !ok {
						break
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/512, "ns/block")
		})
	}
}

// TestMemoBudget fills a memo with many distinct chains: it stays within
// its byte budget and the newest chain is still answered.
func TestMemoBudget(t *testing.T) {
	p := allProfiles(t, "0")["sha256_cbor"]
	m := NewMemo(1 << 20)
	var last []int32
	for i := 0; i < 3000; i++ {
		toks := seq(i*1000, 128)
		keysOf(&p, 16, toks, "", "", m)
		last = toks
	}
	// The store checks its own shards (memostore); here, the whole memo
	// stays within its budget plus the entry being inserted.
	if got, limit := m.Bytes(), memostore.MinBytes+entryOverhead+4*128+32*8+16*4; got > limit {
		t.Errorf("memo holds %d bytes, limit %d", got, limit)
	}
	before, _ := m.Stats()
	keysOf(&p, 16, last, "", "", m)
	if after, _ := m.Stats(); after-before != 8 {
		t.Errorf("newest chain: %d of 8 blocks reused", after-before)
	}
	// A prompt far longer than a 64th of the budget is remembered too.
	long := seq(7, 100_000)
	keysOf(&p, 16, long, "", "", m)
	h0, _ := m.Stats()
	keysOf(&p, 16, long, "", "", m)
	if h1, _ := m.Stats(); h1-h0 != uint64(len(long)/16) {
		t.Errorf("a 100K-token prompt: %d of %d blocks reused", h1-h0, len(long)/16)
	}
}

// TestMemoReusesLongestPrefix: a conversation's next turn reuses the
// previous turn's blocks and hashes only the new ones; a different salt,
// LoRA name or profile reuses nothing.
func TestMemoReusesLongestPrefix(t *testing.T) {
	profiles := allProfiles(t, "0")
	for name, p := range profiles {
		t.Run(name, func(t *testing.T) {
			m := NewMemo(8 << 20)
			turn1 := seq(1, 64)
			turn2 := append(append([]int32(nil), turn1...), seq(900, 40)...)
			keysOf(&p, 16, turn1, "lora", "salt", m)
			h0, _ := m.Stats()
			got := keysOf(&p, 16, turn2, "lora", "salt", m)
			h1, m1 := m.Stats()
			want := keysOf(&p, 16, turn2, "lora", "salt", nil)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("keys differ with the memo")
			}
			reused := int(h1 - h0)
			full := 64 / 16
			if name == "sglang_bigram" {
				full = 3 // turn 1 has 63 positions: its 4th page is partial and not kept
			}
			if reused != full {
				t.Errorf("reused %d blocks, want %d (misses %d)", reused, full, m1)
			}
			// Turn 2 hashed past what it reused, so the memo learned its
			// whole chain: asking again reuses every full block of it.
			h2, _ := m.Stats()
			if got := keysOf(&p, 16, turn2, "lora", "salt", m); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("keys differ on the third query")
			}
			all := 104 / 16
			if name == "sglang_bigram" {
				all = 103 / 16
			}
			if h3, _ := m.Stats(); int(h3-h2) != all {
				t.Errorf("turn 2 again reused %d blocks, want %d", h3-h2, all)
			}
			for _, v := range []struct{ lora, salt string }{{"other", "salt"}, {"lora", "other"}} {
				h2, _ := m.Stats()
				keysOf(&p, 16, turn2, v.lora, v.salt, m)
				if h3, _ := m.Stats(); h3 != h2 {
					t.Errorf("lora=%q salt=%q reused %d blocks of another namespace", v.lora, v.salt, h3-h2)
				}
			}
		})
	}
}

// TestMemoKeepsItsOwnNames: /query hands lora and salt over as views of a
// request body whose buffer is reused once the request is answered. A
// remembered chain must keep the names it was hashed under: once those
// bytes spell another tenant's names, the first tenant's prompt is still
// recognised, and the other tenant still gets its own keys.
func TestMemoKeepsItsOwnNames(t *testing.T) {
	for name, p := range allProfiles(t, "0") {
		t.Run(name, func(t *testing.T) {
			m := NewMemo(8 << 20)
			toks := seq(1, 96)
			body := []byte("lora-1|tenant-1")
			lora := unsafe.String(&body[0], 6)
			salt := unsafe.String(&body[7], 8)
			first := keysOf(&p, 16, toks, lora, salt, nil)
			keysOf(&p, 16, toks, lora, salt, m)
			copy(body, "lora-2|tenant-2") // the buffer serves the next request
			want := keysOf(&p, 16, toks, "lora-2", "tenant-2", nil)
			if got := keysOf(&p, 16, toks, "lora-2", "tenant-2", m); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("another tenant's query got keys hashed under the first one's names")
			}
			h0, _ := m.Stats()
			if got := keysOf(&p, 16, toks, "lora-1", "tenant-1", m); fmt.Sprint(got) != fmt.Sprint(first) {
				t.Fatalf("keys differ with the memo")
			}
			if h1, _ := m.Stats(); h1 == h0 {
				t.Errorf("the first tenant's chain is no longer recognised once its request's buffer was reused")
			}
		})
	}
}

// TestMemoReset: after Reset nothing is remembered (the next query of a
// remembered prompt hashes every block), the accounted bytes are zero, and
// the memo fills again afterwards.
func TestMemoReset(t *testing.T) {
	p := allProfiles(t, "0")["sha256_cbor"]
	m := NewMemo(1 << 20)
	toks := seq(1, 128)
	want := keysOf(&p, 16, toks, "", "", nil)
	keysOf(&p, 16, toks, "", "", m)
	if m.Bytes() == 0 {
		t.Fatal("a remembered chain accounts for no bytes")
	}
	m.Reset()
	if got := m.Bytes(); got != 0 {
		t.Fatalf("%d bytes after Reset", got)
	}
	hits, _ := m.Stats()
	if got := keysOf(&p, 16, toks, "", "", m); !slices.Equal(got, want) {
		t.Fatalf("keys after Reset differ")
	}
	if h, _ := m.Stats(); h != hits {
		t.Fatalf("%d digests reused after Reset", h-hits)
	}
	keysOf(&p, 16, toks, "", "", m)
	if h, _ := m.Stats(); h != hits+8 {
		t.Fatalf("refilled memo reused %d of 8 blocks", h-hits)
	}
	var nilMemo *Memo
	nilMemo.Reset()
	if nilMemo.Bytes() != 0 {
		t.Fatal("nil memo has bytes")
	}
}

// walkPrefix runs the first n blocks of a query's chain through m, as an
// index walk that stops at the first block no instance holds does.
func walkPrefix(p *Profile, toks []int32, n int, m *Memo) {
	c := AcquireChain()
	defer ReleaseChain(c)
	c.Reset(p, 16, toks, "", "")
	c.KeepTokens()
	c.UseMemo(m)
	for range n {
		if _, _, ok := c.Next(); !ok {
			return
		}
	}
}

// TestMemoKeepsWalksThatStopInASharedPrefix: many prompts open with one
// system prompt, and each query's walk stops a few blocks past it (the
// rest of the prompt was never cached). Every such chain is filed only
// under fingerprints the whole group shares, whose buckets keep the newest
// BucketCap entries; the memo must still find each prompt's own chain when
// it is asked again, rather than hash its blocks and store it anew on
// every round, growing until the budget evicts everything.
func TestMemoKeepsWalksThatStopInASharedPrefix(t *testing.T) {
	p := allProfiles(t, "0")["sha256_cbor"]
	m := NewMemo(256 << 20)
	const prompts, system, walked = 64, 2048, 136 // walks: the system prompt's 128 blocks and 8 more
	sys := seq(1, system)
	queries := make([][]int32, prompts)
	for i := range queries {
		queries[i] = append(slices.Clip(sys), seq(1_000_000*(i+1), 8192-system)...)
	}
	for _, q := range queries {
		walkPrefix(&p, q, walked, m)
	}
	bytes := m.Bytes()
	_, misses := m.Stats()
	for round := range 3 {
		for _, q := range queries {
			walkPrefix(&p, q, walked, m)
		}
		if _, got := m.Stats(); got != misses {
			t.Fatalf("round %d hashed %d blocks again (of %d walked)", round+2, got-misses, prompts*walked)
		}
		if got := m.Bytes(); got != bytes {
			t.Fatalf("round %d: memo grew from %d to %d bytes", round+2, bytes, got)
		}
	}
}
