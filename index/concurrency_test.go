package index

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

// checkAnswer verifies the shape rules every answer must satisfy whatever
// interleaving produced it.
func checkAnswer(res *QueryResult, limit int) error {
	for i, ih := range res.Instances {
		if i > 0 && res.Instances[i-1].Instance >= ih.Instance {
			return fmt.Errorf("instances not sorted")
		}
		var m TierCounts
		for j, r := range ih.Ranks {
			if j > 0 && ih.Ranks[j-1].Rank >= r.Rank {
				return fmt.Errorf("ranks not sorted")
			}
			c := r.TierCounts
			if c.Device < 0 || c.Device > c.CPULocal || c.CPULocal > c.CPUShare || c.CPUShare > c.Disk || c.Disk > limit {
				return fmt.Errorf("counts not cumulative: %+v", c)
			}
			m.Device, m.CPULocal = max(m.Device, c.Device), max(m.CPULocal, c.CPULocal)
			m.CPUShare, m.Disk = max(m.CPUShare, c.CPUShare), max(m.Disk, c.Disk)
		}
		if m != ih.Max {
			return fmt.Errorf("max %+v of %+v", ih.Max, ih.Ranks)
		}
	}
	return nil
}

// TestConcurrentIngestQueryRemove runs ingestion, shared-reference churn,
// queries and owner removal/re-registration at once; under -race it proves
// the locking, and the final state proves no Store slipped past a removal.
func TestConcurrentIngestQueryRemove(t *testing.T) {
	defer goleak.VerifyNone(t)
	tb := New(Options{Stripes: 8}).EnsureTable(testCtx)
	const keys = 256
	ops := 20000
	if testing.Short() {
		ops = 4000
	}

	var (
		mu     sync.Mutex
		owners []OwnerID
	)
	pick := func(r *rand.Rand) OwnerID {
		mu.Lock()
		defer mu.Unlock()
		return owners[r.IntN(len(owners))]
	}
	for i := range 4 {
		owners = append(owners, tb.AddEngineOwner(fmt.Sprintf("i%d", i), 0))
	}

	var wg sync.WaitGroup
	done := make(chan struct{})
	errs := make(chan error, 8)
	for g := range 4 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for range ops {
				id := pick(r)
				k := uint64(r.IntN(keys))
				tier := []Tier{Device, CPULocal, Disk}[r.IntN(3)]
				switch n := r.IntN(100); {
				case n < 60:
					tb.Store(id, Put{Key: k, Tier: tier})
				case n < 95:
					tb.Remove(id, Put{Key: k, Tier: tier})
				case n < 98:
					tb.ClearOwner(id, 1<<Device)
				default:
					tb.ClearOwner(id, AllEngineTiers)
				}
			}
		})
	}
	wg.Go(func() { // Mooncake bindings: balanced acquire/release per key
		r := rand.New(rand.NewPCG(9, 9))
		refs := map[[2]uint64]int{}
		for range ops {
			tier := []Tier{CPUShare, Disk}[r.IntN(2)]
			k := uint64(r.IntN(keys))
			ref := [2]uint64{uint64(tier), k}
			if r.IntN(2) == 0 || refs[ref] == 0 {
				tb.acquireShared(tier, k)
				refs[ref]++
			} else {
				tb.releaseShared(tier, k)
				refs[ref]--
			}
		}
		for ref, n := range refs {
			for range n {
				tb.releaseShared(Tier(ref[0]), ref[1])
			}
		}
	})
	var qg sync.WaitGroup
	for g := range 2 {
		qg.Go(func() {
			var res QueryResult
			chain := &keyChain{}
			for k := range uint64(32) {
				chain.keys = append(chain.keys, k)
			}
			filters := []string{"", "i1", "r0", "nobody"}
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				chain.reset()
				tb.Query(chain, filters[(i+g)%len(filters)], &res)
				if err := checkAnswer(&res, 32*16); err != nil {
					errs <- err
					return
				}
				_ = tb.PrefixCount()
				_ = tb.TierBlocks()
				_ = tb.Instances()
			}
		})
	}
	wg.Go(func() { // unregister and register again, as /unregister and stale recovery do
		r := rand.New(rand.NewPCG(7, 7))
		for i := range 200 {
			mu.Lock()
			j := r.IntN(len(owners))
			old := owners[j]
			mu.Unlock()
			tb.RemoveEngineOwner(old)
			id := tb.AddEngineOwner(fmt.Sprintf("r%d", i%3), i%2)
			mu.Lock()
			owners[j] = id
			mu.Unlock()
		}
	})
	wg.Wait()
	close(done)
	qg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	checkInvariants(t, tb)
	for _, id := range owners {
		tb.RemoveEngineOwner(id)
	}
	for inst, ranks := range tb.Instances() {
		for _, r := range ranks {
			tb.RemoveEngineOwner(tb.AddEngineOwner(inst, r))
		}
	}
	checkInvariants(t, tb)
	if n, tiers := tb.PrefixCount(), tb.TierBlocks(); n != 0 || tiers != [4]int{} {
		t.Fatalf("after removing everything: %d keys, tiers %v", n, tiers)
	}
}
