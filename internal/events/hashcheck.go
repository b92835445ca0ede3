package events

import (
	"slices"

	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/hashing/hashcheck"
	"github.com/mooncake-conductor-go/conductor/internal/msgp"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
)

// The hash check on ingest (package hashcheck) needs an event's token ids,
// parent and extra keys, which decoding only type-checks. Rather than keep
// them for every event, the decoder notes where their values lie in the
// payload (a span each) and reads them again, only for the few events the
// checker samples, while Apply still holds the payload.

// span is a value's bytes in the payload, [off, end); end 0 means absent.
type span struct{ off, end int32 }

// Spans an engine event keeps.
const (
	spTokens = iota
	spHashes
	spParent
	spExtraKeys
	spCacheSalt
	numSpans
)

const noSpan = 0xff

// spanOf maps a field id to its span, or noSpan; read-only after
// initialisation.
var spanOf = func() (t [numEngineFields]uint8) {
	for i := range t {
		t[i] = noSpan
	}
	t[fTokenIDs] = spTokens
	t[fBlockHashes] = spHashes
	t[fParent] = spParent
	t[fExtraKeys] = spExtraKeys
	t[fCacheSalt] = spCacheSalt
	return t
}()

// hcScratch is the check's reused buffers, so a sampled event allocates
// nothing but a salt's string.
type hcScratch struct {
	ev      hashcheck.Event
	tokens  []int32
	digests [][]byte
	extras  []hashcheck.Extras
}

// reader returns a reader over the value at sp, ok=false if there is none.
func (d *engineDecoder) reader(sp span) (msgp.Reader, bool) {
	var r msgp.Reader
	if sp.end <= sp.off || sp.off < 0 || int(sp.end) > len(d.payload) {
		return r, false
	}
	r.Reset(d.payload[sp.off:sp.end])
	return r, true
}

// checkStored hashes the first n blocks of an applied BlockStored event
// again and has the checker compare them with the published hashes. The
// event passed validation, so a value that does not read as expected only
// makes the check skip the event.
func (d *engineDecoder) checkStored(ev *engineEvent, n int) {
	h := &d.hc
	e := &h.ev
	*e = hashcheck.Event{BlockSize: int(ev.bs), Keys: d.keys[ev.off : ev.off+int32(n)]}
	e.Parent = d.parentOf(ev.spans[spParent])
	words := n * int(ev.bs)
	if d.rules.tokenPairs {
		words *= 2 // at most: a page of pairs, flattened
	}
	var okT, okD, okE bool
	// What the event lacks is known before its token ids are decoded: a
	// service that never sends them, or never sends vLLM's extra_keys, is
	// sampled on every event (nothing of it gets checked), so it must not
	// pay for decoding them.
	h.extras, okE = d.extrasOf(ev, h.extras[:0], n)
	noTokens := d.isNil(ev.spans[spTokens])
	noExtras := okE && len(h.extras) == 0 && d.rules.typ != sourcetype.SGLang
	if !noTokens && !noExtras {
		h.tokens, okT = d.tokensOf(ev.spans[spTokens], h.tokens[:0], words)
		h.digests, okD = d.digestsOf(ev.spans[spHashes], h.digests[:0], n)
	}
	switch {
	case noTokens:
		d.check.Skip(hashcheck.SkipNoTokenIDs, n)
	case noExtras:
		d.check.Skip(hashcheck.SkipNoExtraKeys, n)
	case okT && okD && okE:
		e.Tokens = h.tokens
		if len(h.digests) > 0 {
			e.Digests = h.digests
		}
		if len(h.extras) > 0 {
			e.Extras = h.extras
		}
		d.check.CheckEvent(e, n)
	default:
		d.check.Skip(hashcheck.SkipUnreadable, n)
	}
	// The digests are views into the payload, which is about to be
	// released; the salts need not outlive the check either.
	clear(h.digests)
	clear(h.extras)
	*e = hashcheck.Event{}
}

// isNil says whether the value at sp is absent or nil.
func (d *engineDecoder) isNil(sp span) bool {
	r, ok := d.reader(sp)
	if !ok {
		return true
	}
	k, err := r.Peek()
	return err == nil && k == msgp.Nil
}

// parentOf reads parent_block_hash: nil starts a chain, an integer is a key
// the checker may remember, bytes are the parent's full digest.
func (d *engineDecoder) parentOf(sp span) hashcheck.Parent {
	r, ok := d.reader(sp)
	if !ok {
		return hashcheck.Parent{}
	}
	k, err := r.Peek()
	if err != nil {
		return hashcheck.Parent{}
	}
	switch k {
	case msgp.Nil:
		return hashcheck.Root()
	case msgp.Int:
		u, neg, err := r.Integer()
		if err != nil {
			return hashcheck.Parent{}
		}
		var key uint64
		if neg {
			key, err = hashing.KeyFromInt(d.proj, int64(u))
		} else {
			key, err = hashing.KeyFromUint(d.proj, u)
		}
		if err != nil {
			return hashcheck.Parent{}
		}
		return hashcheck.FromKey(key)
	case msgp.Bin:
		b, err := r.Str()
		if err != nil {
			return hashcheck.Parent{}
		}
		return hashcheck.FromDigest(b)
	}
	return hashcheck.Parent{}
}

