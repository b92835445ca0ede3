package events

import (
	"bytes"
	"encoding/binary"

	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/hashing/hashcheck"
	"github.com/mooncake-conductor-go/conductor/internal/msgp"
)

// Verified links (hashing.Links, docs/architecture.md#verified-links): for
// every applied vLLM BlockStored event, the decoder hashes each block
// again from its parent's digest, its token ids and the extras a query can
// carry, and when the result's key is the key the engine published, it
// records the link so that queries can skip SHA-256 for that block. A
// block whose extras a query cannot carry (multimodal hashes, prompt
// embeddings), whose parent digest is unknown, or whose recomputed key
// differs ends the event's verification: its children hang off a digest
// conductor does not know. A block linked before is not hashed again.

// linkScratch is the verification's reused buffers.
type linkScratch struct {
	tokens  []int32
	digests [][]byte
	extras  []hashcheck.Extras
	ids     []hashing.LinkID
	digs    [][32]byte
	buf     []byte
	h       hashing.BlockHasher
}

// linkParent reads parent_block_hash for verification: a chain start (nil),
// or a block this scope verified earlier, named by its key or by its full
// digest. ok is false when the parent is not known.
func (d *engineDecoder) linkParent(sp span, salt string) (id hashing.LinkID, dg [32]byte, root, ok bool) {
	r, ok := d.reader(sp)
	if !ok {
		return id, dg, false, false
	}
	k, err := r.Peek()
	if err != nil {
		return id, dg, false, false
	}
	switch k {
	case msgp.Nil:
		id, d.ls.buf = d.links.Root(d.loraName, salt, d.ls.buf)
		return id, d.profile.RootDigest, true, true
	case msgp.Int:
		u, neg, err := r.Integer()
		if err != nil {
			return id, dg, false, false
		}
		var key uint64
		if neg {
			key, err = hashing.KeyFromInt(d.proj, int64(u))
		} else {
			key, err = hashing.KeyFromUint(d.proj, u)
		}
		if err != nil {
			return id, dg, false, false
		}
		id, dg, ok = d.links.ByKey(key)
		return id, dg, false, ok
	case msgp.Bin:
		b, err := r.Str()
		if err != nil || len(b) != 32 {
			return id, dg, false, false
		}
		key, _ := hashing.KeyFromBytes(d.proj, b)
		id, dg, ok = d.links.ByKey(key)
		return id, dg, false, ok && bytes.Equal(dg[:], b)
	}
	return id, dg, false, false
}

