package query

import (
	"fmt"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/rs/zerolog"
	"pgregory.net/rapid"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/contexts"
	"github.com/mooncake-conductor-go/conductor/internal/events"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
)

// Verification that waits (events.Config.LinkDefer): the blocks are stored
// at once and verified later, or shed when the wait is full. Neither may
// change an answer, and a late verification records what an immediate one
// would.

// withDefer rebuilds r's decoders with their verification waiting in at
// most deferBytes, on a fresh table.
func (r *linkRig) withDefer(deferBytes int) *linkRig {
	cat := contexts.New(index.New(index.Options{}))
	tbl := cat.Ensure(r.ctx, r.p).Table
	n := len(r.decs)
	r.decs = r.decs[:0]
	for i := range n {
		dec, err := events.New(events.Config{Type: sourcetype.VLLM, Profile: r.p, Context: r.ctx, Engine: tbl,
			Owner: tbl.AddEngineOwner(fmt.Sprintf("i%d", i), 0), Links: r.links, Logger: zerolog.Nop(), LinkDefer: deferBytes})
		if err != nil {
			r.t.Fatal(err)
		}
		r.decs = append(r.decs, dec)
	}
	r.on = New(Options{Contexts: cat, Links: r.links, Memo: hashing.NewMemo(1 << 20)})
	r.off = New(Options{Contexts: cat})
	return r
}

// verify runs up to maxBlocks of every decoder's waiting verification and
// reports whether any still waits.
func (r *linkRig) verify(maxBlocks int) bool {
	more := false
	for _, d := range r.decs {
		if d.(events.Verifier).VerifyPending(maxBlocks) {
			more = true
		}
	}
	return more
}

