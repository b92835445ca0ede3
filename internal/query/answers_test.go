package query

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/eventtest"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
)

// answerWorld is a table with a few owners and a pool of long prompts
// sharing prefixes, the keys of each prompt's blocks, and two engines over
// it: one remembering answers, one always walking.
type answerWorld struct {
	ix       *index.Index
	tbl      *index.Table
	prompts  [][]int32
	keys     [][]uint64
	cached   *Engine
	walking  *Engine
	owners   []index.OwnerID
	ownerKey [][2]any // instance, rank of owners[i]
}

func newAnswerWorld(t testing.TB, seed uint64) *answerWorld {
	t.Helper()
	hashSeed := "0"
	p, err := hashing.Resolve(hashing.Spec{Strategy: "vllm_v1", Algorithm: "sha256_cbor", IndexProjection: "low64_be", PythonHashSeed: &hashSeed})
	if err != nil {
		t.Fatal(err)
	}
	w := &answerWorld{ix: index.New(index.Options{})}
	w.tbl = w.ix.EnsureTable(testCtx, p)
	r := rand.New(rand.NewPCG(seed, 1))
	// Three groups of two prompts; prompts of a group share their first
	// 256 tokens, and lengths vary around MinAnswerTokens.
	for g := range 3 {
		sys := make([]int32, 256)
		for i := range sys {
			sys[i] = int32(g*100000 + i)
		}
		for range 2 {
			pr := append([]int32(nil), sys...)
			for len(pr) < MinAnswerTokens+r.IntN(64) {
				pr = append(pr, int32(r.IntN(50000)))
			}
			w.prompts = append(w.prompts, pr)
		}
	}
	for _, pr := range w.prompts {
		w.keys = append(w.keys, eventtest.ChainKeys(w.tbl.Profile(), testCtx.BlockSize, pr))
	}
	w.cached = New(Options{Index: w.ix, Memo: hashing.NewMemo(1 << 20), Answers: NewAnswers(8 << 20)})
	// The walking engine has a prefix memo too (it changes no answer), so
	// that the reference costs less than SHA-256 per block under -race.
	w.walking = New(Options{Index: w.ix, Memo: hashing.NewMemo(1 << 20)})
	for _, ok := range [][2]any{{"a", 0}, {"a", 1}, {"b", 0}} {
		w.owners = append(w.owners, w.tbl.AddEngineOwner(ok[0].(string), ok[1].(int)))
		w.ownerKey = append(w.ownerKey, ok)
	}
	return w
}

// prefix returns the first n keys of a random prompt, n mostly long so
// that answers are long and change at many places.
func (w *answerWorld) prefix(r *rand.Rand) []uint64 {
	ks := w.keys[r.IntN(len(w.keys))]
	return ks[:r.IntN(len(ks)+1)]
}

var engineTiers = []index.Tier{index.Device, index.CPULocal, index.Disk}
var sharedTiers = []index.Tier{index.CPUShare, index.Disk}

// step applies one random change to the table and names it.
func (w *answerWorld) step(r *rand.Rand) string {
	id := w.owners[r.IntN(len(w.owners))]
	switch op := r.IntN(30); {
	case op < 6:
		tier := engineTiers[r.IntN(3)]
		for _, k := range w.prefix(r) {
			w.tbl.Store(id, tier, k)
		}
		return "store prefix"
	case op < 8:
		ks := w.prefix(r)
		tiers := make([]index.TierMask, len(ks))
		for i := range tiers {
			tiers[i] = index.TierMask(1 << engineTiers[r.IntN(3)])
		}
		w.tbl.StoreBatch(id, ks, tiers)
		return "store batch"
	case op < 10:
		ks := w.keys[r.IntN(len(w.keys))]
		w.tbl.Remove(id, engineTiers[r.IntN(3)], ks[r.IntN(len(ks))])
		return "remove one block"
	case op == 10:
		ks := w.keys[r.IntN(len(w.keys))]
		w.tbl.Evict(id, ks[r.IntN(len(ks))])
		return "evict one block"
	case op == 11:
		ks := w.keys[r.IntN(len(w.keys))]
		w.tbl.Put(id, engineTiers[r.IntN(3)], ks[r.IntN(len(ks))])
		return "put one block"
	case op == 12:
		w.tbl.ClearOwner(id, index.TierMask(1+r.IntN(int(index.AllEngineTiers))))
		return "clear owner"
	case op < 15:
		tier := sharedTiers[r.IntN(2)]
		for _, k := range w.prefix(r) {
			w.tbl.AcquireShared(tier, k)
		}
		return "acquire shared"
	case op == 15:
		ks := w.keys[r.IntN(len(w.keys))]
		tier := sharedTiers[r.IntN(2)]
		for _, k := range ks[r.IntN(len(ks)):] {
			w.tbl.ReleaseShared(tier, k)
		}
		return "release shared"
	case op == 16:
		i := r.IntN(len(w.owners))
		w.tbl.RemoveEngineOwner(w.owners[i])
		w.owners[i] = w.tbl.AddEngineOwner(w.ownerKey[i][0].(string), w.ownerKey[i][1].(int))
		return "re-register owner"
	case op == 17:
		rank := len(w.owners)
		w.owners = append(w.owners, w.tbl.AddEngineOwner("c", rank))
		w.ownerKey = append(w.ownerKey, [2]any{"c", rank})
		return "add owner"
	case op == 18 && len(w.owners) > 1:
		i := len(w.owners) - 1
		w.tbl.RemoveEngineOwner(w.owners[i])
		w.owners, w.ownerKey = w.owners[:i], w.ownerKey[:i]
		return "remove owner"
	default:
		return "nothing"
	}
}

