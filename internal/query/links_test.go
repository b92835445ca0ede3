package query

import (
	"bytes"
	"fmt"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/rs/zerolog"
	"github.com/vmihailenco/msgpack/v5"
	"pgregory.net/rapid"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/contexts"
	"github.com/mooncake-conductor-go/conductor/internal/events"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/racebuild"
)

// The verified links (hashing.Links) are fed by the real vLLM decoder here,
// as the service feeds them, and the same index is queried by an engine
// that follows them and one that hashes every block: their answers must
// be identical.

type nopReporter struct{ applied, rejected int }

func (r *nopReporter) Report(_ int, res events.Result, _ events.Reason) {
	switch res {
	case events.Applied:
		r.applied++
	case events.Rejected:
		r.rejected++
	}
}

// linkRig is one table with several vLLM owners, each with its decoder
// feeding links, and the two engines.
type linkRig struct {
	t       failer
	p       hashing.Profile
	ctx     index.ContextKey
	links   *hashing.Links
	decs    []events.Decoder
	owners  []index.OwnerID
	on, off *Engine
	rep     nopReporter
	enc     *msgpack.Encoder
	buf     bytes.Buffer
}

// failer is what both *testing.T and *rapid.T offer.
type failer interface {
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

func newLinkRig(t failer, algo, lora string, owners int) *linkRig {
	return newRig(t, algo, lora, owners, 4, true)
}

func newRig(t failer, algo, lora string, owners, bs int, links bool) *linkRig {
	seed := "0"
	p, err := hashing.Resolve(hashing.Spec{Strategy: hashing.StrategyVLLMV1, Algorithm: algo, IndexProjection: hashing.ProjectionLow64BE, PythonHashSeed: &seed})
	if err != nil {
		t.Fatal(err)
	}
	r := &linkRig{t: t, p: p, ctx: index.ContextKey{Tenant: "default", Model: "m", Lora: lora, BlockSize: bs}}
	if links {
		r.links = hashing.NewLinks(256 << 20)
	}
	cat := contexts.New(index.New(index.Options{}))
	tbl := cat.Ensure(r.ctx, p).Table
	for i := range owners {
		r.owners = append(r.owners, tbl.AddEngineOwner(fmt.Sprintf("i%d", i), 0))
		dec, err := events.New(events.Config{Type: sourcetype.VLLM, Profile: p, Context: r.ctx, Engine: tbl,
			Owner: r.owners[i], Links: r.links, Logger: zerolog.Nop()})
		if err != nil {
			t.Fatal(err)
		}
		r.decs = append(r.decs, dec)
	}
	// The links with the prefix memo, as the service runs them, against
	// hashing every block.
	r.on = New(Options{Contexts: cat, Links: r.links, Memo: hashing.NewMemo(1 << 20)})
	r.off = New(Options{Contexts: cat})
	r.enc = msgpack.NewEncoder(&r.buf)
	r.enc.UseCompactInts(true)
	return r
}

// store is one BlockStored event as a vLLM engine publishes it.
type store struct {
	owner      int
	keys       []uint64
	digests    [][32]byte // published as bytes when binHashes
	parent     *uint64
	parentDig  *[32]byte
	tokens     []int32 // nil: token_ids nil
	binHashes  bool
	extraKeys  []any // nil: extra_keys nil
	omitTokens bool
}

func (r *linkRig) apply(s store) { r.applyPayload(s.owner, r.encode(s)) }

// applyPayload decodes and applies one batch as the subscriber does.
func (r *linkRig) applyPayload(owner int, payload []byte) {
	dec := r.decs[owner]
	if why := dec.Decode(payload); why != events.ReasonNone {
		r.t.Fatalf("envelope rejected: %v", why)
	}
	for i := range dec.Apply() {
		res, why := dec.Outcome(i)
		r.rep.Report(i, res, why)
	}
	dec.Forget()
}

// encode packs s as a vLLM batch of one event, as Python's msgpack does.
func (r *linkRig) encode(s store) []byte {
	lora := any(nil)
	loraID := any(nil)
	if r.ctx.Lora != "" {
		lora, loraID = r.ctx.Lora, 1
	}
	var hashes any = s.keys
	var parent any
	if s.parent != nil {
		parent = *s.parent
	}
	if s.binHashes {
		h := make([][]byte, len(s.digests))
		for i := range s.digests {
			h[i] = s.digests[i][:]
		}
		hashes = h
		if s.parentDig != nil {
			parent = s.parentDig[:]
		}
	}
	var toks any = s.tokens
	if s.omitTokens {
		toks = nil
	}
	ev := map[string]any{"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
		"token_ids": toks, "block_size": r.ctx.BlockSize, "lora_id": loraID, "medium": "GPU", "lora_name": lora}
	if s.extraKeys != nil {
		ev["extra_keys"] = s.extraKeys
	}
	r.buf.Reset()
	if err := r.enc.Encode([]any{1.5, []any{ev}, 0}); err != nil {
		r.t.Fatal(err)
	}
	return bytes.Clone(r.buf.Bytes())
}

// chain is the engine's view of a prompt: every full block's key and
// digest under salt, with multimodal blocks from mm on hashed with keys a
// query cannot know (mm < 0: none).
func (r *linkRig) chain(toks []int32, salt string, mm int) ([]uint64, [][32]byte) {
	c := hashing.AcquireChain()
	defer hashing.ReleaseChain(c)
	c.Reset(&r.p, r.ctx.BlockSize, toks, r.ctx.Lora, salt)
	var keys []uint64
	var digs [][32]byte
	for i := 0; ; i++ {
		k, _, ok := c.Next()
		if !ok {
			return keys, digs
		}
		d := c.Digest()
		if mm >= 0 && i >= mm {
			// The image hash entered this block, so it and every
			// block after it hash differently.
			d[0] ^= 0x5a
			d[31] ^= byte(i + 1)
			d[24] ^= 0xa5
			k = uint64(d[24])<<56 | uint64(d[25])<<48 | uint64(d[26])<<40 | uint64(d[27])<<32 |
				uint64(d[28])<<24 | uint64(d[29])<<16 | uint64(d[30])<<8 | uint64(d[31])
		}
		keys, digs = append(keys, k), append(digs, d)
	}
}

func (r *linkRig) lookup(e *Engine, toks []int32, salt, instance string) *Result {
	res := &Result{}
	if _, err := e.Lookup(&Request{Context: r.ctx, Instance: instance, CacheSalt: salt, Tokens: toks}, res); err != nil {
		r.t.Fatal(err)
	}
	return res
}

// TestLinksAnswerAsHashing is the property: random stores (with and
// without token ids, salted, with a LoRA, with multimodal blocks that fail
// verification, hashes as integers or bytes, split into events at random
// points, chained by key or by digest) and random queries (stored prompts,
// their prefixes and extensions, other salts, instance filters) give the
// same answer with the links on and off.
// typedExtras is the extra_keys of a chain of n blocks as vLLM types them:
// the salt in block 0's (when salt is not ""), an image hash in block mm's
// (-1: none), nil for the other blocks.
func typedExtras(n, mm int, salt string) []any {
	ek := make([]any, n)
	for i := range ek {
		var items []any
		if i == 0 && salt != "" {
			items = append(items, map[string]any{"type": "cache_salt", "salt": salt})
		}
		if i == mm {
			items = append(items, map[string]any{"type": "mm", "hash": "img"})
		}
		if items != nil {
			ek[i] = items
		}
	}
	return ek
}

// linkedHints follows the links for toks (under salt and the rig's LoRA)
// as a query's chain does and returns the keys they serve, the block
// hints those carry, and the hints the table gives for the keys now.
func (r *linkRig) linkedHints(toks []int32, salt string) (ready []uint64, carried, located []uint32) {
	ch := hashing.AcquireChain()
	defer hashing.ReleaseChain(ch)
	ch.Reset(&r.p, r.ctx.BlockSize, toks, r.ctx.Lora, salt)
	ch.UseLinks(r.links)
	for n := ch.Ready(); n > 0; n = ch.Ready() {
		ready, _, carried = ch.TakeReady(n, ready, nil, carried)
	}
	located = make([]uint32, len(ready))
	r.on.opts.Contexts.Get(r.ctx).Table.Locate(ready, located)
	return ready, carried, located
}

func TestLinksAnswerAsHashing(t *testing.T) {
	var hits, answered uint64 // over all runs, so the property is not vacuous
	rapid.Check(t, func(rt *rapid.T) {
		algo := rapid.SampledFrom([]string{hashing.AlgorithmSHA256CBOR, hashing.AlgorithmSHA256}).Draw(rt, "algo")
		lora := rapid.SampledFrom([]string{"", "adapter"}).Draw(rt, "lora")
		owners := rapid.IntRange(1, 3).Draw(rt, "owners")
		r := newLinkRig(rt, algo, lora, owners)
		salts := []string{"", "", "s1", "s2"}
		// Prompts share openings, as a system prompt is shared.
		bases := rapid.SliceOfN(rapid.SliceOfN(rapid.Int32Range(0, 5), 4, 24), 1, 3).Draw(rt, "bases")
		var prompts [][]int32
		for range rapid.IntRange(1, 6).Draw(rt, "prompts") {
			b := bases[rapid.IntRange(0, len(bases)-1).Draw(rt, "base")]
			suffix := rapid.SliceOfN(rapid.Int32Range(0, 5), 0, 20).Draw(rt, "suffix")
			prompts = append(prompts, append(append([]int32(nil), b...), suffix...))
		}
		for range rapid.IntRange(1, 12).Draw(rt, "stores") {
			toks := prompts[rapid.IntRange(0, len(prompts)-1).Draw(rt, "prompt")]
			salt := rapid.SampledFrom(salts).Draw(rt, "salt")
			mm := rapid.IntRange(-1, 6).Draw(rt, "mm")
			keys, digs := r.chain(toks, salt, mm)
			if len(keys) == 0 {
				continue
			}
			owner := rapid.IntRange(0, owners-1).Draw(rt, "owner")
			bin := rapid.Bool().Draw(rt, "bin")
			extras := rapid.SampledFrom([]string{"typed", "nil", "none"}).Draw(rt, "extras")
			omit := rapid.IntRange(0, 5).Draw(rt, "omitTokens") == 0
			// The chain goes out in events split at random points.
			for from := 0; from < len(keys); {
				to := rapid.IntRange(from+1, len(keys)).Draw(rt, "to")
				s := store{owner: owner, keys: keys[from:to], digests: digs[from:to], binHashes: bin,
					tokens: toks[from*r.ctx.BlockSize : to*r.ctx.BlockSize], omitTokens: omit}
				if from > 0 {
					s.parent, s.parentDig = &keys[from-1], &digs[from-1]
				}
				switch extras {
				case "typed":
					s.extraKeys = typedExtras(len(keys), mm, salt)[from:to]
				case "nil":
					s.extraKeys = make([]any, to-from) // one nil per block: no extras said
				}
				r.apply(s)
				from = to
			}
		}
		if r.rep.rejected != 0 {
			rt.Fatalf("%d events rejected", r.rep.rejected)
		}
		// The index moves on after ingest: blocks evicted, some stored
		// again elsewhere in their slabs, so the hints the links took
		// go stale (the links keep them; answers must not change).
		tbl := r.on.opts.Contexts.Get(r.ctx).Table
		for range rapid.IntRange(0, 12).Draw(rt, "evictions") {
			toks := prompts[rapid.IntRange(0, len(prompts)-1).Draw(rt, "eprompt")]
			keys, _ := r.chain(toks, rapid.SampledFrom(salts).Draw(rt, "esalt"), -1)
			if len(keys) == 0 {
				continue
			}
			k := keys[rapid.IntRange(0, len(keys)-1).Draw(rt, "eblock")]
			o := r.owners[rapid.IntRange(0, owners-1).Draw(rt, "eowner")]
			tbl.Remove(o, index.Put{Key: k, Tier: index.Device})
			if rapid.Bool().Draw(rt, "again") {
				tbl.Store(o, index.Put{Key: k, Tier: index.Device})
			}
		}
		for range rapid.IntRange(1, 10).Draw(rt, "queries") {
			toks := prompts[rapid.IntRange(0, len(prompts)-1).Draw(rt, "qprompt")]
			switch rapid.IntRange(0, 2).Draw(rt, "shape") {
			case 1:
				toks = toks[:rapid.IntRange(0, len(toks)).Draw(rt, "cut")]
			case 2:
				toks = append(append([]int32(nil), toks...), rapid.SliceOfN(rapid.Int32Range(0, 5), 1, 8).Draw(rt, "ext")...)
			}
			salt := rapid.SampledFrom(salts).Draw(rt, "qsalt")
			inst := rapid.SampledFrom([]string{"", "i0", "i1"}).Draw(rt, "instance")
			want := r.lookup(r.off, toks, salt, inst)
			got := r.lookup(r.on, toks, salt, inst)
			if d := cmp.Diff(want.Instances, got.Instances); d != "" {
				rt.Fatalf("tokens %v salt %q instance %q: links on vs off (-off +on):\n%s", toks, salt, inst, d)
			}
			for _, in := range want.Instances {
				if in.Max.Disk > 0 {
					answered++
				}
			}
		}
		h, _, _ := r.links.Stats()
		hits += h
	})
	if hits == 0 || answered == 0 {
		t.Errorf("over all runs: %d blocks taken from links, %d owners with hits", hits, answered)
	}
	t.Logf("%d blocks taken from links, %d owners with hits", hits, answered)
}

// TestLinksFromIngest: which stored blocks become links, seen through a
// query's chain — every block of plain, salted and LoRA prompts chained by
// key or by digest, none after a multimodal block or of a store without
// token ids, none under another salt, and none when the engine hashes
// differently (here: another profile's keys).
func TestLinksFromIngest(t *testing.T) {
	toks := make([]int32, 10*4)
	for i := range toks {
		toks[i] = int32(i % 7)
	}
	cases := []struct {
		name      string
		lora      string
		salt      string // the engine's
		querySalt string
		mm        int
		bin       bool
		omit      bool
		extras    bool
		other     bool // the engine hashes with another seed
		want      int  // blocks a query takes from links
	}{
		{name: "plain", mm: -1, want: 10},
		{name: "plain, digests as bytes", mm: -1, bin: true, want: 10},
		{name: "lora", lora: "adapter", mm: -1, want: 10},
		{name: "salted, typed extras", salt: "s", querySalt: "s", mm: -1, extras: true, want: 10},
		{name: "salted, extras not said", salt: "s", querySalt: "s", mm: -1, want: 0},
		{name: "salted store, unsalted query", salt: "s", mm: -1, extras: true, want: 0},
		{name: "multimodal block 4", mm: 4, extras: true, want: 4},
		{name: "multimodal block 0", mm: 0, extras: true, want: 0},
		{name: "no token ids", mm: -1, omit: true, want: 0},
		{name: "another profile", mm: -1, other: true, want: 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newLinkRig(t, hashing.AlgorithmSHA256CBOR, tc.lora, 1)
			keys, digs := r.chain(toks, tc.salt, tc.mm)
			if tc.other {
				o := newLinkRig(t, hashing.AlgorithmSHA256, tc.lora, 1)
				keys, digs = o.chain(toks, tc.salt, tc.mm)
			}
			for _, span := range [][2]int{{0, 3}, {3, 4}, {4, 10}} {
				s := store{keys: keys[span[0]:span[1]], digests: digs[span[0]:span[1]], tokens: toks[span[0]*4 : span[1]*4],
					binHashes: tc.bin, omitTokens: tc.omit}
				if span[0] > 0 {
					s.parent, s.parentDig = &keys[span[0]-1], &digs[span[0]-1]
				}
				if tc.extras {
					s.extraKeys = typedExtras(10, tc.mm, tc.salt)[span[0]:span[1]]
				}
				r.apply(s)
			}
			if r.rep.rejected != 0 {
				t.Fatalf("%d events rejected", r.rep.rejected)
			}
			want := r.lookup(r.off, toks, tc.querySalt, "")
			got := r.lookup(r.on, toks, tc.querySalt, "")
			if d := cmp.Diff(want.Instances, got.Instances); d != "" {
				t.Fatalf("links on vs off (-off +on):\n%s", d)
			}
			if hits, _, _ := r.links.Stats(); int(hits) != tc.want {
				t.Errorf("the query took %d blocks from links, want %d", hits, tc.want)
			}
			// Linked blocks carry where ingest saw them in the index
			// (index.BatchChain); hashed ones carry none.
			ready, carried, located := r.linkedHints(toks, tc.querySalt)
			if len(ready) != tc.want {
				t.Fatalf("%d blocks ready, want %d", len(ready), tc.want)
			}
			if d := cmp.Diff(located, carried, cmpopts.EquateEmpty()); d != "" || slices.Contains(carried, 0) {
				t.Errorf("hints of linked blocks (-located +carried):\n%s", d)
			}
		})
	}
}

