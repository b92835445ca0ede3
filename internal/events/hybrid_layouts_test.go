package events

import (
	"fmt"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
	"pgregory.net/rapid"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
	"github.com/rs/zerolog"
)

// The hybrid layouts as vLLM forms them, end to end through the decoder:
// each group publishes its own blocks as map-encoded vLLM events (block
// size the group's, keys the chained hashes at hash-block granularity),
// a real index table takes them, and its answers are compared with a
// reference computed here by brute force from what each group holds
// (docs/hybrid.md#rules: the largest aligned length at which every
// group's rule holds).

// vllmGroup is one KV-cache group of a layout under test.
type vllmGroup struct {
	kind   string // kv_cache_spec_kind on the wire
	block  int
	window int // sliding kinds
}

// rule is the family the reference applies to the group: uncached groups
// are skipped, unknown kinds hold nothing (their events are ignored), and
// chunked local attention without a declaration gets the full-attention
// rule.
func (g vllmGroup) rule() string {
	switch g.kind {
	case "sliding_window", "sliding_window_mla":
		return "sliding"
	case "mamba":
		return "mamba"
	case "cross_attention", "encoder_only_attention":
		return "uncached"
	case "full_attention", "mla_attention", "sink_full_attention", "chunked_local_attention":
		return "full"
	}
	return "unknown"
}

// layoutRef is what each group of one owner holds, by hash-block index of
// the block's last hash block, and answers by brute force.
type layoutRef struct {
	hbs    int
	groups []vllmGroup
	held   []map[int]bool // per group: key index j = t/hbs - 1
}

func (r *layoutRef) answer(agree, m int) int {
	align := r.hbs
	for _, g := range r.groups {
		if g.rule() != "uncached" {
			align = align / gcdInt(align, g.block) * g.block
		}
	}
	has := func(gi, t int) bool { return t <= agree && r.held[gi][t/r.hbs-1] }
	all := func(gi, from, to int) bool { // blocks from..to, 1-based
		for k := from; k <= to; k++ {
			if !has(gi, k*r.groups[gi].block) {
				return false
			}
		}
		return true
	}
	cached := 0
	for _, g := range r.groups {
		if g.rule() != "uncached" {
			cached++
		}
	}
	if cached == 0 {
		return 0
	}
	for l := m - m%align; l > 0; l -= align {
		ok := true
		for gi, g := range r.groups {
			b, nb := g.block, l/g.block
			switch g.rule() {
			case "uncached":
			case "unknown":
				ok = false
			case "sliding":
				need := max(1, (g.window-1+b-1)/b)
				ok = all(gi, max(1, nb-need+1), nb)
			case "mamba":
				ok = has(gi, l)
			default:
				ok = all(gi, 1, nb)
			}
			if !ok {
				break
			}
		}
		if ok {
			return l
		}
	}
	return 0
}

