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
	toks    []uint64
	digs    [][32]byte
	w       hashing.LinkWriter // this source's place in the links
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
		if err != nil || len(b) != d.profile.DigestLen() {
			return id, dg, false, false
		}
		key, _ := hashing.KeyFromBytes(d.proj, b)
		id, dg, ok = d.links.ByKey(key)
		return id, dg, false, ok && bytes.Equal(d.profile.DigestBytes(&dg), b)
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
	parentID := id
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
		ls.toks = ls.toks[:0]
		for i := range m {
			ls.toks = append(ls.toks, d.links.TokensID(ls.tokens[i*bs:(i+1)*bs]))
		}
		d.links.Record(&hashing.LinkRun{Parent: parentID, IDs: ls.ids[:m], Keys: keys[:m], Digs: ls.digs[:m],
			Toks: ls.toks, Hints: d.hints[ev.off : ev.off+int32(m)], Known: held}, &ls.w)
	}
}

// published says whether digest dg is what the engine published: the whole
// digest (32 bytes, or 16 for xxhash) when it sent bytes, else its key.
func (d *engineDecoder) published(dg *[32]byte, key uint64, pub []byte) bool {
	if pub != nil {
		return bytes.Equal(d.profile.DigestBytes(dg), pub)
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
//
// The copies go into fixed-size chunks, taken in order and given back
// once every event in them is verified: a burst costs one copy of each
// event, where one growing buffer would copy the backlog again at every
// doubling (and fault in fresh pages each time).
type pendingLinks struct {
	max    int            // bytes the waiting events may hold
	shared *hashing.Links // the bound every source's backlog shares (TakeBacklog)
	chunks []*pendChunk   // in arrival order; chunks[0] is verified first
	free   []*pendChunk   // emptied chunks kept for the next burst
	held   int            // bytes of the chunks in use, whole chunks
	n      int            // blocks waiting
}

// pendChunk holds waiting events: evs[head:] wait, their spans point into
// buf and their keys (off, n) into keys, with their block hints at the
// same offsets in hints.
type pendChunk struct {
	buf   []byte
	keys  []uint64
	hints []uint32
	evs   []engineEvent
	head  int
}

// newPendChunk returns an empty chunk for b value bytes, k keys and e
// events.
func newPendChunk(b, k, e int) *pendChunk {
	return &pendChunk{buf: make([]byte, 0, b), keys: make([]uint64, 0, k), hints: make([]uint32, 0, k), evs: make([]engineEvent, 0, e)}
}

// Chunk capacities: 256 KiB of values, about 200 events of 16 blocks.
const (
	chunkBufBytes = 256 << 10
	chunkKeys     = 8 << 10
	chunkEvents   = 512
	// pendingEventBytes is what one waiting event costs besides its
	// values: its engineEvent, rounded up (TestPendingEventBytes).
	pendingEventBytes = 128
	chunkBytes        = chunkBufBytes + 12*chunkKeys + pendingEventBytes*chunkEvents
	keepFreeChunks    = 1
)

// bytesOf is what a chunk holds in memory.
func (c *pendChunk) bytesOf() int {
	return cap(c.buf) + 8*cap(c.keys) + 4*cap(c.hints) + pendingEventBytes*cap(c.evs)
}

// fits says whether an event of b value bytes and k keys goes into c.
func (c *pendChunk) fits(b, k int) bool {
	return len(c.buf)+b <= cap(c.buf) && len(c.keys)+k <= cap(c.keys) && len(c.evs) < cap(c.evs)
}

// reset forgets every waiting event; the caller accounts for p.n.
func (p *pendingLinks) reset() {
	p.shared.GiveBacklog(p.held)
	for _, c := range p.chunks {
		p.release(c)
	}
	clear(p.chunks)
	p.chunks, p.held, p.n = p.chunks[:0], 0, 0
}

// release gives an emptied chunk back, keeping a few standard ones.
func (p *pendingLinks) release(c *pendChunk) {
	if cap(c.buf) == chunkBufBytes && cap(c.keys) == chunkKeys && len(p.free) < keepFreeChunks {
		c.buf, c.keys, c.hints, c.evs, c.head = c.buf[:0], c.keys[:0], c.hints[:0], c.evs[:0], 0
		p.free = append(p.free, c)
	}
}

// chunkFor returns the chunk an event of b value bytes and k keys goes
// into, nil when the bound leaves no room for it.
func (p *pendingLinks) chunkFor(b, k int) *pendChunk {
	if n := len(p.chunks); n > 0 && p.chunks[n-1].fits(b, k) {
		return p.chunks[n-1]
	}
	// The bounds are checked before a chunk is made, so that shedding a
	// burst allocates nothing.
	large := b > chunkBufBytes || k > chunkKeys
	need := chunkBytes
	if large {
		need = b + 12*k + pendingEventBytes
	}
	if p.held+need > p.max || !p.shared.TakeBacklog(need) {
		return nil
	}
	var c *pendChunk
	switch {
	case large:
		// A large event gets a chunk of its own, sized to it.
		c = newPendChunk(b, k, 1)
	case len(p.free) > 0:
		c = p.free[len(p.free)-1]
		p.free[len(p.free)-1] = nil
		p.free = p.free[:len(p.free)-1]
	default:
		c = newPendChunk(chunkBufBytes, chunkKeys, chunkEvents)
	}
	p.held += need
	p.chunks = append(p.chunks, c)
	return c
}

// deferLink keeps what verifying ev reads, or sheds it when the bound is
// reached.
func (d *engineDecoder) deferLink(ev *engineEvent) {
	if ev.n == 0 || ev.bs <= 0 {
		return
	}
	lo, hi := int32(len(d.payload)), int32(0)
	for _, sp := range ev.spans {
		if sp.end > sp.off && int(sp.end) <= len(d.payload) {
			lo, hi = min(lo, sp.off), max(hi, sp.end)
		}
	}
	if hi <= lo {
		return // nothing to verify against
	}
	c := d.pend.chunkFor(int(hi-lo), int(ev.n))
	if c == nil {
		d.links.NoteShed(int(ev.n))
		return
	}
	q := *ev
	base := int32(len(c.buf)) - lo
	for j := range q.spans {
		if sp := &q.spans[j]; sp.end > sp.off && int(sp.end) <= len(d.payload) {
			sp.off, sp.end = sp.off+base, sp.end+base
		} else {
			*sp = span{}
		}
	}
	c.buf = append(c.buf, d.payload[lo:hi]...)
	q.off = int32(len(c.keys))
	c.keys = append(c.keys, d.keys[ev.off:ev.off+ev.n]...)
	c.hints = append(c.hints, d.hints[ev.off:ev.off+ev.n]...)
	c.evs = append(c.evs, q)
	d.pend.n += int(ev.n)
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
	if len(p.chunks) == 0 {
		return false
	}
	// linkStored reads the decoder's payload, keys and hints: aim them at
	// the copies for the while.
	payload, keys, hints := d.payload, d.keys, d.hints
	done := 0
	for len(p.chunks) > 0 && done < maxBlocks {
		c := p.chunks[0]
		d.payload, d.keys, d.hints = c.buf, c.keys, c.hints
		for c.head < len(c.evs) && done < maxBlocks {
			ev := &c.evs[c.head]
			d.linkStored(ev)
			done += int(ev.n)
			c.head++
		}
		if c.head == len(c.evs) {
			p.held -= c.bytesOf()
			p.shared.GiveBacklog(c.bytesOf())
			copy(p.chunks, p.chunks[1:])
			p.chunks[len(p.chunks)-1] = nil
			p.chunks = p.chunks[:len(p.chunks)-1]
			p.release(c)
		}
	}
	p.n -= done
	d.links.NotePending(-done)
	d.payload, d.keys, d.hints = payload, keys, hints
	return len(p.chunks) > 0
}

// CatchUp implements Verifier: the waiting events are verified, oldest
// first, until they hold at most half the bound. A burst longer than that
// is verified as it arrives, as without waiting, rather than shed.
func (d *engineDecoder) CatchUp() {
	for d.pend.held > d.pend.max/2 && d.VerifyPending(1) {
	}
}

// PendingLinks implements Verifier.
func (d *engineDecoder) PendingLinks() int { return d.pend.n }