// linkStored verifies the blocks of an applied BlockStored event in chain
// order and records the ones verified, up to the first that is not.
func (d *engineDecoder) linkStored(ev *engineEvent) {
	n, bs := int(ev.n), int(ev.bs)
	if n == 0 || bs <= 0 {
		return
	}
	ls := &d.ls
	var okT, okD, okE bool
	ls.tokens, okT = d.tokensOf(ev.spans[spTokens], ls.tokens[:0], n*bs)
	ls.digests, okD = d.digestsOf(ev.spans[spHashes], ls.digests[:0], n)
	ls.extras, okE = d.extrasOf(ev, ls.extras[:0], n)
	defer func() {
		clear(ls.digests) // views into the payload
		clear(ls.extras)  // salts
	}()
	if !okT || !okD || !okE {
		return
	}
	known := len(ls.extras) == n
	salt := ""
	if known {
		salt = ls.extras[0].Salt
	}
	id, parent, root, ok := d.linkParent(ev.spans[spParent], salt)
	if !ok {
		return
	}
	// The blocks a query could reproduce, as far as the event says.
	m := min(n, len(ls.tokens)/bs)
	if known {
		for i := range m {
			ex := &ls.extras[i]
			if ex.Foreign || (ex.Salt != "" && (i > 0 || !root)) {
				// Keys a query cannot carry, or a salt where none
				// enters: that block and its children are not links.
				m = i
				break
			}
		}
	}
	if m == 0 {
		return
	}
	keys := d.keys[ev.off : ev.off+ev.n]
	ls.ids = ls.ids[:0]
	for i := range m {
		id, ls.buf = d.links.Next(id, ls.tokens[i*bs:(i+1)*bs], ls.buf)
		ls.ids = append(ls.ids, id)
	}
	// Blocks verified before (stored by this or another engine) cost no
	// SHA-256; the rest are hashed from their parents in one run and
	// compared.
	var fresh bool
	ls.digs, fresh = d.links.Resolve(ls.ids, ls.digs[:0])
	held := len(ls.digs)
	pub := func(i int) []byte {
		if len(ls.digests) == n {
			return ls.digests[i]
		}
		return nil
	}
	for i := range held {
		if !d.published(&ls.digs[i], keys[i], pub(i)) {
			m, held = i, i // the engine's block differs from the one held
			break
		}
	}
	if held < m {
		var pp *[32]byte
		bsalt := ""
		switch {
		case held > 0:
			pp = &ls.digs[held-1]
		case !root:
			pp = &parent
		default:
			bsalt = salt // a chain's first block
		}
		ls.digs = ls.h.Digests(&d.profile, bs, pp, ls.tokens[held*bs:m*bs], d.loraName, bsalt, ls.digs[:held])
		for i := held; i < m; i++ {
			if i >= len(ls.digs) || !d.published(&ls.digs[i], keys[i], pub(i)) {
				m = i
				break
			}
		}
	}
	if m > 0 && (m > held || !fresh) {
		d.links.Record(ls.ids[:m], keys[:m], ls.digs[:m], held)
	}
}

// published says whether digest dg is what the engine published: the whole
// digest when it sent bytes, else its key.
func (d *engineDecoder) published(dg *[32]byte, key uint64, pub []byte) bool {
	if pub != nil {
		return bytes.Equal(dg[:], pub)
	}
	return binary.BigEndian.Uint64(dg[24:]) == key
}

// pendingLinks is the verification that waits until the source is idle
// (Config.LinkDefer, docs/architecture.md#verified-links): the applied
// events' values a verification reads (token ids, hashes, parent, extra
// keys), copied out of their payloads in arrival order, so that a chain's
// parent is verified before its children. Verification only decides which
// SHA-256 results are remembered, so when it waits, or is shed, queries
// hash those blocks as they would without links: answers do not change.
type pendingLinks struct {
	max  int // bytes the waiting events may hold
	buf  []byte
	keys []uint64
	evs  []engineEvent // spans into buf, keys at off
	head int           // evs[head:] wait
	n    int           // blocks waiting
}

// pendingEventBytes is what one waiting event costs besides its values:
// its engineEvent, rounded up (TestPendingEventBytes).
const pendingEventBytes = 128

// bytes is what the buffers hold, verified events not yet compacted away
// included.
func (p *pendingLinks) bytes() int {
	return len(p.buf) + 8*len(p.keys) + pendingEventBytes*len(p.evs)
}

// live is what the events still waiting hold.
func (p *pendingLinks) live() int {
	if p.head == len(p.evs) {
		return 0
	}
	ev := &p.evs[p.head]
	lo := int32(len(p.buf))
	for _, sp := range ev.spans {
		if sp.end > sp.off {
			lo = min(lo, sp.off)
		}
	}
	return len(p.buf) - int(lo) + 8*(len(p.keys)-int(ev.off)) + pendingEventBytes*(len(p.evs)-p.head)
}

// reset forgets every waiting event; the caller accounts for p.n. Buffers
// a burst grew past keepPendingBytes go back to the heap, so an idle
// source holds little.
func (p *pendingLinks) reset() {
	p.buf, p.keys = p.buf[:0], p.keys[:0]
	p.evs, p.head, p.n = p.evs[:0], 0, 0
	if cap(p.buf)+8*cap(p.keys)+pendingEventBytes*cap(p.evs) > keepPendingBytes {
		p.buf, p.keys, p.evs = nil, nil, nil
	}
}