// TestLinkedLookupAllocations: a lookup whose every block comes from the
// links allocates nothing once the pooled chain's buffers have grown.
func TestLinkedLookupAllocations(t *testing.T) {
	if racebuild.Enabled {
		t.Skip("allocation counts need a normal build")
	}
	r := newRig(t, hashing.AlgorithmSHA256CBOR, "", 1, 16, true)
	toks := make([]int32, 64*16)
	for i := range toks {
		toks[i] = int32(i*7 + 1)
	}
	keys, digs := r.chain(toks, "", -1)
	for from := 0; from < 64; from += 16 {
		s := store{keys: keys[from : from+16], digests: digs[from : from+16], tokens: toks[from*16 : (from+16)*16]}
		if from > 0 {
			s.parent = &keys[from-1]
		}
		r.apply(s)
	}
	e := New(Options{Contexts: r.on.opts.Contexts, Links: r.links})
	req := &Request{Context: r.ctx, Tokens: toks}
	res := &Result{}
	if _, err := e.Lookup(req, res); err != nil || len(res.Instances) != 1 || res.Instances[0].Max.Device != len(toks) {
		t.Fatalf("lookup: %v %+v", err, res.Instances)
	}
	h0, _, _ := r.links.Stats()
	allocs := testing.AllocsPerRun(50, func() {
		if _, err := e.Lookup(req, res); err != nil {
			t.Fatal(err)
		}
	})
	if h1, _, _ := r.links.Stats(); h1-h0 < 50*64 {
		t.Fatalf("%d blocks from links over 50 lookups, want all %d", h1-h0, 50*64)
	}
	// sync.Pool may drop the chain under GC; allow a fraction.
	if allocs > 0.1 {
		t.Errorf("%.2f allocations per linked lookup, want 0", allocs)
	}
}
