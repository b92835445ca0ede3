package events

import (
	"bytes"
	"encoding/binary"
	"slices"

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
	toks    []hashing.LinkID
	digs    [][32]byte
	hints   []uint32
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
	ls.digs, ls.hints, fresh = d.links.Resolve(ls.ids, ls.digs[:0], ls.hints[:0])
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
			Toks: ls.toks, Hints: d.locate(keys[:m]), Known: held}, &ls.w)
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

// Locator is what a sink that can say where it keeps blocks offers
// (*index.Table does): block hints a query's walk checks before probing
// (index/locate.go).
type Locator interface {
	Locate(keys []uint64, hints []uint32)
}

// locate returns the block hints of keys, just stored, for the links to
// keep beside them; nil when the sink cannot say.
func (d *engineDecoder) locate(keys []uint64) []uint32 {
	loc, ok := d.sink.(Locator)
	if !ok {
		return nil
	}
	d.ls.hints = slices.Grow(d.ls.hints[:0], len(keys))[:len(keys)]
	loc.Locate(keys, d.ls.hints)
	return d.ls.hints
}
