package hashing

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func testProfile(t testing.TB, algo string) *Profile {
	t.Helper()
	seed := "0"
	p, err := Resolve(Spec{Strategy: StrategyVLLMV1, Algorithm: algo, IndexProjection: "low64_be", PythonHashSeed: &seed})
	if err != nil {
		t.Fatal(err)
	}
	return &p
}

// referenceChain is every full block's key and digest, hashed.
func referenceChain(p *Profile, bs int, toks []int32, lora, salt string) (keys []uint64, digs [][32]byte) {
	c := AcquireChain()
	defer ReleaseChain(c)
	c.Reset(p, bs, toks, lora, salt)
	for {
		k, _, ok := c.Next()
		if !ok {
			return keys, digs
		}
		keys = append(keys, k)
		digs = append(digs, c.Digest())
	}
}

// record files the first n blocks of a chain as ingest does, in runs of
// three.
func record(sc LinkScope, bs int, toks []int32, lora, salt string, keys []uint64, digs [][32]byte, n int) {
	id, buf := sc.Root(lora, salt, nil)
	ids := make([]LinkID, n)
	for i := range n {
		id, buf = sc.Next(id, toks[i*bs:(i+1)*bs], buf)
		ids[i] = id
	}
	for i := 0; i < n; i += 3 {
		j := min(i+3, n)
		sc.Record(&LinkRun{IDs: ids[i:j], Keys: keys[i:j], Digs: digs[i:j], Known: j - i}, nil)
	}
}

// TestLinksServeChains: a chain following links yields exactly the keys
// and digests hashing gives, for both encodings, with and without a LoRA
// name, salt and prefix memo, and follows exactly the linked blocks.
func TestLinksServeChains(t *testing.T) {
	const bs = 4
	toks := make([]int32, 10*bs+3)
	for i := range toks {
		toks[i] = int32(i*7919 + 3)
	}
	for _, algo := range []string{AlgorithmSHA256CBOR, AlgorithmSHA256, AlgorithmXXHashCBOR, AlgorithmXXHash} {
		for _, lora := range []string{"", "adapter"} {
			for _, salt := range []string{"", "tenant-salt"} {
				for _, memo := range []bool{false, true} {
					for _, linked := range []int{0, 1, 6, 10} {
						t.Run(fmt.Sprintf("%s/lora=%q/salt=%q/memo=%v/linked=%d", algo, lora, salt, memo, linked), func(t *testing.T) {
							p := testProfile(t, algo)
							keys, digs := referenceChain(p, bs, toks, lora, salt)
							l := NewLinks(1 << 20)
							record(l.Scope(p), bs, toks, lora, salt, keys, digs, linked)
							// Another LoRA's or salt's links must never
							// serve, nor another encoding's.
							record(l.Scope(p), bs, toks, lora+"x", salt, keys, digs, 10)
							record(l.Scope(p), bs, toks, lora, salt+"x", keys, digs, 10)
							other := testProfile(t, AlgorithmSHA256)
							if algo == AlgorithmSHA256 {
								other = testProfile(t, AlgorithmSHA256CBOR)
							}
							record(l.Scope(other), bs, toks, lora, salt, keys, digs, 10)
							// Nor another PYTHONHASHSEED's (root digest).
							seed := "1"
							reseeded, err := Resolve(Spec{Strategy: StrategyVLLMV1, Algorithm: algo, IndexProjection: "low64_be", PythonHashSeed: &seed})
							if err != nil {
								t.Fatal(err)
							}
							record(l.Scope(&reseeded), bs, toks, lora, salt, keys, digs, 10)
							var m *Memo
							if memo {
								m = NewMemo(1 << 20)
							}
							for round := range 2 { // the second round is memo-warm
								c := AcquireChain()
								c.Reset(p, bs, toks, lora, salt)
								c.UseMemo(m)
								c.UseLinks(l)
								for i := range keys {
									k, cov, ok := c.Next()
									if !ok || k != keys[i] || cov != bs || c.Digest() != digs[i] {
										t.Fatalf("round %d block %d: key %x ok %v, want %x", round, i, k, ok, keys[i])
									}
								}
								if _, _, ok := c.Next(); ok {
									t.Fatal("chain longer than its full blocks")
								}
								ReleaseChain(c)
							}
							// Without a memo both rounds take the linked
							// blocks' digests from the links.
							if hits, _, _ := l.Stats(); !memo && hits != uint64(2*linked) {
								t.Errorf("link hits %d, want %d", hits, 2*linked)
							}
						})
					}
				}
			}
		}
	}
}