// TestLinksDeferredAnswerAsHashing is the property for waiting
// verification: random stores (salted, multimodal, integer or byte hashes,
// split at random, by several owners) whose verification waits in a
// random bound (often too small, so events are shed) and runs in random
// slices between them, with random queries at any point: links on and off
// answer alike. Once every waiting event is verified and none was shed,
// the links hold exactly what verifying each event as it was applied
// records.
func TestLinksDeferredAnswerAsHashing(t *testing.T) {
	var shed, late uint64
	rapid.Check(t, func(rt *rapid.T) {
		owners := rapid.IntRange(1, 3).Draw(rt, "owners")
		bound := rapid.SampledFrom([]int{64, 600, 3000, 1 << 20}).Draw(rt, "bound")
		r := newLinkRig(rt, hashing.AlgorithmSHA256CBOR, "", owners).withDefer(bound)
		inline := newLinkRig(rt, hashing.AlgorithmSHA256CBOR, "", owners)
		salts := []string{"", "", "s1"}
		base := rapid.SliceOfN(rapid.Int32Range(0, 5), 4, 24).Draw(rt, "base")
		var prompts [][]int32
		for range rapid.IntRange(1, 4).Draw(rt, "prompts") {
			suffix := rapid.SliceOfN(rapid.Int32Range(0, 5), 0, 20).Draw(rt, "suffix")
			prompts = append(prompts, append(append([]int32(nil), base...), suffix...))
		}
		query := func() {
			toks := prompts[rapid.IntRange(0, len(prompts)-1).Draw(rt, "qprompt")]
			toks = toks[:rapid.IntRange(0, len(toks)).Draw(rt, "cut")]
			salt := rapid.SampledFrom(salts).Draw(rt, "qsalt")
			want := r.lookup(r.off, toks, salt, "")
			got := r.lookup(r.on, toks, salt, "")
			if d := cmp.Diff(want.Instances, got.Instances); d != "" {
				rt.Fatalf("tokens %v salt %q: links on vs off (-off +on):\n%s", toks, salt, d)
			}
		}
		for range rapid.IntRange(1, 10).Draw(rt, "stores") {
			toks := prompts[rapid.IntRange(0, len(prompts)-1).Draw(rt, "prompt")]
			salt := rapid.SampledFrom(salts).Draw(rt, "salt")
			mm := rapid.IntRange(-1, 6).Draw(rt, "mm")
			keys, digs := r.chain(toks, salt, mm)
			owner := rapid.IntRange(0, owners-1).Draw(rt, "owner")
			bin := rapid.Bool().Draw(rt, "bin")
			for from := 0; from < len(keys); {
				to := rapid.IntRange(from+1, len(keys)).Draw(rt, "to")
				s := store{owner: owner, keys: keys[from:to], digests: digs[from:to], binHashes: bin,
					tokens: toks[from*r.ctx.BlockSize : to*r.ctx.BlockSize]}
				if from > 0 {
					s.parent, s.parentDig = &keys[from-1], &digs[from-1]
				}
				s.extraKeys = typedExtras(len(keys), mm, salt)[from:to]
				p := r.encode(s)
				r.applyPayload(owner, p)
				inline.applyPayload(owner, p)
				from = to
				switch rapid.IntRange(0, 4).Draw(rt, "then") {
				case 1:
					r.verify(rapid.IntRange(1, 8).Draw(rt, "slice"))
				case 2:
					query()
				case 3:
					for _, d := range r.decs {
						d.(events.Verifier).CatchUp() // as the subscriber does after each batch
					}
				}
			}
		}
		for range rapid.IntRange(0, 4).Draw(rt, "early") {
			query() // verification may still wait
		}
		pending := 0
		for _, d := range r.decs {
			pending += d.(events.Verifier).PendingLinks()
		}
		if int64(pending) != r.links.Pending() {
			rt.Fatalf("decoders hold %d waiting blocks, the links count %d", pending, r.links.Pending())
		}
		late += uint64(pending)
		for r.verify(rapid.IntRange(1, 8).Draw(rt, "slice")) {
		}
		if r.links.Pending() != 0 {
			rt.Fatalf("%d blocks still waiting after every verification ran", r.links.Pending())
		}
		for range rapid.IntRange(1, 6).Draw(rt, "queries") {
			query()
		}
		// Nothing moved in the index, so every link carries where its
		// block was stored, however late it was verified.
		for _, toks := range prompts {
			for _, salt := range salts {
				if _, carried, located := r.linkedHints(toks, salt); !slices.Equal(carried, located) {
					rt.Fatalf("tokens %v salt %q: hints carried %v, the blocks lie at %v", toks, salt, carried, located)
				}
			}
		}
		shed += r.links.Shed()
		if r.links.Shed() == 0 && r.links.Len() != inline.links.Len() {
			rt.Fatalf("late verification recorded %d links, immediate %d", r.links.Len(), inline.links.Len())
		}
	})
	if shed == 0 || late == 0 {
		t.Errorf("over all runs: %d blocks shed, %d verified late; want both", shed, late)
	}
}

// TestLinksPendingDropped: a retracted source's waiting verification goes
// with its entries, and DropPending forgets it; the count over all sources
// follows.
func TestLinksPendingDropped(t *testing.T) {
	r := newRig(t, hashing.AlgorithmSHA256CBOR, "", 2, 16, true).withDefer(1 << 20)
	toks := make([]int32, 8*16)
	for i := range toks {
		toks[i] = int32(i*5 + 3)
	}
	keys, digs := r.chain(toks, "", -1)
	for owner := range 2 {
		r.apply(store{owner: owner, keys: keys, digests: digs, tokens: toks})
	}
	if got := r.links.Pending(); got != 16 {
		t.Fatalf("%d blocks waiting, want 16", got)
	}
	r.decs[0].Retract()
	if got := r.links.Pending(); got != 8 || r.decs[0].(events.Verifier).PendingLinks() != 0 {
		t.Fatalf("after one source's retraction %d blocks waiting, want the other's 8", got)
	}
	r.decs[1].(events.Verifier).DropPending()
	if got := r.links.Pending(); got != 0 || r.links.Len() != 0 {
		t.Fatalf("after DropPending %d waiting, %d links; want none", got, r.links.Len())
	}
}
