package events

import (
	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/msgp"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
)

// Engines registered with the standard hash (docs/engines.md#standard-hash):
// RFC #1527 has a publisher that does not use the standard hash send its
// token ids, and the consumer recompute. So every stored block is keyed by
// its standard hash H, computed from the event's token ids and its
// parent's H, and the decoder remembers, per KV-cache group, engine hash →
// H, so that a BlockRemoved (engine hashes only) finds the block. The
// engine's own hash (algorithm, PYTHONHASHSEED) then does not matter.
//
// Never higher than the truth:
//   - a parent the map does not know cannot be keyed: the event is
//     rejected (unknown_parent) and counted, never guessed;
//   - a block whose extra keys the standard cannot fold (a cache salt,
//     multimodal identifiers that are not 64-bit hashes, prompt
//     embeddings), a partial page, and every block after one in its
//     chain are remembered as unreachable and not stored: no plain query
//     can produce their keys;
//   - past the map's bound, blocks are refused (standard_map_full) rather
//     than stored unremovable.
//
// The map is released when the source retracts (unregister, stale) and on
// AllBlocksCleared; its bytes are accounted (Stats.StandardMapBytes).

// stdEntryBytes is what one map entry accounts for: its key (group, engine
// hash) and value (H, reachability) and the Go map's per-entry overhead.
const stdEntryBytes = 64

// DefaultStdMapEntries bounds one source's engine-hash map.
const DefaultStdMapEntries = 1 << 21

type stdKey struct {
	group int32
	tier  index.Tier
	k     uint64
}

type stdVal struct {
	h         uint64
	reachable bool
}

// stdState is an engine decoder's standard-hash side.
type stdState struct {
	on   bool
	seed uint64
	max  int
	m    map[stdKey]stdVal
	toks []int32
	buf  []byte
	// stats receives the map's accounted bytes and unreachable blocks.
	stats *Stats
}

func (s *stdState) put(k stdKey, v stdVal) bool {
	if s.m == nil {
		s.m = make(map[stdKey]stdVal)
	}
	if _, ok := s.m[k]; !ok {
		if len(s.m) >= s.max {
			return false
		}
		s.stats.addStdMapBytes(stdEntryBytes)
	}
	s.m[k] = v
	return true
}

func (s *stdState) del(k stdKey) (stdVal, bool) {
	v, ok := s.m[k]
	if ok {
		delete(s.m, k)
		s.stats.addStdMapBytes(-stdEntryBytes)
	}
	return v, ok
}

// release forgets the whole map.
func (s *stdState) release() {
	s.stats.addStdMapBytes(-int64(len(s.m)) * stdEntryBytes)
	s.m = nil
}

// stdParent reads parent_block_hash in the engine's form: nil starts a
// chain; ok is false when the value cannot be read.
func (d *engineDecoder) stdParent(sp span) (root bool, key uint64, ok bool) {
	r, ok := d.reader(sp)
	if !ok {
		return false, 0, false
	}
	k, err := r.Peek()
	if err != nil {
		return false, 0, false
	}
	switch k {
	case msgp.Nil:
		return true, 0, true
	case msgp.Int:
		u, neg, err := r.Integer()
		if err != nil {
			return false, 0, false
		}
		if neg {
			key, err = hashing.KeyFromInt(d.proj, int64(u))
		} else {
			key, err = hashing.KeyFromUint(d.proj, u)
		}
		return false, key, err == nil
	case msgp.Bin:
		b, err := r.Str()
		if err != nil {
			return false, 0, false
		}
		key, err = hashing.KeyFromBytes(d.proj, b)
		return false, key, err == nil
	}
	return false, 0, false
}

// stdStored turns an applied BlockStored event's engine hashes into
// standard keys in place: d.keys[ev.off:ev.off+ev.n] become the H of the
// event's reachable blocks (a prefix of them; ev.n shrinks to it), and
// every block is remembered. It settles the event when it cannot be keyed.
func (d *engineDecoder) stdStored(ev *engineEvent) {
	s := &d.std
	n, bs := int(ev.n), int(ev.bs)
	group := ev.group
	if !ev.grouped {
		group = 0
	}
	root, pk, ok := d.stdParent(ev.spans[spParent])
	if !ok {
		ev.result, ev.reason = Rejected, EvUnknownParent
		return
	}
	var parent uint64
	reach := true
	if !root {
		pv, known := s.m[stdKey{group, ev.tier, pk}]
		if !known {
			ev.result, ev.reason = Rejected, EvUnknownParent
			return
		}
		parent, reach = pv.h, pv.reachable
	}
	var okT bool
	s.toks, okT = d.tokensOf(ev.spans[spTokens], s.toks[:0], n*bs+1)
	if !okT {
		ev.result, ev.reason = Rejected, EvTokenRange
		return
	}
	exs, okE := d.extrasOf(ev, d.hc.extras[:0], n)
	d.hc.extras = exs
	defer clear(d.hc.extras)
	if !okE {
		ev.result, ev.reason = Rejected, EvExtraKeys
		return
	}
	if bs != int(d.blockSize) {
		// A page or group block that is not the registered hash block:
		// queries hash other boundaries (docs/engines.md#standard-hash).
		reach = false
	}
	if d.rules.tokenPairs && len(s.toks) > n*bs {
		// EAGLE bigram pairs: the standard hashes plain token ids.
		reach = false
	}
	keys := d.keys[ev.off : ev.off+ev.n]
	if len(s.m)+n > s.max {
		ev.result, ev.reason = Rejected, EvStdMapFull
		return
	}
	stored := 0
	for i := range n {
		lo, hi := i*bs, (i+1)*bs
		if hi > len(s.toks) {
			reach = false // a partial page, or token ids that do not cover the block
		}
		if reach && i < len(exs) && (exs[i].Foreign || exs[i].Salt != "") {
			reach = false
		}
		if reach && len(exs) == 0 && d.rules.typ == sourcetype.VLLM {
			// vLLM without extra_keys: a salt or a multimodal key may
			// have entered the engine's hash unseen.
			reach = false
		}
		var h uint64
		if reach {
			h, s.buf = hashing.StdLocal(s.seed, s.toks[lo:hi], nil, s.buf)
			if !root || i > 0 {
				h = hashing.StdNext(s.seed, parent, h)
			}
			parent = h
		} else {
			s.stats.addStdUnreachable()
		}
		s.put(stdKey{group, ev.tier, keys[i]}, stdVal{h: h, reachable: reach})
		if reach {
			keys[stored] = h
			stored++
		}
	}
	ev.n = int32(stored)
}

// stdRemoved turns a BlockRemoved's engine hashes into the standard keys
// of the reachable blocks they name, forgetting them; hashes the map does
// not know, or unreachable blocks, have nothing in the index to remove.
func (d *engineDecoder) stdRemoved(ev *engineEvent) {
	s := &d.std
	group := ev.group
	if !ev.grouped {
		group = 0
	}
	keys := d.keys[ev.off : ev.off+ev.n]
	kept := 0
	for _, k := range keys {
		if v, ok := s.del(stdKey{group, ev.tier, k}); ok && v.reachable {
			keys[kept] = v.h
			kept++
		}
	}
	ev.n = int32(kept)
}