var instanceFilters = []string{"", "a", "b", "c"}

// TestAnswersEqualWalks is the answer cache's property: after any sequence
// of changes, an engine remembering answers answers every prompt exactly as
// one that walks every time. Every kind of change in step is applied many
// times between queries of remembered prompts (a third of the steps
// change nothing, so answers are also reused), so a change that left the
// table's version as it was would show here as a stale answer.
func TestAnswersEqualWalks(t *testing.T) {
	for seed := range uint64(2) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			w := newAnswerWorld(t, seed)
			r := rand.New(rand.NewPCG(seed, 2))
			var got, want Result
			for i := range 500 {
				what := w.step(r)
				for range 4 {
					pr := w.prompts[r.IntN(len(w.prompts))]
					inst := ""
					if r.IntN(4) == 0 {
						inst = instanceFilters[r.IntN(len(instanceFilters))]
					}
					salt := ""
					if r.IntN(8) == 0 {
						salt = "s"
					}
					req := &Request{Context: testCtx, Instance: inst, CacheSalt: salt, Tokens: pr}
					if _, err := w.cached.Lookup(req, &got); err != nil {
						t.Fatal(err)
					}
					if _, err := w.walking.Lookup(req, &want); err != nil {
						t.Fatal(err)
					}
					if diff := sameInstances(want.Instances, got.Instances); diff != "" {
						t.Fatalf("step %d (after %s), instance %q: remembered answer differs from a walk (-walk +remembered):\n%s", i, what, inst, diff)
					}
				}
			}
			hits, misses := w.cached.opts.Answers.Stats()
			if hits < 200 || misses < 200 {
				t.Errorf("hits %d, misses %d: the property was not exercised both ways", hits, misses)
			}
		})
	}
}

// TestAnswersKeyedByEverythingAsked: prompts differing only in the middle,
// in the salt or in the instance filter, and the same prompt in another
// table, never share an answer.
func TestAnswersKeyedByEverythingAsked(t *testing.T) {
	w := newAnswerWorld(t, 9)
	pr := w.prompts[0]
	for _, k := range w.keys[0] {
		w.tbl.Store(w.owners[0], index.Device, k)
	}
	mid := append([]int32(nil), pr...)
	mid[len(mid)/2+1]++
	other := w.ix.EnsureTable(index.ContextKey{Tenant: "default", Model: "other", BlockSize: testCtx.BlockSize}, *w.tbl.Profile())
	other.AddEngineOwner("a", 0)
	asks := []struct {
		name string
		req  Request
	}{
		{"stored prompt", Request{Context: testCtx, Tokens: pr}},
		{"changed in the middle", Request{Context: testCtx, Tokens: mid}},
		{"salted", Request{Context: testCtx, Tokens: pr, CacheSalt: "x"}},
		{"filtered to b", Request{Context: testCtx, Tokens: pr, Instance: "b"}},
		{"other table", Request{Context: other.Context(), Tokens: pr}},
	}
	for round := range 2 { // the second round is answered from memory
		for _, a := range asks {
			var got, want Result
			if _, err := w.cached.Lookup(&a.req, &got); err != nil {
				t.Fatal(err)
			}
			if _, err := w.walking.Lookup(&a.req, &want); err != nil {
				t.Fatal(err)
			}
			if diff := sameInstances(want.Instances, got.Instances); diff != "" {
				t.Errorf("round %d, %s (-walk +remembered):\n%s", round, a.name, diff)
			}
		}
	}
	if hits, _ := w.cached.opts.Answers.Stats(); hits != uint64(len(asks)) {
		t.Errorf("hits = %d, want %d (each ask once from memory)", hits, len(asks))
	}
	w.cached.opts.Answers.Reset()
	if b := w.cached.opts.Answers.Bytes(); b != 0 {
		t.Errorf("after Reset the cache holds %d bytes", b)
	}
}