func gcdInt(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// sliceChain is a query's keys for index.Table.Query.
type sliceChain struct {
	keys []uint64
	hbs  int
	i    int
}

func (c *sliceChain) Next() (uint64, int, bool) {
	if c.i >= len(c.keys) {
		return 0, 0, false
	}
	c.i++
	return c.keys[c.i-1], c.hbs, true
}

// fataler is what the harness needs of a *testing.T or a *rapid.T.
type fataler interface {
	Helper()
	Fatalf(format string, args ...any)
}

// layoutHarness is one owner of a hybrid layout fed through a vLLM decoder.
type layoutHarness struct {
	t      fataler
	ref    layoutRef
	tbl    *index.Table
	owner  index.OwnerID
	dec    Decoder
	tokens []int32
	keys   []uint64 // key j covers the first (j+1)·hbs tokens
	out    []Outcome
}

func (h *layoutHarness) Report(i int, res Result, why Reason) {
	h.out = append(h.out, Outcome{Index: i, Result: res, Reason: why})
}

func newLayoutHarness(t fataler, prof hashing.Profile, groups []vllmGroup, hashBlocks int) *layoutHarness {
	hbs := 0
	for _, g := range groups {
		hbs = gcdInt(hbs, g.block)
	}
	ix := index.New(index.Options{Stripes: 4})
	ctx := index.ContextKey{Model: "m", BlockSize: hbs}
	tbl := ix.EnsureTable(ctx)
	h := &layoutHarness{t: t, tbl: tbl, owner: tbl.AddEngineOwner("hybrid", 0),
		ref: layoutRef{hbs: hbs, groups: groups, held: make([]map[int]bool, len(groups))}}
	for i := range h.ref.held {
		h.ref.held[i] = map[int]bool{}
	}
	h.tokens = make([]int32, hashBlocks*hbs)
	for i := range h.tokens {
		h.tokens[i] = int32(1000 + i)
	}
	h.keys = eventtest.ChainKeys(&prof, hbs, h.tokens)
	dec, err := New(Config{Type: sourcetype.VLLM, Profile: prof, Context: ctx, Owner: h.owner, Engine: tbl, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatalf("decoder: %v", err)
	}
	h.dec = dec
	return h
}

// stored is group gi's BlockStored of its blocks first..last (0-based),
// keeping only those keep says (sparse kinds may skip blocks).
func (h *layoutHarness) stored(gi, first, last int, keep func(int) bool) (map[string]any, []int) {
	g := h.ref.groups[gi]
	var hashes []uint64
	var js []int
	for k := first; k <= last; k++ {
		if keep != nil && !keep(k) {
			continue
		}
		j := (k+1)*g.block/h.ref.hbs - 1
		hashes, js = append(hashes, h.keys[j]), append(js, j)
	}
	ev := map[string]any{"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": nil,
		"token_ids": h.tokens[first*g.block : (last+1)*g.block], "block_size": g.block, "lora_id": nil,
		"medium": "GPU", "lora_name": nil, "group_idx": gi, "kv_cache_spec_kind": g.kind}
	if g.window > 0 {
		ev["kv_cache_spec_sliding_window"] = g.window
	}
	return ev, js
}

// send applies one batch and returns its outcomes.
func (h *layoutHarness) send(evs ...map[string]any) []Outcome {
	h.t.Helper()
	h.out = h.out[:0]
	payload, err := msgpack.Marshal([]any{1.5, evs, 0})
	if err != nil {
		h.t.Fatalf("encode: %v", err)
	}
	if rej := h.dec.Decode(payload); rej != ReasonNone {
		h.t.Fatalf("batch rejected: %v", rej)
	}
	applyTo(h.dec, h)
	h.dec.Forget()
	return append([]Outcome(nil), h.out...)
}

// wantResult is the outcome a group's events must have.
func (h *layoutHarness) wantResult(gi int) (Result, Reason) {
	switch h.ref.groups[gi].rule() {
	case "uncached":
		return Ignored, IgnUncachedGroup
	case "unknown":
		return Ignored, IgnUnknownKind
	}
	return Applied, ReasonNone
}

func (h *layoutHarness) checkOutcome(gi int, out []Outcome) error {
	res, why := h.wantResult(gi)
	if len(out) != 1 || out[0].Result != res || out[0].Reason != why {
		return fmt.Errorf("group %d (%+v): outcomes %v, want %v/%v", gi, h.ref.groups[gi], out, res, why)
	}
	return nil
}

// store sends group gi's blocks first..last and records them.
func (h *layoutHarness) store(gi, first, last int, keep func(int) bool) error {
	ev, js := h.stored(gi, first, last, keep)
	if err := h.checkOutcome(gi, h.send(ev)); err != nil {
		return err
	}
	h.record(gi, js)
	return nil
}

func (h *layoutHarness) record(gi int, js []int) {
	if res, _ := h.wantResult(gi); res == Applied {
		for _, j := range js {
			h.ref.held[gi][j] = true
		}
	}
}

// storeAll sends, in one batch as vLLM does for a scheduling step, every
// group's blocks up to tokens (whole blocks of each group).
func (h *layoutHarness) storeAll(tokens int) error {
	var evs []map[string]any
	var js [][]int
	for gi, g := range h.ref.groups {
		ev, j := h.stored(gi, 0, tokens/g.block-1, nil)
		evs, js = append(evs, ev), append(js, j)
	}
	out := h.send(evs...)
	if len(out) != len(evs) {
		return fmt.Errorf("outcomes %v", out)
	}
	for gi := range h.ref.groups {
		if err := h.checkOutcome(gi, out[gi:gi+1]); err != nil {
			return err
		}
		h.record(gi, js[gi])
	}
	return nil
}

// remove sends group gi's removal of its block k.
func (h *layoutHarness) remove(gi, k int) error {
	j := (k+1)*h.ref.groups[gi].block/h.ref.hbs - 1
	out := h.send(map[string]any{"type": "BlockRemoved", "block_hashes": []uint64{h.keys[j]}, "medium": "GPU", "group_idx": gi})
	if err := h.checkOutcome(gi, out); err != nil {
		return err
	}
	delete(h.ref.held[gi], j)
	return nil
}

// query asks for the prompt's first n hash blocks, of which the first
// agree are the prompt's own, and compares with the reference.
func (h *layoutHarness) query(n, agree int) error {
	q := append([]uint64(nil), h.keys[:n]...)
	for j := agree; j < n; j++ {
		q[j] ^= 0x9e3779b97f4a7c15
	}
	var res index.QueryResult
	h.tbl.Query(&sliceChain{keys: q, hbs: h.ref.hbs}, "", &res)
	got := 0
	if len(res.Instances) == 1 {
		got = res.Instances[0].Max.Device
	}
	if want := h.ref.answer(agree*h.ref.hbs, n*h.ref.hbs); got != want {
		return fmt.Errorf("layout %+v (hash block %d), prompt %d hash blocks (%d agree): device %d, reference %d",
			h.ref.groups, h.ref.hbs, n, agree, got, want)
	}
	return nil
}

// TestHybridLayoutsThroughEvents: fixed layouts first (group 0 of full
// attention or MLA above the hash block size beside a group at it, which
// were rejected as block_size; uncached and unknown kinds beside them),
// then random ones: every group's events are applied or ignored as their
// kind says, and the table answers what the reference computes.
func TestHybridLayoutsThroughEvents(t *testing.T) {
	prof := eventtest.VLLMProfile(t)
	fixed := []struct {
		name   string
		groups []vllmGroup
		want   int // the whole prompt cached in every group
	}{
		{"FA B64 beside SWA B16", []vllmGroup{{"full_attention", 64, 0}, {"sliding_window", 16, 128}}, 384},
		{"MLA B48 beside FA B16", []vllmGroup{{"mla_attention", 48, 0}, {"full_attention", 16, 0}}, 384},
		{"sink FA B32 beside Mamba B16", []vllmGroup{{"sink_full_attention", 32, 0}, {"mamba", 16, 0}}, 384},
		{"FA B64 and cross attention B16", []vllmGroup{{"full_attention", 64, 0}, {"cross_attention", 16, 0}}, 384},
		{"FA B16 and an unknown kind", []vllmGroup{{"full_attention", 16, 0}, {"some_future_kind", 16, 0}}, 0},
	}
	for _, tc := range fixed {
		t.Run(tc.name, func(t *testing.T) {
			h := newLayoutHarness(t, prof, tc.groups, 400/16)
			if err := h.storeAll(len(h.tokens)); err != nil {
				t.Fatal(err)
			}
			if err := h.query(len(h.keys), len(h.keys)); err != nil {
				t.Fatal(err)
			}
			// the reference agrees with the figure worked out by hand
			if got := h.ref.answer(len(h.tokens), len(h.tokens)); got != tc.want {
				t.Fatalf("reference %d, want %d", got, tc.want)
			}
			// one block of group 0 goes: full attention stops before it
			if err := h.remove(0, 2); err != nil {
				t.Fatal(err)
			}
			for n := 0; n <= len(h.keys); n++ {
				if err := h.query(n, n); err != nil {
					t.Fatal(err)
				}
			}
		})
	}

	kinds := []string{"full_attention", "mla_attention", "sink_full_attention", "sliding_window", "sliding_window_mla",
		"mamba", "chunked_local_attention", "cross_attention", "encoder_only_attention", "some_future_kind"}
	rapid.Check(t, func(rt *rapid.T) {
		unit := rapid.SampledFrom([]int{4, 16}).Draw(rt, "unit")
		var groups []vllmGroup
		for range rapid.IntRange(1, 4).Draw(rt, "groups") {
			g := vllmGroup{kind: rapid.SampledFrom(kinds).Draw(rt, "kind"), block: unit * rapid.SampledFrom([]int{1, 1, 2, 3, 4}).Draw(rt, "mult")}
			if g.rule() == "sliding" {
				g.window = rapid.IntRange(1, 3*g.block).Draw(rt, "window")
			}
			groups = append(groups, g)
		}
		h := newLayoutHarness(rt, prof, groups, 24)
		nblocks := func(gi int) int { return len(h.tokens) / groups[gi].block }
		// every group announces its first block in one batch, as vLLM's
		// groups of one scheduling step do, so the learned layout is the
		// whole one
		maxBlock := 0
		for _, g := range groups {
			maxBlock = max(maxBlock, g.block)
		}
		if err := h.storeAll(maxBlock); err != nil {
			rt.Fatal(err)
		}
		for range rapid.IntRange(0, 40).Draw(rt, "ops") {
			gi := rapid.IntRange(0, len(groups)-1).Draw(rt, "group")
			k := rapid.IntRange(0, nblocks(gi)-1).Draw(rt, "block")
			var err error
			if rapid.IntRange(0, 3).Draw(rt, "op") > 0 {
				last := min(nblocks(gi)-1, k+rapid.IntRange(0, 8).Draw(rt, "run"))
				var keep func(int) bool
				if r := groups[gi].rule(); r == "sliding" || r == "mamba" {
					// sparse kinds announce some blocks of the span only
					skip := rapid.IntRange(1, 4).Draw(rt, "sparse")
					keep = func(b int) bool { return b == last || b%skip == 0 }
				}
				err = h.store(gi, k, last, keep)
			} else {
				err = h.remove(gi, k)
			}
			if err != nil {
				rt.Fatal(err)
			}
		}
		for range 4 {
			n := rapid.IntRange(0, len(h.keys)).Draw(rt, "prompt")
			if err := h.query(n, rapid.IntRange(0, n).Draw(rt, "agree")); err != nil {
				rt.Fatal(err)
			}
		}
	})
}

// TestGroup0AboveTheBlockSizeNeedsAnotherGroup: a dense model registered
// with a block size below the engine's publishes group 0 of full attention
// at its own size and no other group: rejected as block_size, as it always
// was (its keys are hashed at 32, queries at 16). Beside a group that makes
// 16 the gcd, in the same batch or known from the table's layout (a
// restart, a declaration), the same event is a hybrid's and is applied.
func TestGroup0AboveTheBlockSizeNeedsAnotherGroup(t *testing.T) {
	prof := eventtest.VLLMProfile(t)
	dense := newLayoutHarness(t, prof, []vllmGroup{{"full_attention", 32, 0}, {"sliding_window", 16, 64}}, 8)
	ev, _ := dense.stored(0, 0, 3, nil)
	if out := dense.send(ev); len(out) != 1 || out[0].Result != Rejected || out[0].Reason != EvBlockSize {
		t.Fatalf("group 0 at 32 alone, registered 16: %v", out)
	}
	// the same owner's sliding group appears: from then on group 0 at 32
	// is a hybrid's
	if err := dense.storeAll(128); err != nil {
		t.Fatal(err)
	}
	if err := dense.store(0, 0, 3, nil); err != nil {
		t.Fatal(err)
	}
	// a fresh decoder (a restart) whose table already has the layout
	h := newLayoutHarness(t, prof, []vllmGroup{{"full_attention", 32, 0}, {"sliding_window", 16, 64}}, 8)
	h.tbl.SetLayout(h.owner, []index.GroupSpec{{Kind: index.KindFull, BlockSize: 32}, {Kind: index.KindSliding, BlockSize: 16, SlidingWindow: 64}})
	if err := h.store(0, 0, 3, nil); err != nil {
		t.Fatal(err)
	}
}
