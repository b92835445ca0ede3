package hashing

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/cespare/xxhash/v2"
	"pgregory.net/rapid"
)

type keyCov struct {
	key uint64
	cov int
}

func keysOf(p *Profile, bs int, toks []int32, lora, salt string, m *Memo) []keyCov {
	c := AcquireChain()
	defer ReleaseChain(c)
	c.Reset(p, bs, toks, lora, salt)
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
		got := keysOf(&p, bs, toks, lora, salt, memo)
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

// TestMemoConcurrent shares one memo between goroutines under -race.
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
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
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

func rssBytes(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skip("no /proc/self/status")
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	t.Skip("no VmRSS")
	return 0
}

// TestMemoMemoryIsBounded fills a memo many times over: resident memory
// grows by about its configured size and no more, and the Go heap not at
// all (the memo lives off-heap).
func TestMemoMemoryIsBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("memory")
	}
	const size = 16 << 20
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	rss0 := rssBytes(t)
	m := NewMemo(size)
	key := make([]byte, 100)
	var d [32]byte
	for i := 0; i < 600_000; i++ { // ~4x what fits
		binary.LittleEndian.PutUint64(key, uint64(i))
		m.store(key, xxhash.Sum64(key), &d)
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	grew := rssBytes(t) - rss0
	t.Logf("RSS grew %.1f MiB for a %d MiB memo; Go heap in use %+.1f MiB", float64(grew)/(1<<20), size>>20, float64(int64(after.HeapInuse)-int64(before.HeapInuse))/(1<<20))
	if grew > size*13/10 {
		t.Errorf("RSS grew %d bytes for a %d-byte memo", grew, size)
	}
	if d := int64(after.HeapInuse) - int64(before.HeapInuse); d > 1<<20 {
		t.Errorf("Go heap grew %d bytes; the memo should live off-heap", d)
	}
	// The newest entries are still there.
	binary.LittleEndian.PutUint64(key, 599_999)
	if !m.lookup(key, xxhash.Sum64(key), &d) {
		t.Error("the newest entry is missing")
	}
	runtime.KeepAlive(m)
}