// TestAnswersKeepTheirOwnFilters: /query hands instance_id and cache_salt
// over as views of a request body whose buffer is reused once the request
// is answered. A remembered answer must stay filed under the filter it was
// computed for: when those bytes later spell another instance, that
// instance's lookup walks, and the first one is still answered from
// memory.
func TestAnswersKeepTheirOwnFilters(t *testing.T) {
	w := newAnswerWorld(t, 11)
	pr := w.prompts[0]
	for _, k := range w.keys[0] {
		w.tbl.Store(w.owners[0], index.Device, k) // instance a only
	}
	body := []byte("a")
	asked := Request{Context: testCtx, Tokens: pr, Instance: unsafe.String(&body[0], len(body))}
	var first Result
	if _, err := w.cached.Lookup(&asked, &first); err != nil {
		t.Fatal(err)
	}
	body[0] = 'b' // the buffer now holds the next request
	for _, instance := range []string{"b", "a"} {
		req := Request{Context: testCtx, Tokens: pr, Instance: instance}
		var got, want Result
		if _, err := w.cached.Lookup(&req, &got); err != nil {
			t.Fatal(err)
		}
		if _, err := w.walking.Lookup(&req, &want); err != nil {
			t.Fatal(err)
		}
		if diff := sameInstances(want.Instances, got.Instances); diff != "" {
			t.Errorf("instance %s (-walk +remembered):\n%s", instance, diff)
		}
	}
	if hits, _ := w.cached.opts.Answers.Stats(); hits != 1 {
		t.Errorf("hits = %d, want 1 (instance a's second ask)", hits)
	}
}

// TestAnswersUnderConcurrentWrites runs lookups against a writer.
// Whenever the table's version is the same before a remembered-answer
// lookup and after a walk that follows it, nothing changed in between and
// the two answers must agree; the race detector checks the rest. Every
// other pair of lookups holds the writer off, so some pairs certainly
// compare, while the rest run against it.
func TestAnswersUnderConcurrentWrites(t *testing.T) {
	w := newAnswerWorld(t, 5)
	var stop atomic.Bool
	var pause sync.Mutex
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		r := rand.New(rand.NewPCG(7, 7))
		for !stop.Load() {
			pause.Lock()
			// Only changes that keep the owners as they are: w.owners
			// is not guarded.
			switch r.IntN(3) {
			case 0:
				ks := w.keys[r.IntN(len(w.keys))]
				for _, k := range ks[:r.IntN(len(ks))] {
					w.tbl.Store(w.owners[r.IntN(3)], engineTiers[r.IntN(3)], k)
				}
			case 1:
				ks := w.keys[r.IntN(len(w.keys))]
				w.tbl.Remove(w.owners[r.IntN(3)], engineTiers[r.IntN(3)], ks[r.IntN(len(ks))])
			default:
				w.tbl.ClearOwner(w.owners[r.IntN(3)], index.AllEngineTiers)
			}
			pause.Unlock()
		}
	}()
	r := rand.New(rand.NewPCG(8, 8))
	var got, want Result
	compared := 0
	for i := range 1000 {
		held := i%2 == 0
		if held {
			pause.Lock()
		}
		req := &Request{Context: testCtx, Tokens: w.prompts[r.IntN(len(w.prompts))]}
		before := w.tbl.Version()
		if _, err := w.cached.Lookup(req, &got); err != nil {
			t.Fatal(err)
		}
		if _, err := w.walking.Lookup(req, &want); err != nil {
			t.Fatal(err)
		}
		stable := w.tbl.Version() == before
		if held {
			pause.Unlock()
			if !stable {
				t.Fatalf("lookup %d: the version moved with the writer held off", i)
			}
		}
		if !stable {
			continue
		}
		compared++
		if diff := sameInstances(want.Instances, got.Instances); diff != "" {
			t.Fatalf("lookup %d at an unchanged version (-walk +remembered):\n%s", i, diff)
		}
	}
	stop.Store(true)
	wg.Wait()
	if hits, _ := w.cached.opts.Answers.Stats(); hits == 0 {
		t.Error("no lookup was answered from memory")
	}
}

// sameInstances is cmp.Diff of two answers' instances (empty when they
// agree), with reflect.DeepEqual first: the property tests compare
// thousands of answers, and go-cmp's reflection with options costs many
// times as much under the race detector; cmp judges only what DeepEqual
// does not find identical.
func sameInstances(want, got any) string {
	if reflect.DeepEqual(want, got) {
		return ""
	}
	return cmp.Diff(want, got, cmpopts.EquateEmpty())
}