// tokensOf appends up to max token ids of the token_ids array at sp to dst,
// [a, b] pairs flattened. Plain ids are taken by msgp.DecodeTokenRun, the
// rest (pairs, rare formats, the last few bytes) one element at a time.
func (d *engineDecoder) tokensOf(sp span, dst []int32, max int) ([]int32, bool) {
	r, ok := d.reader(sp)
	if !ok {
		return dst, false
	}
	n, err := r.ArrayLen()
	if err != nil {
		return dst, false
	}
	b := d.payload[sp.off:sp.end]
	p := r.Pos()
	for i := 0; i < n && len(dst) < max; {
		start := len(dst)
		dst = slices.Grow(dst, min(n-i, max-start))[:start+min(n-i, max-start)]
		var j int
		p, j = msgp.DecodeTokenRun(b, p, dst, start)
		dst = dst[:j]
		if i += j - start; i == n || len(dst) >= max {
			break
		}
		// One element the fast path left: an id, or a pair of ids.
		r.Reset(b[p:])
		k, err := r.Peek()
		if err != nil {
			return dst, false
		}
		words := 1
		if k == msgp.Array {
			if words, err = r.ArrayLen(); err != nil {
				return dst, false
			}
		}
		for range words {
			u, neg, err := r.Integer()
			if err != nil {
				return dst, false
			}
			v, ok := msgp.Int64Range(u, neg)
			if !ok || v != int64(int32(v)) {
				return dst, false
			}
			dst = append(dst, int32(v))
		}
		p += r.Pos()
		i++
	}
	return dst, true
}

// digestsOf appends the first n published hashes as bytes when the engine
// sent any as bytes (vLLM with integer hashes off); dst stays empty
// otherwise, and the checker compares keys.
func (d *engineDecoder) digestsOf(sp span, dst [][]byte, n int) ([][]byte, bool) {
	if !d.rules.binHashes {
		return dst, true
	}
	r, ok := d.reader(sp)
	if !ok {
		return dst, false
	}
	m, err := r.ArrayLen()
	if err != nil {
		return dst, false
	}
	sawBin := false
	for i := 0; i < n && i < m; i++ {
		k, err := r.Peek()
		if err != nil {
			return dst, false
		}
		if k != msgp.Bin {
			dst = append(dst, nil)
			if r.Skip() != nil {
				return dst, false
			}
			continue
		}
		b, err := r.Str()
		if err != nil {
			return dst, false
		}
		dst = append(dst, b)
		sawBin = true
	}
	if !sawBin {
		clear(dst)
		dst = dst[:0]
	}
	return dst, true
}

// extrasOf appends what the event says of its first n blocks' extra keys.
// SGLang: its cache_salt (absent or nil: none) for every block. vLLM: one
// entry per extra_keys element, read from its tagged items ("lora" is the
// registration's, "cache_salt" carries the salt, anything else is a key a
// query cannot carry); without extra_keys dst stays empty (unknown).
func (d *engineDecoder) extrasOf(ev *engineEvent, dst []hashcheck.Extras, n int) ([]hashcheck.Extras, bool) {
	if d.rules.typ == sourcetype.SGLang {
		salt := ""
		if r, ok := d.reader(ev.spans[spCacheSalt]); ok {
			if k, _ := r.Peek(); k == msgp.Str {
				b, err := r.Str()
				if err != nil {
					return dst, false
				}
				salt = string(b)
			}
		}
		for range n {
			dst = append(dst, hashcheck.Extras{Known: true, Salt: salt})
		}
		return dst, true
	}
	r, ok := d.reader(ev.spans[spExtraKeys])
	if !ok {
		return dst, true
	}
	if k, _ := r.Peek(); k != msgp.Array {
		return dst, true // nil: unknown
	}
	m, err := r.ArrayLen()
	if err != nil {
		return dst, false
	}
	for i := 0; i < n && i < m; i++ {
		ex, err := readExtras(&r)
		if err != nil {
			return dst, false
		}
		dst = append(dst, ex)
	}
	return dst, true
}

// readExtras reads one extra_keys element: nil (no extra keys) or a list
// of tagged maps.
func readExtras(r *msgp.Reader) (hashcheck.Extras, error) {
	ex := hashcheck.Extras{Known: true}
	if k, err := r.Peek(); err != nil || k == msgp.Nil {
		return ex, r.Nil()
	}
	items, err := r.ArrayLen()
	if err != nil {
		return ex, err
	}
	for range items {
		if k, err := r.Peek(); err != nil || k != msgp.Map {
			ex.Foreign = true
			if err := r.Skip(); err != nil {
				return ex, err
			}
			continue
		}
		fields, err := r.MapLen()
		if err != nil {
			return ex, err
		}
		var typ, salt []byte
		hasSalt := false
		for range fields {
			key, err := readStrOrSkip(r)
			if err != nil {
				return ex, err
			}
			val, err := readStrOrSkip(r)
			if err != nil {
				return ex, err
			}
			switch string(key) {
			case "type":
				typ = val
			case "salt":
				salt, hasSalt = val, val != nil
			}
		}
		switch string(typ) {
		case "lora":
		case "cache_salt":
			if !hasSalt {
				ex.Foreign = true // a salt we cannot read: do not guess
			}
			ex.Salt = string(salt)
		default:
			ex.Foreign = true
		}
	}
	return ex, nil
}

// readStrOrSkip reads a string value, or skips any other and returns nil.
func readStrOrSkip(r *msgp.Reader) ([]byte, error) {
	k, err := r.Peek()
	if err != nil {
		return nil, err
	}
	if k != msgp.Str {
		return nil, r.Skip()
	}
	b, err := r.Str()
	if b == nil && err == nil {
		b = []byte{}
	}
	return b, err
}