// keepPendingBytes is what an idle source keeps of its waiting buffers.
const keepPendingBytes = 256 << 10

// compact moves the waiting events to the front of the buffers.
func (p *pendingLinks) compact() {
	if p.head == 0 {
		return
	}
	if p.head == len(p.evs) {
		p.reset()
		return
	}
	first := &p.evs[p.head]
	base, koff := int32(len(p.buf)), first.off
	for i := p.head; i < len(p.evs); i++ {
		for _, sp := range p.evs[i].spans {
			if sp.end > sp.off {
				base = min(base, sp.off)
			}
		}
	}
	p.buf = p.buf[:copy(p.buf, p.buf[base:])]
	p.keys = p.keys[:copy(p.keys, p.keys[koff:])]
	p.evs = p.evs[:copy(p.evs, p.evs[p.head:])]
	p.head = 0
	for i := range p.evs {
		ev := &p.evs[i]
		ev.off -= koff
		for j := range ev.spans {
			if sp := &ev.spans[j]; sp.end > sp.off {
				sp.off, sp.end = sp.off-base, sp.end-base
			}
		}
	}
}

// deferLink keeps what verifying ev reads, or sheds it when the bound is
// reached.
func (d *engineDecoder) deferLink(ev *engineEvent) {
	if ev.n == 0 || ev.bs <= 0 {
		return
	}
	p := &d.pend
	lo, hi := int32(len(d.payload)), int32(0)
	for _, sp := range ev.spans {
		if sp.end > sp.off && int(sp.end) <= len(d.payload) {
			lo, hi = min(lo, sp.off), max(hi, sp.end)
		}
	}
	if hi <= lo {
		return // nothing to verify against
	}
	need := int(hi-lo) + 8*int(ev.n) + pendingEventBytes
	if p.bytes()+need > p.max {
		p.compact()
		if p.bytes()+need > p.max {
			d.links.NoteShed(int(ev.n))
			return
		}
	}
	q := *ev
	base := int32(len(p.buf)) - lo
	for j := range q.spans {
		if sp := &q.spans[j]; sp.end > sp.off && int(sp.end) <= len(d.payload) {
			sp.off, sp.end = sp.off+base, sp.end+base
		} else {
			*sp = span{}
		}
	}
	p.buf = append(p.buf, d.payload[lo:hi]...)
	q.off = int32(len(p.keys))
	p.keys = append(p.keys, d.keys[ev.off:ev.off+ev.n]...)
	p.evs = append(p.evs, q)
	p.n += int(ev.n)
	d.links.NotePending(int(ev.n))
}

// DropPending implements Verifier.
func (d *engineDecoder) DropPending() {
	d.links.NotePending(-d.pend.n)
	d.pend.reset()
}

// VerifyPending implements Verifier.
func (d *engineDecoder) VerifyPending(maxBlocks int) bool {
	p := &d.pend
	if p.head == len(p.evs) {
		return false
	}
	// linkStored reads the decoder's payload and keys: aim them at the
	// copies for the while.
	payload, keys := d.payload, d.keys
	d.payload, d.keys = p.buf, p.keys
	done := 0
	for p.head < len(p.evs) && done < maxBlocks {
		ev := &p.evs[p.head]
		d.linkStored(ev)
		done += int(ev.n)
		p.head++
	}
	p.n -= done
	d.links.NotePending(-done)
	d.payload, d.keys = payload, keys
	if p.head == len(p.evs) {
		p.reset()
		return false
	}
	return true
}

// CatchUp implements Verifier: the waiting events are verified, oldest
// first, until they hold at most half the bound. A burst longer than that
// is verified as it arrives, as without waiting, rather than shed.
func (d *engineDecoder) CatchUp() {
	for d.pend.live() > d.pend.max/2 {
		d.VerifyPending(1)
	}
}

// PendingLinks implements Verifier.
func (d *engineDecoder) PendingLinks() int { return d.pend.n }
