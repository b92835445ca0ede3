package hashing

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkMemoWorkingSet cycles through 300 distinct 8K-token prompts
// (~150k blocks), as a router with many live conversations would, with no
// memo, one too small to hold them (it must cost nothing extra when it
// thrashes) and one that holds them all.
func BenchmarkMemoWorkingSet(b *testing.B) {
	p := allProfiles(b, "0")["sha256_cbor"]
	r := rand.New(rand.NewPCG(1, 2))
	prompts := make([][]int32, 300)
	for i := range prompts {
		prompts[i] = make([]int32, 8192)
		for j := range prompts[i] {
			prompts[i][j] = int32(r.IntN(150000))
		}
	}
	for _, mib := range []int{0, 4, 64} {
		b.Run(fmt.Sprintf("memo=%dMiB", mib), func(b *testing.B) {
			m := NewMemo(mib << 20)
			for _, pr := range prompts {
				keysOf(&p, 16, pr, "", "", m)
			}
			c := AcquireChain()
			i := 0
			for b.Loop() {
				c.Reset(&p, 16, prompts[i%len(prompts)], "", "")
				c.UseMemo(m)
				for {
					if _, _, ok := c.Next(); !ok {
						break
					}
				}
				i++
			}
			c.UseMemo(nil)
			h, mi := m.Stats()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/512, "ns/block")
			if h+mi > 0 {
				b.ReportMetric(float64(h)/float64(h+mi), "hitrate")
			}
		})
	}
}
