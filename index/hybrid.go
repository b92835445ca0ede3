package index

import "slices"

// The hybrid hit rules (docs/hybrid.md#rules): what vLLM's hybrid prefix
// cache would hit for a prompt, given which of an owner's KV-cache groups
// hold the key at each hash-block boundary.

type ruleKind uint8

const (
	ruleFull ruleKind = iota
	ruleSliding
	ruleChunked
	ruleMamba
)

// specGroup is the groups of a layout that share one spec: the engine's
// block pool finds a block for it only if every member holds the key.
type specGroup struct {
	rule    ruleKind
	block   int    // tokens
	need    int    // sliding: blocks a window needs, ceil((w-1)/block)
	chunk   int    // chunked: chunk size in tokens
	members uint32 // group bits
	first   int    // lowest member group index
}

// hybridLayout is an owner's layout compiled for the query path.
type hybridLayout struct {
	hbs   int // hash block size: the context's block size
	align int // every hit is a multiple of it: lcm of the block sizes
	sgs   []specGroup
	// zero: the layout cannot be evaluated (a group beyond MaxGroups);
	// the owner answers 0 in every tier.
	zero bool
	src  Layout
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// compileLayout returns l's query form, or nil for a dense owner: a single
// full-attention group at the hash block size, the layout of every model
// before hybrid events.
func compileLayout(l *Layout, hbs int) *hybridLayout {
	if l.Overflow {
		return &hybridLayout{hbs: hbs, align: hbs, zero: true, src: *l}
	}
	if len(l.Groups) == 0 {
		return nil
	}
	if g := l.Groups[0]; len(l.Groups) == 1 && (g.Kind == KindFull || g.Kind == KindOther) && (g.BlockSize == hbs || g.BlockSize == 0) {
		return nil
	}
	h := &hybridLayout{hbs: hbs, align: hbs, src: *l}
	var fa, rest []specGroup
	for i, g := range l.Groups {
		sg := specGroup{rule: ruleFull, block: g.BlockSize, members: 1 << i, first: i}
		if sg.block <= 0 || sg.block%hbs != 0 {
			sg.block = hbs
		}
		switch g.Kind {
		case KindUncached:
			continue
		case KindSliding:
			if g.SlidingWindow > 0 {
				sg.rule, sg.need = ruleSliding, (g.SlidingWindow-1+sg.block-1)/sg.block
			}
		case KindChunked:
			if g.ChunkSize > 0 {
				sg.rule, sg.chunk = ruleChunked, g.ChunkSize
			}
		case KindMamba:
			sg.rule = ruleMamba
		}
		h.align = h.align / gcd(h.align, sg.block) * sg.block
		list := &rest
		if sg.rule == ruleFull {
			list = &fa
		}
		merged := false
		for j := range *list {
			if o := &(*list)[j]; o.rule == sg.rule && o.block == sg.block && o.need == sg.need && o.chunk == sg.chunk &&
				(g.Kind == l.Groups[o.first].Kind) {
				o.members |= sg.members
				merged = true
				break
			}
		}
		if !merged {
			*list = append(*list, sg)
		}
	}
	if len(fa)+len(rest) == 0 {
		return &hybridLayout{hbs: hbs, align: hbs, zero: true, src: *l}
	}
	h.sgs = append(fa, rest...)
	// vLLM refuses chunked local attention beside other block sizes; a
	// declaration that says otherwise gets the full-attention rule there.
	for i := range h.sgs {
		if sg := &h.sgs[i]; sg.rule == ruleChunked && sg.block != h.align {
			sg.rule, sg.chunk = ruleFull, 0
		}
	}
	return h
}

// hasFull reports whether the layout has a full-attention spec group at
// the hash block size: its hit, and so the owner's, is then at most the
// owner's unbroken prefix of keys held in any group. (A larger group block
// publishes no key at the hash blocks inside it, so its prefix of hash
// blocks says nothing.)
func (h *hybridLayout) hasFull() bool {
	for _, sg := range h.sgs {
		if sg.rule == ruleFull && sg.block == h.hbs {
			return true
		}
	}
	return false
}

// sameRules reports whether two compiled layouts answer alike for equal
// presence.
func (h *hybridLayout) sameRules(o *hybridLayout) bool {
	return h == o || (h.hbs == o.hbs && h.align == o.align && h.zero == o.zero && slices.Equal(h.sgs, o.sgs))
}

// presence is one owner's groups per hash-block boundary for one
// cumulative tier: masks[j] holds the groups that hold the key of the
// prompt's first (j+1)·hbs tokens.
type presence struct {
	masks []uint32
	hbs   int
}

// has reports whether spec group sg holds its block ending at token t.
func (p presence) has(sg *specGroup, t int) bool {
	j := t/p.hbs - 1
	return j >= 0 && j < len(p.masks) && p.masks[j]&sg.members == sg.members
}

// hitFull is the full-attention rule: the longest run of present blocks
// from the start, cut to the alignment.
func (h *hybridLayout) hitFull(sg *specGroup, p presence, m int) int {
	b, k := sg.block, 0
	step, want := b/p.hbs, sg.members
	nb := min(m/b, len(p.masks)/step)
	for j := step - 1; k < nb && p.masks[j]&want == want; j += step {
		k++
	}
	l := k * b
	return l - l%h.align
}

// hitSliding is the sliding-window rule: scanning from the bound down, the
// hit ends at the first run of need present blocks (a run may start only
// where a block ends on the alignment); a run reaching block 0 needs no
// full window.
func (h *hybridLayout) hitSliding(sg *specGroup, p presence, m int) int {
	b, run := sg.block, 0
	for i := m/b - 1; i >= 0; i-- {
		if !p.has(sg, (i+1)*b) {
			run = 0
			continue
		}
		if run == 0 && b != h.align && (i+1)*b%h.align != 0 {
			continue
		}
		run++
		if run >= sg.need {
			return (i + run) * b
		}
	}
	l := run * b
	return l - l%h.align
}

// hitChunked is the chunked local attention rule: blocks before the start
// of the bound's chunk are outside every window the engine computes, so
// they count as present; the hit extends from there while blocks are.
func (h *hybridLayout) hitChunked(sg *specGroup, p presence, m int) int {
	if m <= 0 {
		return 0
	}
	b := sg.block
	k := m / sg.chunk * sg.chunk / b
	for nb := m / b; k < nb && p.has(sg, (k+1)*b); k++ {
	}
	return k * b
}

// hitMamba is the Mamba rule: one state suffices, the last aligned block
// end at or below the bound that is present.
func (h *hybridLayout) hitMamba(sg *specGroup, p presence, m int) int {
	b := sg.block
	for i := m/b - 1; i >= 0; i-- {
		if t := (i + 1) * b; (b == h.align || t%h.align == 0) && p.has(sg, t) {
			return t
		}
	}
	return 0
}

func (h *hybridLayout) hitOne(sg *specGroup, p presence, m int) int {
	switch sg.rule {
	case ruleSliding:
		return h.hitSliding(sg, p, m)
	case ruleChunked:
		return h.hitChunked(sg, p, m)
	case ruleMamba:
		return h.hitMamba(sg, p, m)
	}
	return h.hitFull(sg, p, m)
}

// maxFullGroups bounds the full-attention spec groups whose hit hit keeps
// on the stack; a layout has at most MaxGroups spec groups.
const maxFullGroups = MaxGroups

// hit is vLLM's coordinator loop over the spec groups (full-attention
// first): each round lowers the bound to every group's hit in turn until a
// round changes nothing. A full-attention group's hit only shrinks with the
// bound, so it is computed once. It returns the hit and the first member
// group of the spec group that lowered it last (-1 when none did, i.e.
// the hit is the bound cut to full blocks).
func (h *hybridLayout) hit(p presence, m int) (l, stop int) {
	if h.zero {
		return 0, -1
	}
	var faHit [maxFullGroups]int
	var faDone [maxFullGroups]bool
	l, stop = m, -1
	for {
		cur := l
		for i := range h.sgs {
			sg := &h.sgs[i]
			next := 0
			if sg.rule == ruleFull && faDone[i] {
				next = min(cur, faHit[i])
			} else {
				next = h.hitOne(sg, p, cur)
				if sg.rule == ruleFull {
					faHit[i], faDone[i] = next, true
				}
			}
			if next < cur && next < m-m%h.align {
				stop = sg.first
			}
			cur = next
		}
		if cur >= l {
			break
		}
		l = cur
		if len(h.sgs) == 2 && h.sgs[0].rule == ruleFull {
			break
		}
	}
	return l, stop
}