// TestLinksNotForSGLang: SGLang profiles have no scope, so chains hash.
func TestLinksNotForSGLang(t *testing.T) {
	p, err := Resolve(Spec{Strategy: StrategySGLang, Algorithm: AlgorithmSHA256Raw, IndexProjection: "first64_be"})
	if err != nil {
		t.Fatal(err)
	}
	l := NewLinks(1 << 20)
	if l.Scope(&p).Enabled() {
		t.Fatal("an SGLang profile has a link scope")
	}
	c := AcquireChain()
	defer ReleaseChain(c)
	c.Reset(&p, 4, []int32{1, 2, 3, 4}, "", "")
	c.UseLinks(l)
	if c.links != nil {
		t.Fatal("an SGLang chain follows links")
	}
}

// TestLinksBudget: links stay within their byte budget as generations
// turn over, the newest stay, refreshed ones survive, and Reset empties
// them.
func TestLinksBudget(t *testing.T) {
	p := testProfile(t, AlgorithmSHA256CBOR)
	budget := 8 << 20
	l := NewLinks(budget)
	sc := l.Scope(p)
	rng := rand.New(rand.NewPCG(1, 2))
	hot := []LinkID{{Lo: 7, Hi: 7}}
	ids := make([]LinkID, 5)
	keys := make([]uint64, 5)
	digs := make([][32]byte, 5)
	for i := range 100_000 {
		for j := range ids {
			ids[j] = LinkID{Lo: rng.Uint64(), Hi: rng.Uint64()}
			keys[j] = rng.Uint64()
			digs[j][0], digs[j][1], digs[j][2] = byte(i), byte(i>>8), byte(j)
		}
		sc.Record(&LinkRun{IDs: ids, Keys: keys, Digs: digs, Known: len(ids)}, nil)
		if i%1000 == 0 {
			sc.Record(&LinkRun{IDs: hot, Keys: []uint64{77}, Digs: [][32]byte{{7}}, Known: 1}, nil) // stored again and again
		}
		if l.Bytes() > budget {
			t.Fatalf("after %d runs: %d bytes, budget %d", i+1, l.Bytes(), budget)
		}
	}
	got, fresh := sc.Resolve(ids, nil)
	if !fresh || len(got) != len(ids) || got[4] != digs[4] {
		t.Errorf("the newest run: %d of %d digests, fresh %v", len(got), len(ids), fresh)
	}
	if id, d, ok := sc.ByKey(keys[4]); !ok || id != ids[4] || d != digs[4] {
		t.Error("the newest key is gone")
	}
	if got, _ := sc.Resolve(hot, nil); len(got) != 1 || got[0] != ([32]byte{7}) {
		t.Error("a link stored again and again aged out")
	}
	if k := l.Len(); k < budget/LinkBytes/4 || k > budget/48 {
		t.Errorf("%d links held in a budget of %d bytes", k, budget)
	}
	l.Reset()
	if l.Bytes() != 0 || l.Len() != 0 {
		t.Errorf("after Reset: %d bytes, %d links", l.Bytes(), l.Len())
	}
	if got, _ := sc.Resolve(ids, nil); len(got) != 0 {
		t.Error("a link survived Reset")
	}
	if _, _, ok := sc.ByKey(keys[4]); ok {
		t.Error("a key survived Reset")
	}
	if NewLinks(chunkBlocks*LinkBytes) != nil {
		t.Error("a budget below a few chunks enables links")
	}
}

