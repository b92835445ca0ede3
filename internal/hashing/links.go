package hashing

import (
	"crypto/rand"
	"encoding/binary"
	"math/bits"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// Links remembers the digests of blocks ingest verified, so that a query
// can take them instead of computing SHA-256
// (docs/architecture.md#verified-links).
//
// A vLLM block's digest is a function of its parent's digest, its token
// ids and the extras a query carries (the encoding, the LoRA name, and
// the salt, which enters a chain's first block only); so block i's digest
// is a function of (encoding, LoRA, salt, the first i+1 blocks' tokens).
// Links files it under a 128-bit prefix id of exactly those, chained
// block by block (LinkScope.Next), which a query computes from its tokens
// alone.
//
// Ingest fills it: for each block of a vLLM BlockStored event it hashes
// the block from its parent's digest, its tokens and the extras the event
// states, and keeps the digest only when its key is the one the engine
// published. An entry is therefore a remembered SHA-256 result, never
// something an engine asserted, and a query taking one gets exactly the
// digest hashing would give; verification only decides which results are
// worth keeping (a multimodal block's published key includes image hashes
// a query cannot know, so its recomputed digest does not match and is not
// kept). Engines name a parent by its key, so Links also maps a verified
// block's key to its prefix id.
//
// The blocks an event verifies are kept as a run, their ids and digests
// side by side in arrays, and indexed by id. A query looks its first block
// up and then walks the run, comparing each next block's id with the
// run's: one random memory access per run instead of one per block, which
// on a table larger than the caches is what a per-block lookup would cost
// (more than the SHA-256 it saves).
//
// The ids are xxh3-128 under a seed drawn at start-up, as the answer cache
// identifies prompts: two different prefixes share an id with probability
// 2^-128, far below the 2^-64 of two blocks sharing the index keys
// everything already rests on, and nobody outside the process can aim for
// a collision without the seed.
//
// Memory is bounded by a byte budget: the links live in two generations,
// and when the current one has used half the budget the older one is
// dropped whole (a block stored again is refreshed into the current one,
// so what engines keep storing stays). Safe for concurrent use.
type Links struct {
	seed     uint64
	maxBytes int

	mu        sync.RWMutex
	cur, prev *linkGen
	bytes     atomic.Int64 // cur's and prev's

	preparing              atomic.Bool // a Record is faulting in a table's next slots
	hits, misses, recorded atomic.Uint64
	shed                   atomic.Uint64 // blocks ingest left unverified (NoteShed)
	pending                atomic.Int64  // blocks whose verification waits (NotePending)
	backlog, backlogMax    atomic.Int64  // bytes the sources' waiting verification holds, and its bound (TakeBacklog)
	sink                   uint32        // keeps touch's loads (under mu)
	anon                   LinkWriter    // for Record without a writer (under mu)
}

// LinkID identifies a chain prefix within a scope (see Links).
type LinkID = xxh3.Uint128

// LinkBytes is what a verified block costs in a full generation: its
// prefix id, digest, key, tokens' id, block hint and child flag in a run
// (69 bytes) and a 16-byte slot in each of the two tables at the load of
// 3/4 their last size is made for (linkGen.maxSlots).
// BenchmarkLinksMemory measures it.
const LinkBytes = int(unsafe.Sizeof(LinkID{})) + 32 + 8 + 8 + 4 + 1 + 2*posSlotBytes*4/3

// runChunk holds runs: ids[i], digs[i], keys[i], toks[i], hints[i] and
// child[i] are one block's. A run never crosses chunks, so a walk along
// one stays inside its arrays. keys[i] is the digest's index key (a query
// reads it without the digest's line). hints[i] is where the index held
// the block when ingest stored it (what index.Table.Store
// returned, 0 for unknown): a query hands it to the index walk, which
// checks it before probing (index/locate.go).
//
// toks[i] is the id of block i's tokens alone (TokensID) and child[i] says
// that block i-1 of the chunk is its parent: a query that matched block
// i-1 takes block i on comparing its own tokens' id, cheaper than the
// prefix id it would otherwise compute (ids[i] is then its prefix id).
type runChunk struct {
	ids   [chunkBlocks]LinkID
	digs  [chunkBlocks][32]byte
	keys  [chunkBlocks]uint64 // the digests' index keys, which a query reads
	toks  [chunkBlocks]uint64
	hints [chunkBlocks]uint32
	child [chunkBlocks]bool
	n     int
	pos   int // its index in its generation's chunks
}

const chunkBlocks = 1024

// runPos is where a block lies: chunk index << 16 | offset.
type runPos uint32

// linkGen is one generation: runs, the id index and the key index.
type linkGen struct {
	chunks []*runChunk
	// index files blocks by their id's high half; a hit is confirmed
	// against the whole id kept in the run, so two ids sharing a half
	// (probability 2^-64) only cost a miss. back files them by the key
	// engines publish.
	index, back posTable
	// maxSlots is the size the tables end at: the generation's budget
	// holds that many slots in each table and the chunks of the 3/4 of
	// it they file (newGen).
	maxSlots int
}

// newGen returns an empty generation for budget bytes.
func newGen(budget int) *linkGen {
	perBlock := float64(unsafe.Sizeof(runChunk{}))/chunkBlocks + 2*float64(posSlotBytes)*4/3
	return &linkGen{maxSlots: max(minSlots, int(float64(budget)/perBlock*4/3))}
}

// bytes is the memory g holds: its chunks and both tables' slots.
func (g *linkGen) bytes() int {
	return len(g.chunks)*int(unsafe.Sizeof(runChunk{})) +
		(len(g.index.slots)+len(g.back.slots)+len(g.index.next)+len(g.back.next))*posSlotBytes
}

// find returns where block id lies in g, if it is there.
func (g *linkGen) find(id LinkID) (*runChunk, int, bool) {
	p, ok := g.index.get(id.Hi)
	if !ok {
		return nil, 0, false
	}
	ch, off := g.at(p)
	return ch, off, ch.ids[off] == id
}

func (g *linkGen) at(p runPos) (*runChunk, int) {
	return g.chunks[p>>16], int(p & 0xffff)
}

// posTable is an open-addressed map from a 64-bit key to a runPos, with
// linear probing at a load of at most 3/4: half the memory of a Go map
// and a fraction of its insert cost for these random keys. The zero
// slot (pos 0) is empty; positions are stored plus one.
//
// A table grows fourfold, and its last size is exactly what its
// generation's budget holds (linkGen.maxSlots), not a power of two: the
// slots are fresh memory, whose first touch (a page fault) costs more
// than filing a block, so a table makes and copies half of what doubling
// would, and ends at the size it needs. A key's home is its multiplied
// hash scaled to the table's size, so growing keeps the keys' order and
// the copy runs through both tables in sequence.
type posTable struct {
	slots []posSlot
	n     int
	// next, when set, is the zeroed memory grow moves the slots to
	// (Record prepares it outside the lock).
	next []posSlot
	// noNext is a size at which prepared slots did not fit the budget:
	// grow makes its own there.
	noNext int
}

// minSlots is a table's first size.
const minSlots = 1024

// faultIn touches every page of fresh slots, so that the page faults
// happen now rather than when they are filled.
func faultIn(s []posSlot) []posSlot {
	const perPage = 4096 / posSlotBytes
	for i := 0; i < len(s); i += perPage {
		s[i].pos = 0
	}
	return s
}

// nextLen is the size t grows to, within a generation whose tables end at
// maxSlots; past that (which the generation's budget does not let
// happen) it doubles.
func (t *posTable) nextLen(maxSlots int) int {
	n := len(t.slots)
	if n >= maxSlots {
		return max(2*n, minSlots)
	}
	return max(min(4*n, maxSlots), minSlots)
}

type posSlot struct {
	key uint64
	pos uint32
}

const posSlotBytes = int(unsafe.Sizeof(posSlot{}))

func (t *posTable) home(k uint64) int {
	hi, _ := bits.Mul64(k*0x9e3779b97f4a7c15, uint64(len(t.slots)))
	return int(hi)
}

func (t *posTable) get(k uint64) (runPos, bool) {
	if t.n == 0 {
		return 0, false
	}
	for i := t.home(k); ; {
		s := &t.slots[i]
		if s.pos == 0 {
			return 0, false
		}
		if s.key == k {
			return runPos(s.pos - 1), true
		}
		if i++; i == len(t.slots) {
			i = 0
		}
	}
}

// put files p under k, replacing what k had, and reports whether k is new.
// A table at 3/4 grows first, to nextLen(maxSlots).
func (t *posTable) put(k uint64, p runPos, maxSlots int) bool {
	if (t.n+1)*4 > len(t.slots)*3 {
		t.grow(t.nextLen(maxSlots))
	}
	i := t.home(k)
	for t.slots[i].pos != 0 {
		if t.slots[i].key == k {
			t.slots[i].pos = uint32(p) + 1
			return false
		}
		if i++; i == len(t.slots) {
			i = 0
		}
	}
	t.slots[i] = posSlot{key: k, pos: uint32(p) + 1}
	t.n++
	return true
}

// grow moves the slots into a table of n (next when it was prepared at
// that size).
func (t *posTable) grow(n int) {
	old := t.slots
	if len(t.next) == n {
		t.slots, t.next = t.next, nil
	} else {
		t.slots, t.next = make([]posSlot, n), nil
	}
	for _, s := range old {
		if s.pos == 0 {
			continue
		}
		i := t.home(s.key)
		for t.slots[i].pos != 0 {
			if i++; i == len(t.slots) {
				i = 0
			}
		}
		t.slots[i] = s
	}
}

// NewLinks returns a table that holds at most maxBytes of links; a budget
// too small for generations of a few chunks returns nil, which disables
// links.
func NewLinks(maxBytes int) *Links {
	if maxBytes/2 < 4*int(unsafe.Sizeof(runChunk{})) {
		return nil
	}
	// A generation addresses at most 2^16 chunks (runPos).
	maxBytes = min(maxBytes, 2*(1<<16-1)*chunkBlocks*LinkBytes)
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return &Links{seed: binary.LittleEndian.Uint64(b[:]), maxBytes: maxBytes}
}

// Reset forgets every link. The service calls it when the last context is
// unregistered, with the memos, so that memory returns to its idle size.
func (l *Links) Reset() {
	if l == nil {
		return
	}
	l.mu.Lock()
	l.cur, l.prev, l.anon = nil, nil, LinkWriter{}
	l.bytes.Store(0)
	l.mu.Unlock()
}

// Bytes is the memory the links hold (runs and tables, every slot
// allocated): at most the budget given to NewLinks.
func (l *Links) Bytes() int {
	if l == nil {
		return 0
	}
	return int(l.bytes.Load())
}

// Len is the number of verified blocks held.
func (l *Links) Len() int {
	if l == nil {
		return 0
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	n := 0
	for _, g := range []*linkGen{l.cur, l.prev} {
		if g != nil {
			n += g.index.n
		}
	}
	return n
}

// Stats returns how many query blocks took a verified digest (hits), how
// many queries looked for one and found none, hashing on from there
// (misses), and how many blocks ingest verified and recorded.
func (l *Links) Stats() (hits, misses, recorded uint64) {
	if l == nil {
		return 0, 0, 0
	}
	return l.hits.Load(), l.misses.Load(), l.recorded.Load()
}

// Shed is how many stored blocks ingest left unverified because their
// verification was waiting and its bound was reached (LinkScope.NoteShed):
// queries hash those blocks, as without links.
func (l *Links) Shed() uint64 {
	if l == nil {
		return 0
	}
	return l.shed.Load()
}

// NoteShed counts n stored blocks whose verification ingest gave up.
func (s LinkScope) NoteShed(n int) {
	if s.l != nil && n > 0 {
		s.l.shed.Add(uint64(n))
	}
}

// Pending is how many stored blocks wait for verification (NotePending),
// over all sources.
// SetBacklogLimit bounds, in bytes, what every source's verification
// backlog together may hold (TakeBacklog); 0, the default, leaves only
// each source's own bound. The links' part of the memory budget covers
// the backlog as well as the tables, and a bound per source alone grows
// with the number of sources.
func (l *Links) SetBacklogLimit(n int64) {
	if l != nil {
		l.backlogMax.Store(n)
	}
}

// TakeBacklog reserves n bytes of the shared backlog bound for a source's
// waiting verification, and reports false, reserving nothing, when they
// do not fit: the caller sheds what it would have kept (NoteShed).
func (l *Links) TakeBacklog(n int) bool {
	if l == nil {
		return true
	}
	limit := l.backlogMax.Load()
	for {
		cur := l.backlog.Load()
		if limit > 0 && cur+int64(n) > limit {
			return false
		}
		if l.backlog.CompareAndSwap(cur, cur+int64(n)) {
			return true
		}
	}
}

// GiveBacklog returns n bytes taken by TakeBacklog.
func (l *Links) GiveBacklog(n int) {
	if l != nil {
		l.backlog.Add(-int64(n))
	}
}

// BacklogBytes is what the sources' waiting verification holds now.
func (l *Links) BacklogBytes() int64 {
	if l == nil {
		return 0
	}
	return l.backlog.Load()
}

func (l *Links) Pending() int64 {
	if l == nil {
		return 0
	}
	return l.pending.Load()
}

// NotePending adds delta to the blocks waiting for verification.
func (s LinkScope) NotePending(delta int) {
	if s.l != nil && delta != 0 {
		s.l.pending.Add(int64(delta))
	}
}

// LinkScope is Links for one vLLM profile: its encoding and its root
// digest. The zero LinkScope
// (from a nil Links, or a profile links do not serve) holds nothing.
type LinkScope struct {
	l    *Links
	kind kind
	root [32]byte // the profile's root digest: PYTHONHASHSEED enters it
}

// Scope returns the scope of profile p. Only vLLM profiles have links:
// SGLang engines publish no extras to verify a page against, and the last
// page of an SGLang prompt may be partial.
func (l *Links) Scope(p *Profile) LinkScope {
	if l == nil || p == nil || !p.kind.vllm() {
		return LinkScope{}
	}
	return LinkScope{l: l, kind: p.kind, root: p.RootDigest}
}

// Enabled says whether the scope can hold links.
func (s LinkScope) Enabled() bool { return s.l != nil }

// Root is the prefix id of an empty chain under this scope's encoding and
// root digest, LoRA name lora and salt salt ("" for none): what every
// block id of a chain is built on. buf is scratch, returned grown.
func (s LinkScope) Root(lora, salt string, buf []byte) (LinkID, []byte) {
	buf = append(buf[:0], byte(s.kind))
	buf = binary.LittleEndian.AppendUint64(buf, uint64(len(lora)))
	buf = binary.LittleEndian.AppendUint64(buf, uint64(len(salt)))
	buf = append(buf, s.root[:]...)
	buf = append(append(buf, lora...), salt...)
	return xxh3.Hash128Seed(buf, s.l.seed), buf
}

// tokensSeed sets the ids of tokens alone (TokensID) apart from prefix ids.
const tokensSeed = 0x6c696e6b2d746f6b // "link-tok"

// TokensID identifies one block's tokens alone, whatever precedes them:
// xxh3-64 of their bytes under the links' seed (another one than prefix
// ids'), with no copy. Within a run (runChunk.child) it stands for the
// prefix id: the parent is the run's previous block, already matched by
// its 128-bit id or by its own tokens. 64 bits suffice there: two
// different blocks share a tokens id with probability 2^-64, the odds of
// two blocks sharing the index key a query reports them by, which every
// answer already rests on, and nobody outside the process can aim for a
// collision without the seed. It is less work than xxh3-128 on a 16-token
// block, and half the bytes a run walk reads for it.
func (s LinkScope) TokensID(tokens []int32) uint64 {
	return xxh3.HashSeed(int32Bytes(tokens), s.l.seed^tokensSeed)
}

// Next is the prefix id of the chain prefix extended by one block of
// tokens. buf is scratch, returned grown.
func (s LinkScope) Next(prefix LinkID, tokens []int32, buf []byte) (LinkID, []byte) {
	buf = binary.LittleEndian.AppendUint64(buf[:0], prefix.Lo)
	buf = binary.LittleEndian.AppendUint64(buf, prefix.Hi)
	buf = append(buf, int32Bytes(tokens)...)
	return xxh3.Hash128Seed(buf, s.l.seed), buf
}

// Resolve appends to out the verified digests of the blocks ids name, in
// order, up to the first one not held, and reports whether every one
// appended is in the current generation (ingest refreshes them
// otherwise). It is ingest's lookup of what it verified before; a query
// follows runs by tokens instead (Follow).
func (s LinkScope) Resolve(ids []LinkID, out [][32]byte) ([][32]byte, bool) {
	l := s.l
	fresh := true
	l.mu.RLock()
	defer l.mu.RUnlock()
	var ch *runChunk
	off := 0
	for _, id := range ids {
		if ch != nil && off < ch.n && ch.ids[off] == id {
			out = append(out, ch.digs[off]) // the run goes on
			off++
			continue
		}
		// The start of a run: look the block up.
		var ok, old bool
		ch, off, old, ok = l.find(id)
		fresh = fresh && !old
		if !ok {
			break
		}
		out = append(out, ch.digs[off])
		off++
	}
	return out, fresh
}

// Followed is what Follow found: the index keys and block hints of the
// blocks it took, in order, the prefix id of the last one, and where they
// lie, for their digests (Digest).
type Followed struct {
	Keys  []uint64
	Hints []uint32
	ID    LinkID
	runs  []followedRun
}

// followedRun is n consecutive blocks Follow took from one chunk, from
// offset off on.
type followedRun struct {
	ch     *runChunk
	off, n int
}

// Digest is the digest of block i of those f holds: the links' own, which
// is never written again once filed.
func (f *Followed) Digest(i int) *[32]byte {
	for _, r := range f.runs {
		if i < r.n {
			return &r.ch.digs[r.off+i]
		}
		i -= r.n
	}
	return nil
}

// Reset empties f, dropping its references to the links' memory.
func (f *Followed) Reset() {
	clear(f.runs)
	f.Keys, f.Hints, f.runs = f.Keys[:0], f.Hints[:0], f.runs[:0]
}

// take appends blocks [from, to) of ch.
func (f *Followed) take(ch *runChunk, from, to int) {
	if to > from {
		f.Keys = append(f.Keys, ch.keys[from:to]...)
		f.Hints = append(f.Hints, ch.hints[from:to]...)
		f.runs = append(f.runs, followedRun{ch, from, to - from})
	}
}

// Follow takes the verified links of the blocks of tokens (bs tokens each,
// whole blocks only) that extend the chain prefix whose id is prefix,
// stopping at the first block without one. Where a run starts it computes
// the block's prefix id and looks it up; inside a run it compares the
// block's tokens' id with the next entry's (runChunk). It appends to f
// the keys (a vLLM digest's low 64 bits, big-endian), hints and digests
// of the blocks taken and sets f.ID to the last one's prefix id
// (unchanged when none). This is a query's use of Links: it computes
// nothing past the last link and copies no digest; buf is scratch,
// returned grown.
func (s LinkScope) Follow(prefix LinkID, tokens []int32, bs int, f *Followed, buf []byte) []byte {
	l := s.l
	l.mu.RLock()
	defer l.mu.RUnlock()
	var ch *runChunk
	from, off := 0, 0 // the blocks of ch taken since the last lookup
	runs := len(f.runs)
	for b := 0; (b+1)*bs <= len(tokens); b++ {
		block := tokens[b*bs : (b+1)*bs]
		if ch != nil && off < ch.n && ch.child[off] && ch.toks[off] == s.TokensID(block) {
			// The run goes on: block off's parent is the block
			// just taken, and its tokens are the query's.
			off++
			continue
		}
		// The start of a run: look the block up.
		if ch != nil {
			f.take(ch, from, off)
			prefix = ch.ids[off-1]
		}
		id, nbuf := s.Next(prefix, block, buf)
		buf = nbuf
		var ok bool
		if ch, off, _, ok = l.find(id); !ok {
			ch = nil
			break
		}
		from, off = off, off+1
	}
	if ch != nil {
		f.take(ch, from, off)
		prefix = ch.ids[off-1]
	}
	if len(f.runs) > runs {
		f.ID = prefix
	}
	return buf
}

// find looks block id up in the current generation, then in the older
// one; old says the older one was asked. Under l.mu.
func (l *Links) find(id LinkID) (ch *runChunk, off int, old, ok bool) {
	if g := l.cur; g != nil {
		if ch, off, ok = g.find(id); ok {
			return ch, off, false, true
		}
	}
	if g := l.prev; g != nil {
		ch, off, ok = g.find(id)
		return ch, off, true, ok
	}
	return nil, 0, false, false
}

// ByKey returns the prefix id and digest of a verified block from the key
// an engine names it by (as a parent), if it is still held.
func (s LinkScope) ByKey(key uint64) (LinkID, [32]byte, bool) {
	l := s.l
	l.mu.RLock()
	defer l.mu.RUnlock()
	for _, g := range [2]*linkGen{l.cur, l.prev} {
		if g == nil {
			continue
		}
		if p, ok := g.back.get(key); ok {
			ch, off := g.at(p)
			return ch.ids[off], ch.digs[off], true
		}
	}
	return LinkID{}, [32]byte{}, false
}

// LinkWriter is one ingest stream's place in the links: the chunk its
// blocks go on in. Engines publish a prompt's blocks in order, event after
// event, and several engines' streams interleave at the subscriber; with
// a chunk of its own per stream, a prompt's events make one run, which a
// query walks with one lookup, instead of one run per event. The zero
// LinkWriter is ready; Record serialises its use.
type LinkWriter struct {
	g  *linkGen
	ch *runChunk
}

// LinkRun is consecutive verified blocks of one chain, for Record.
type LinkRun struct {
	// Parent is the prefix id the first block extends (Root's for a
	// chain's first block).
	Parent LinkID
	// IDs are the blocks' prefix ids, Keys their keys as published, Digs
	// their digests.
	IDs  []LinkID
	Keys []uint64
	Digs [][32]byte
	// Toks are the ids of the blocks' tokens (TokensID); nil when not
	// known, and a query then looks every block up instead of following.
	Toks []uint64
	// Hints are the blocks' hints in the index (what Table.Store returned); nil for
	// none.
	Hints []uint32
	// Known is how many leading blocks may be held already (Resolve
	// found them); the rest were not held a moment ago, and are filed
	// without a lookup.
	Known int
}

// Record files the blocks of r. Blocks already in the current generation
// are skipped, their hints refreshed; the others become runs there, in w's
// chunk (nil: one shared by callers without writers). A block filed right
// after its parent is marked a child, so a query follows it by its tokens'
// id (runChunk).
func (s LinkScope) Record(r *LinkRun, w *LinkWriter) {
	ids, keys, digs, hints, known := r.IDs, r.Keys, r.Digs, r.Hints, r.Known
	l := s.l
	spare, prepared := l.prepareGrowth(len(ids))
	if prepared {
		defer l.preparing.Store(false)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if g := l.cur; g != nil && prepared {
		g.adoptSpare(spare, l.maxBytes/2)
	}
	g := l.cur
	if g == nil {
		g = newGen(l.maxBytes / 2)
		l.cur = g
	}
	if w == nil {
		w = &l.anon
	}
	var ch *runChunk
	if w.g == g {
		ch = w.ch
	}
	added := 0
	defer func() {
		w.g, w.ch = l.cur, ch
		l.recorded.Add(uint64(added))
		b := l.cur.bytes()
		if l.prev != nil {
			b += l.prev.bytes()
		}
		l.bytes.Store(int64(b))
	}()
	// The new blocks' slots lie at random in tables larger than the
	// caches: load them all first, so their misses overlap instead of
	// each insert waiting for its own.
	l.sink ^= g.touch(ids[min(known, len(ids)):], keys[min(known, len(keys)):])
	for i, id := range ids {
		if i < known {
			if hc, off, ok := g.find(id); ok {
				if hints != nil && hints[i] != 0 {
					hc.hints[off] = hints[i] // the block may have moved
				}
				continue
			}
		}
		if ch != nil && ch.n == chunkBlocks {
			ch = nil
		}
		if g.bytes()+g.growth(ch == nil) > l.maxBytes/2 {
			// The current generation is full: it becomes the old
			// one, and the one before it goes.
			l.prev, g = g, newGen(l.maxBytes/2)
			l.cur, ch = g, nil
		}
		if ch == nil {
			ch = &runChunk{pos: len(g.chunks)}
			g.chunks = append(g.chunks, ch)
		}
		off := ch.n
		ch.ids[off], ch.digs[off], ch.hints[off] = id, digs[i], 0
		ch.keys[off] = binary.BigEndian.Uint64(digs[i][24:]) // vLLM's low64_be
		if hints != nil {
			ch.hints[off] = hints[i]
		}
		ch.toks[off], ch.child[off] = 0, false
		if r.Toks != nil {
			parent := r.Parent
			if i > 0 {
				parent = ids[i-1]
			}
			ch.toks[off] = r.Toks[i]
			ch.child[off] = off > 0 && ch.ids[off-1] == parent
		}
		ch.n++
		pos := runPos(ch.pos)<<16 | runPos(off)
		g.back.put(keys[i], pos, g.maxSlots)
		if g.index.put(id.Hi, pos, g.maxSlots) {
			added++
		} // else another ingest filed it meanwhile: this copy is spare
	}
}

// prepareGrowth is the first half of taking a table's growth out of the
// lock. A table that grows takes fresh memory, and its first touch of
// each page is a page fault: done under the lock, other sources' ingest
// and every query would wait for it. So once a large table of the
// current generation is 5/8 full (with adding more blocks to come), one
// Record allocates and faults in the next slots before it takes the
// lock (prepareGrowth), and parks them in next under it (adoptSpare),
// where grow finds them at 3/4. prepared says this caller holds the
// preparing flag, to clear once it has adopted what it made.
func (l *Links) prepareGrowth(adding int) (spare [2][]posSlot, prepared bool) {
	var want [2]int
	l.mu.RLock()
	if g := l.cur; g != nil {
		for i, t := range [2]*posTable{&g.index, &g.back} {
			if n := t.nextLen(g.maxSlots); len(t.slots) >= 1<<14 && t.next == nil && t.noNext != len(t.slots) &&
				(t.n+adding)*8 > len(t.slots)*5 && g.bytes()+n*posSlotBytes <= l.maxBytes/2 {
				want[i] = n
			}
		}
	}
	l.mu.RUnlock()
	if want == [2]int{} || !l.preparing.CompareAndSwap(false, true) {
		return spare, false
	}
	for i, n := range want {
		if n > 0 {
			spare[i] = faultIn(make([]posSlot, n))
		}
	}
	return spare, true
}

// adoptSpare parks prepareGrowth's slots in the tables they were made
// for, under the lock, where they still fit: the table has not grown
// meanwhile and g stays within its budget (past it, the generation gives
// way before the table would grow).
func (g *linkGen) adoptSpare(spare [2][]posSlot, budget int) {
	for i, t := range [2]*posTable{&g.index, &g.back} {
		if spare[i] == nil {
			continue
		}
		if t.next == nil && len(spare[i]) == t.nextLen(g.maxSlots) && g.bytes()+len(spare[i])*posSlotBytes <= budget {
			t.next = spare[i]
		} else {
			t.noNext = len(t.slots) // not again at this size
		}
	}
}

// touch loads the home slots of the ids and keys about to be filed.
func (g *linkGen) touch(ids []LinkID, keys []uint64) uint32 {
	var acc uint32
	if g.index.n > 0 {
		for _, id := range ids {
			acc ^= g.index.slots[g.index.home(id.Hi)].pos
		}
	}
	if g.back.n > 0 {
		for _, k := range keys {
			acc ^= g.back.slots[g.back.home(k)].pos
		}
	}
	return acc
}

// growth is how many bytes g grows by if one more block is filed: a new
// chunk when newChunk, and any table that grows.
func (g *linkGen) growth(newChunk bool) int {
	b := 0
	if newChunk {
		b += int(unsafe.Sizeof(runChunk{}))
	}
	for _, t := range [2]*posTable{&g.index, &g.back} {
		if (t.n+1)*4 > len(t.slots)*3 && len(t.next) == 0 {
			b += (t.nextLen(g.maxSlots) - len(t.slots)) * posSlotBytes // next is counted already
		}
	}
	return b
}