// BenchmarkLinksMemory reports the heap one verified block costs and what
// Links accounts for it, then the cost of a batch lookup per block, as a
// query's chain does it (resolve), on a table far larger than the caches.
func BenchmarkLinksMemory(b *testing.B) {
	p := testProfile(b, AlgorithmSHA256CBOR)
	const n = 500_000
	const bs = 16
	toks := make([]int32, n*bs)
	for i := range toks {
		toks[i] = int32(i)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	l := NewLinks(1 << 30)
	sc := l.Scope(p)
	var buf []byte
	var id LinkID
	const run = 64 // blocks per event
	ids := make([]LinkID, run)
	keys := make([]uint64, run)
	digs := make([][32]byte, run)
	for i := range n {
		if i%512 == 0 {
			id, buf = sc.Root("", "", buf) // each prompt of 512 blocks starts a chain
		}
		id, buf = sc.Next(id, toks[i*bs:(i+1)*bs], buf)
		ids[i%run], keys[i%run] = id, uint64(i)+1
		digs[i%run][24], digs[i%run][25], digs[i%run][26] = byte(i), byte(i>>8), byte(i>>16)
		if i%run == run-1 {
			sc.Record(&LinkRun{IDs: ids, Keys: keys, Digs: digs}, nil)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	heap := float64(after.HeapAlloc-before.HeapAlloc) / n
	acct := float64(l.Bytes()) / n
	c := AcquireChain()
	defer ReleaseChain(c)
	blocks := 0
	b.ResetTimer()
	for i := range b.N {
		// A different prompt every time, so the lookups miss the caches
		// as a cold query's do.
		w := (i * 7919) % (n / 512)
		c.Reset(p, bs, toks[w*512*bs:(w+1)*512*bs], "", "")
		c.UseLinks(l)
		for c.Ready() > 0 {
			for range len(c.pend.Keys) - c.pendI {
				c.Next()
				blocks++
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(blocks), "ns/block")
	b.ReportMetric(heap, "heapB/block")
	b.ReportMetric(acct, "accountedB/block")
}

// TestLinksConcurrent: queries resolving while ingest records and the
// generations turn over (a small budget) only ever get the digest filed
// under an id, never another's; run it with -race.
func TestLinksConcurrent(t *testing.T) {
	p := testProfile(t, AlgorithmSHA256CBOR)
	l := NewLinks(2 << 20)
	sc := l.Scope(p)
	digestOf := func(id LinkID) (d [32]byte) {
		binary.LittleEndian.PutUint64(d[:], id.Lo)
		binary.LittleEndian.PutUint64(d[8:], id.Hi^0x55)
		return d
	}
	const runs, runLen = 4000, 16
	idsOf := func(r int) []LinkID {
		ids := make([]LinkID, runLen)
		for i := range ids {
			ids[i] = LinkID{Lo: uint64(r), Hi: uint64(i + 1)}
		}
		return ids
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := w; r < runs; r += 2 {
				ids := idsOf(r)
				digs := make([][32]byte, len(ids))
				keys := make([]uint64, len(ids))
				for i, id := range ids {
					digs[i], keys[i] = digestOf(id), uint64(r*runLen+i+1)
				}
				sc.Record(&LinkRun{IDs: ids, Keys: keys, Digs: digs, Known: len(ids)}, nil)
			}
		}()
	}
	go func() { wg.Wait(); close(done) }()
	var out [][32]byte
	for r := 0; ; r = (r + 7) % runs {
		select {
		case <-done:
			return
		default:
		}
		ids := idsOf(r)
		out, _ = sc.Resolve(ids, out[:0])
		for i, d := range out {
			if d != digestOf(ids[i]) {
				t.Fatalf("run %d block %d: a digest filed under another id", r, i)
			}
		}
		if id, d, ok := sc.ByKey(uint64(r*runLen + 1)); ok && (id != ids[0] || d != digestOf(ids[0])) {
			t.Fatalf("run %d: key names another block", r)
		}
	}
}

// TestBlockHasherDigests: a run of blocks hashed from a parent gives the
// chain's digests, salted at a chain's start only.
func TestBlockHasherDigests(t *testing.T) {
	toks := make([]int32, 6*4+2)
	for i := range toks {
		toks[i] = int32(i*13 + 1)
	}
	for _, algo := range []string{AlgorithmSHA256CBOR, AlgorithmSHA256, AlgorithmXXHashCBOR, AlgorithmXXHash} {
		p := testProfile(t, algo)
		_, digs := referenceChain(p, 4, toks, "l", "s")
		var h BlockHasher
		if got := h.Digests(p, 4, nil, toks, "l", "s", nil); len(got) != 6 || got[0] != digs[0] || got[5] != digs[5] {
			t.Errorf("%s from the root: %d digests, want the chain's 6", algo, len(got))
		}
		if got := h.Digests(p, 4, &digs[1], toks[8:], "l", "s", nil); len(got) != 4 || got[0] != digs[2] || got[3] != digs[5] {
			t.Errorf("%s from block 1: %d digests, want the chain's last 4", algo, len(got))
		}
	}
}

// TestLinksKeepHints checks that the block hints filed with a run come back
// with its digests, that a block filed again refreshes its hint (the index
// may have moved it), and that blocks filed without hints give 0.
func TestLinksKeepHints(t *testing.T) {
	sc := NewLinks(8 << 20).Scope(testProfile(t, AlgorithmSHA256CBOR))
	ids := []LinkID{{Lo: 1, Hi: 1}, {Lo: 2, Hi: 2}, {Lo: 3, Hi: 3}}
	keys := []uint64{11, 12, 13}
	digs := [][32]byte{{1}, {2}, {3}}
	sc.Record(&LinkRun{IDs: ids[:2], Keys: keys[:2], Digs: digs[:2], Hints: []uint32{5, 6}}, nil)
	sc.Record(&LinkRun{IDs: ids[2:], Keys: keys[2:], Digs: digs[2:]}, nil)
	resolve := func() []uint32 { // the hints kept beside the blocks
		var hints []uint32
		for _, id := range ids {
			ch, off, ok := sc.l.cur.find(id)
			if !ok {
				t.Fatalf("block %v not held", id)
			}
			hints = append(hints, ch.hints[off])
		}
		return hints
	}
	if diff := cmp.Diff([]uint32{5, 6, 0}, resolve()); diff != "" {
		t.Errorf("hints (-want +got):\n%s", diff)
	}
	sc.Record(&LinkRun{IDs: ids, Keys: keys, Digs: digs, Hints: []uint32{5, 9, 7}, Known: len(ids)}, nil) // all held: hints refreshed
	if diff := cmp.Diff([]uint32{5, 9, 7}, resolve()); diff != "" {
		t.Errorf("refreshed hints (-want +got):\n%s", diff)
	}
	if l := sc.l.Len(); l != len(ids) {
		t.Errorf("%d links held, want %d", l, len(ids))
	}
}

// TestLinkWritersKeepRuns checks that two ingest streams whose events
// interleave each file their chain as one run (consecutive entries of one
// chunk, which a query walks with one lookup), and that blocks filed
// without a writer still resolve.
func TestLinkWritersKeepRuns(t *testing.T) {
	l := NewLinks(8 << 20)
	sc := l.Scope(testProfile(t, AlgorithmSHA256CBOR))
	const events, per = 4, 8
	chain := func(c uint64) ([]LinkID, []uint64, [][32]byte) {
		ids := make([]LinkID, events*per)
		keys := make([]uint64, len(ids))
		digs := make([][32]byte, len(ids))
		for i := range ids {
			ids[i] = LinkID{Lo: c<<32 | uint64(i), Hi: c<<32 | uint64(i) | 1<<63}
			keys[i] = c<<32 | uint64(i)
			digs[i][0], digs[i][1] = byte(c), byte(i)
		}
		return ids, keys, digs
	}
	var ws [2]LinkWriter
	var ids [3][]LinkID
	var keys [3][]uint64
	var digs [3][][32]byte
	for c := range ids {
		ids[c], keys[c], digs[c] = chain(uint64(c + 1))
	}
	for e := range events {
		for c := range ids {
			from, to := e*per, (e+1)*per
			var w *LinkWriter
			if c < len(ws) {
				w = &ws[c]
			} // chain 2 has no writer
			sc.Record(&LinkRun{IDs: ids[c][from:to], Keys: keys[c][from:to], Digs: digs[c][from:to]}, w)
		}
	}
	for c := range ids {
		got, _ := sc.Resolve(ids[c], nil)
		if diff := cmp.Diff(digs[c], got); diff != "" {
			t.Fatalf("chain %d (-want +got):\n%s", c, diff)
		}
	}
	g := l.cur
	for c := range ws {
		ch0, off0, ok := g.find(ids[c][0])
		for i, id := range ids[c] {
			ch, off, found := g.find(id)
			if !ok || !found || ch != ch0 || off != off0+i {
				t.Fatalf("chain %d block %d: not in its writer's run (chunk %p offset %d, run starts %p %d)", c, i, ch, off, ch0, off0)
			}
		}
	}
	// After Reset (the last context went) a writer's chunk belongs to
	// a generation that is gone: its next blocks go into the new one.
	l.Reset()
	sc.Record(&LinkRun{IDs: ids[0], Keys: keys[0], Digs: digs[0]}, &ws[0])
	if got, _ := sc.Resolve(ids[0], nil); len(got) != len(ids[0]) || l.Len() != len(ids[0]) {
		t.Fatalf("after Reset: %d of %d digests, %d links held", len(got), len(ids[0]), l.Len())
	}
	if ws[0].g != l.cur {
		t.Error("the writer still points into the generation Reset dropped")
	}
}

// TestTakeReadyIsNext checks that taking a chain's ready blocks in batches
// (TakeReady, as the index walk does) yields what calling Next for each
// would, memo-served and linked blocks alike, and leaves the chain where
// Next would: the blocks hashed after them, and every Digest, agree.
func TestTakeReadyIsNext(t *testing.T) {
	const bs, blocks = 4, 300 // more than a first link batch
	toks := make([]int32, blocks*bs+3)
	for i := range toks {
		toks[i] = int32(i*31 + 1)
	}
	p := testProfile(t, AlgorithmSHA256CBOR)
	keys, digs := referenceChain(p, bs, toks, "", "")
	for _, linked := range []int{0, 1, 17, 200, blocks} {
		for _, remembered := range []int{0, 5} {
			for _, batch := range []int{1, 3, 1000} {
				t.Run(fmt.Sprintf("linked=%d/memo=%d/batch=%d", linked, remembered, batch), func(t *testing.T) {
					l := NewLinks(1 << 20)
					record(l.Scope(p), bs, toks, "", "", keys, digs, linked)
					m := NewMemo(1 << 20)
					if remembered > 0 { // teach the memo a shorter chain
						c := AcquireChain()
						c.Reset(p, bs, toks[:remembered*bs], "", "")
						c.UseMemo(m)
						for _, _, ok := c.Next(); ok; _, _, ok = c.Next() {
						}
						ReleaseChain(c)
					}
					c := AcquireChain()
					defer ReleaseChain(c)
					c.Reset(p, bs, toks, "", "")
					c.UseMemo(m)
					c.UseLinks(l)
					var got []uint64
					var last []int // after which block each digest was read
					var gotDigs [][32]byte
					for {
						if r := c.Ready(); r > 0 {
							var covs []int
							var ks []uint64
							ks, covs, _ = c.TakeReady(min(r, batch), ks, covs, nil)
							for i, cov := range covs {
								if cov != bs {
									t.Fatalf("block %d covers %d", len(got)+i, cov)
								}
							}
							got = append(got, ks...)
							last, gotDigs = append(last, len(got)-1), append(gotDigs, c.Digest())
							continue
						}
						k, _, ok := c.Next()
						if !ok {
							break
						}
						got = append(got, k)
						last, gotDigs = append(last, len(got)-1), append(gotDigs, c.Digest())
					}
					if diff := cmp.Diff(keys, got); diff != "" {
						t.Fatalf("keys (-Next +TakeReady):\n%s", diff)
					}
					// Each Digest is that of the block taken last.
					for i, b := range last {
						if gotDigs[i] != digs[b] {
							t.Fatalf("Digest after block %d differs", b)
						}
					}
				})
			}
		}
	}
}

// TestLinksPrepareWithinBudget: the doubled slots Record prepares ahead
// of a grow are made only when they fit the generation's budget, and once
// per size: near the budget, every Record preparing them again (and
// throwing them away) would allocate a table per call.
func TestLinksPrepareWithinBudget(t *testing.T) {
	p := testProfile(t, AlgorithmSHA256CBOR)
	budget := 16 << 20
	l := NewLinks(budget)
	sc := l.Scope(p)
	rng := rand.New(rand.NewPCG(3, 4))
	ids := make([]LinkID, 5)
	keys := make([]uint64, 5)
	digs := make([][32]byte, 5)
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	before := ms.TotalAlloc
	const records = 80_000
	for range records {
		for j := range ids {
			ids[j] = LinkID{Lo: rng.Uint64(), Hi: rng.Uint64()}
			keys[j] = rng.Uint64()
		}
		sc.Record(&LinkRun{IDs: ids, Keys: keys, Digs: digs}, nil)
	}
	runtime.ReadMemStats(&ms)
	// Generations of 8 MiB turning over about six times, tables doubling
	// inside each: a few hundred MiB at most.
	if got := ms.TotalAlloc - before; got > 40*uint64(budget) {
		t.Fatalf("%d records of 5 blocks allocated %d MiB, want under %d", records, got>>20, 40*budget>>20)
	}
}

// TestFollowTakesOnlyItsChain: a query follows a run by its blocks' tokens
// only where the run's next block is the child of the one it matched. A
// writer that files another chain's blocks after a chain (even with the
// very tokens the chain goes on with) does not extend it, and a chain
// filed event by event stays one run.
func TestFollowTakesOnlyItsChain(t *testing.T) {
	const bs = 4
	p := testProfile(t, AlgorithmSHA256CBOR)
	toks := make([]int32, 8*bs)
	for i := range toks {
		toks[i] = int32(i*13 + 5)
	}
	keys, digs := referenceChain(p, bs, toks, "", "")
	// other starts a chain with the tokens of toks' block 4.
	other := slices.Clone(toks[4*bs : 6*bs])
	okeys, odigs := referenceChain(p, bs, other, "", "")
	l := NewLinks(8 << 20)
	sc := l.Scope(p)
	ids := func(toks []int32) (LinkID, []LinkID, []uint64) {
		root, buf := sc.Root("", "", nil)
		id := root
		var ids []LinkID
		var tids []uint64
		for b := 0; (b+1)*bs <= len(toks); b++ {
			id, buf = sc.Next(id, toks[b*bs:(b+1)*bs], buf)
			ids, tids = append(ids, id), append(tids, sc.TokensID(toks[b*bs:(b+1)*bs]))
		}
		return root, ids, tids
	}
	root, aIDs, aToks := ids(toks)
	_, oIDs, oToks := ids(other)
	var w LinkWriter
	sc.Record(&LinkRun{Parent: root, IDs: aIDs[:4], Keys: keys[:4], Digs: digs[:4], Toks: aToks[:4]}, &w)
	sc.Record(&LinkRun{Parent: root, IDs: oIDs, Keys: okeys, Digs: odigs, Toks: oToks}, &w)
	follow := func() []uint64 {
		var f Followed
		sc.Follow(root, toks, bs, &f, nil)
		return f.Keys
	}
	if diff := cmp.Diff(keys[:4], follow()); diff != "" {
		t.Fatalf("with another chain after its run (-want +got):\n%s", diff)
	}
	// The rest of the chain, filed by the same writer: a child of block 3
	// though not next to it, and then one run on.
	sc.Record(&LinkRun{Parent: aIDs[3], IDs: aIDs[4:], Keys: keys[4:], Digs: digs[4:], Toks: aToks[4:]}, &w)
	if diff := cmp.Diff(keys, follow()); diff != "" {
		t.Fatalf("whole chain (-want +got):\n%s", diff)
	}
	g := l.cur
	for i, want := range []bool{false, true, true, true, false, true, true, true} {
		ch, off, ok := g.find(aIDs[i])
		if !ok || ch.child[off] != want {
			t.Errorf("block %d: found %v, child %v, want %v", i, ok, ok && ch.child[off], want)
		}
	}
}
