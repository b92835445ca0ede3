package hashcheck

import (
	"bytes"
	"sync"
	"sync/atomic"

	"github.com/rs/zerolog"

	"github.com/mooncake-conductor-go/conductor/internal/hashing"
)

// Defaults for Options.
const (
	// DefaultWarmup checks every checkable block until this many were
	// checked, so a misconfigured service shows up within its first
	// requests.
	DefaultWarmup = 64
	// DefaultEvery then checks about one block in this many: at 1/64 the
	// SHA-256 of a checked block, spread over the blocks skipped, is a few
	// nanoseconds per ingested block (BenchmarkSampledCheck).
	DefaultEvery = 64
	// DefaultMaxPerEvent bounds the blocks checked in one event after the
	// warm-up, so a long prefill does not stall its subscriber.
	DefaultMaxPerEvent = 8
)

// rememberSlots is how many verified digests a Checker keeps, so that an
// event continuing a checked block (a decode step after its prefill) can
// be checked although its parent is only a 64-bit integer. Slots are
// direct-mapped by key: 64 × 40 bytes per service.
const rememberSlots = 64

// Options tune sampling and logging; zero values take the defaults.
type Options struct {
	Warmup      int
	Every       int
	MaxPerEvent int
	// Logger receives the one warning per service.
	Logger zerolog.Logger
}

func (o Options) withDefaults() Options {
	if o.Warmup <= 0 {
		o.Warmup = DefaultWarmup
	}
	if o.Every <= 0 {
		o.Every = DefaultEvery
	}
	if o.MaxPerEvent <= 0 {
		o.MaxPerEvent = DefaultMaxPerEvent
	}
	return o
}

// Result is the outcome of one block's check.
type Result uint8

const (
	// Skipped: the block could not be checked (or was not sampled).
	Skipped Result = iota
	// Match: the profile reproduces the published hash.
	Match
	// Mismatch: it does not; queries will not find this block.
	Mismatch
)

func (r Result) String() string {
	switch r {
	case Match:
		return "match"
	case Mismatch:
		return "mismatch"
	}
	return "skipped"
}

// SkipReason says why a sampled block could not be checked: what the
// event lacked. Its String is the reason label of
// conductor_hash_check_skipped_total.
type SkipReason uint8

const (
	// SkipNoTokenIDs: the event carries no token ids for the block.
	SkipNoTokenIDs SkipReason = iota
	// SkipNoExtraKeys: a vLLM event without extra_keys, so a salt or a
	// multimodal key may have entered the hash unseen.
	SkipNoExtraKeys
	// SkipForeignExtraKeys: the block's extra keys hold something a query
	// cannot carry (multimodal hashes, prompt embeddings, an unreadable
	// salt).
	SkipForeignExtraKeys
	// SkipParentNotPinned: the parent is an integer this checker never
	// verified (or a digest of the wrong size), so its full digest, which
	// the block is hashed from, is unknown.
	SkipParentNotPinned
	// SkipBlockShape: the token ids do not make one block of the
	// registered block_size.
	SkipBlockShape
	// SkipUnhashable: the profile cannot hash these ids (SGLang and a
	// negative id).
	SkipUnhashable
	// SkipUnreadable: a value the check reads again did not decode as
	// expected (the event itself was valid).
	SkipUnreadable
	// SkipParentMismatched: the parent is a block whose hash did not
	// match (the mismatch warning tells), so the digest this block hangs
	// off is not the engine's; nothing is missing from the event.
	SkipParentMismatched
	// NumSkipReasons counts the reasons.
	NumSkipReasons
)

var skipNames = [NumSkipReasons]string{
	"no_token_ids", "no_extra_keys", "foreign_extra_keys", "parent_not_pinned",
	"block_shape", "unhashable", "unreadable", "parent_mismatched",
}

// skipHelp is the INFO line's explanation: what a producer must send for
// the check to run (docs/events.md, "The hash check").
var skipHelp = [NumSkipReasons]string{
	"BlockStored carries no token_ids: send each stored block's token ids",
	"BlockStored carries no extra_keys: send one entry per block (nil when the block has no extra keys), as vLLM releases with extra_keys do",
	"the blocks' extra keys hold multimodal or embedding keys a query cannot carry",
	"parent_block_hash is an integer of a block this check never verified (or a digest of another algorithm's size): chains are checkable from their first block (parent nil), or with full digests (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0)",
	"token_ids do not make blocks of the registered block_size: check block_size against the engine's",
	"the registered profile cannot hash these token ids (SGLang and a negative id)",
	"token_ids, block_hashes or extra_keys did not decode as the engine family's format",
	"the block follows one whose hash did not match (see the mismatch warning); it cannot be checked on its own",
}

func (r SkipReason) String() string {
	if r < NumSkipReasons {
		return skipNames[r]
	}
	return "unknown"
}

// SkipReasons lists every reason, for exporting each at zero.
func SkipReasons() []SkipReason {
	out := make([]SkipReason, NumSkipReasons)
	for i := range out {
		out[i] = SkipReason(i)
	}
	return out
}

// Parent is what an event says about the block before the one checked.
// The zero Parent is unknown.
type Parent struct {
	state  parentState
	key    uint64
	digest [32]byte // right-aligned, as hashing keeps digests
	size   uint8    // the published digest's length (parentDigest)
}

type parentState uint8

const (
	parentUnknown parentState = iota
	parentRoot
	parentDigest
	parentKey
)

// Root is the parent of a chain's first block (parent_block_hash nil).
func Root() Parent { return Parent{state: parentRoot} }

// FromDigest is a parent published as its full digest (vLLM's bytes
// form): 32 bytes (SHA-256) or 16 (XXH3-128). Any other length is
// unknown, and so is a digest whose size is not the registered
// algorithm's (Check skips the block as parent_not_pinned).
func FromDigest(b []byte) Parent {
	if len(b) != 32 && len(b) != 16 {
		return Parent{}
	}
	p := Parent{state: parentDigest, size: uint8(len(b))}
	copy(p.digest[32-len(b):], b)
	return p
}

// FromKey is a parent published as an integer, already projected to its
// index key (hashing.KeyFromUint / KeyFromInt). It is usable only if the
// checker still remembers verifying that block.
func FromKey(key uint64) Parent { return Parent{state: parentKey, key: key} }

// Known reports whether a block with this parent can be hashed without
// consulting the checker's memory: a chain start or a full digest.
func (p Parent) Known() bool { return p.state == parentRoot || p.state == parentDigest }

// Extras is what an event says about a block's extra hash keys beyond the
// LoRA name, which always comes from the registration.
type Extras struct {
	// Known says the event stated them (vLLM extra_keys, SGLang's
	// cache_salt field, whose absence means no salt). A block with unknown
	// extras is skipped: a salt or a multimodal key may have entered it.
	Known bool
	// Salt is the request's cache salt, "" for none; it enters a chain's
	// first block only. It is hashed, never logged.
	Salt string
	// Foreign says the block's keys include something a query cannot
	// carry (multimodal hashes, prompt embeddings): skipped.
	Foreign bool
}

// Published is a block's hash as the event carried it.
type Published struct {
	// Key is the hash projected to its index key.
	Key uint64
	// Digest is the whole published value when the engine sent bytes
	// (vLLM with integer hashes off), compared in full; nil otherwise.
	Digest []byte
}

// Checker checks one service's blocks. Sample, Check and CheckEvent are
// meant for the service's one ingest goroutine and are not safe for
// concurrent use; the counts are read concurrently by scrapes.
type Checker struct {
	service   string
	profile   hashing.Profile
	blockSize int
	lora      string
	opts      Options
	log       zerolog.Logger

	h       hashing.BlockHasher
	checked int // checks performed (match or mismatch)
	credit  int // blocks seen since the warm-up, less Every per check
	mem     *[rememberSlots]remembered

	matches, mismatches atomic.Uint64
	skips               [NumSkipReasons]atomic.Uint64
	warned              atomic.Bool
	noted               atomic.Bool // the INFO about a first skip is out
}

type remembered struct {
	key    uint64
	digest [32]byte
	ok     bool
	// mismatched: the block's hash did not match; digest is unknown
	mismatched bool
}

// Sample accounts for a stored event of n blocks and returns how many of
// its leading blocks to check: all of them (up to the rest of the warm-up)
// at first, then one whenever about Every blocks went by unchecked, up to
// MaxPerEvent. Most events after the warm-up get 0, and a decoder can then
// leave their token ids undecoded.
func (c *Checker) Sample(n int) int {
	if n <= 0 {
		return 0
	}
	if left := c.opts.Warmup - c.checked; left > 0 {
		return min(n, left)
	}
	// Credit left unspent (the sampled blocks could not be checked) is
	// kept, but only up to one event's worth, so a long stretch of
	// uncheckable events is not followed by a burst.
	c.credit = min(c.credit+n, c.opts.Every*c.opts.MaxPerEvent)
	return min(n, c.credit/c.opts.Every, c.opts.MaxPerEvent)
}

// Check hashes one block under the registered profile and compares it with
// the published hash. words are the block's token ids (SGLang bigram:
// its pairs, flattened). It returns the result and the parent to pass for
// the event's next block: this block's digest when it is known (it matched,
// or was published in full), else what the published key allows.
//
// Check does not sample: call it for the blocks Sample granted.
func (c *Checker) Check(parent Parent, words []int32, ex Extras, pub Published) (Result, Parent) {
	r, why, next := c.check(parent, words, ex, pub)
	if r == Skipped {
		c.Skip(why, 1)
	}
	return r, next
}

// check is Check without counting a skip, whose reason it returns.
func (c *Checker) check(parent Parent, words []int32, ex Extras, pub Published) (Result, SkipReason, Parent) {
	next := FromKey(pub.Key)
	if len(pub.Digest) == c.profile.DigestLen() {
		next = FromDigest(pub.Digest)
	}
	var pd *[32]byte
	switch {
	case len(words) == 0:
		return Skipped, SkipNoTokenIDs, next
	case !ex.Known:
		return Skipped, SkipNoExtraKeys, next
	case ex.Foreign:
		return Skipped, SkipForeignExtraKeys, next
	}
	switch parent.state {
	case parentRoot:
	case parentDigest:
		if int(parent.size) != c.profile.DigestLen() {
			// A digest of another algorithm's size: the registered
			// one cannot hash from it.
			return Skipped, SkipParentNotPinned, next
		}
		pd = &parent.digest
	case parentKey:
		d, ok, mismatched := c.recall(parent.key)
		switch {
		case mismatched:
			return Skipped, SkipParentMismatched, next
		case !ok:
			return Skipped, SkipParentNotPinned, next
		}
		pd = &d
	default:
		return Skipped, SkipParentNotPinned, next
	}
	if !c.shapeOK(len(words)) {
		return Skipped, SkipBlockShape, next
	}
	salt := ""
	if pd == nil {
		salt = ex.Salt
	}
	d, ok := c.h.Digest(&c.profile, pd, words, c.lora, salt)
	if !ok {
		return Skipped, SkipUnhashable, next
	}
	if c.checked >= c.opts.Warmup {
		c.credit -= c.opts.Every
	}
	c.checked++
	if c.matches1(&d, pub) {
		c.matches.Add(1)
		c.remember(pub.Key, &d)
		return Match, 0, Parent{state: parentDigest, digest: d, size: uint8(c.profile.DigestLen())}
	}
	c.mismatches.Add(1)
	if !c.warned.Swap(true) {
		c.warn(pd, words, ex, pub)
	}
	if next.state == parentKey {
		// the blocks after it name it by key: they are skipped as
		// following a mismatch, not as never verified
		c.rememberMismatch(pub.Key)
	}
	return Mismatch, 0, next
}

// Skip counts blocks sampled blocks that could not be checked for why. The
// first skip of a service logs one INFO naming what its events lack, so an
// engine whose blocks are never checked does not go unnoticed: no match
// and no mismatch is otherwise indistinguishable from a quiet engine.
func (c *Checker) Skip(why SkipReason, blocks int) {
	if blocks <= 0 || why >= NumSkipReasons {
		return
	}
	c.skips[why].Add(uint64(blocks))
	if why == SkipParentMismatched {
		// the mismatch's WARN explains these: the INFO is about what
		// events lack, and they lack nothing
		return
	}
	if !c.noted.Swap(true) {
		c.log.Info().Str("missing", why.String()).Str("strategy", c.profile.Strategy).
			Str("detail", skipHelp[why]).
			Msg("the ingest hash check cannot check this service's blocks; it counts them as skipped until its events carry what it needs")
	}
}

// matches1 compares a recomputed digest with what the engine published.
func (c *Checker) matches1(d *[32]byte, pub Published) bool {
	if pub.Digest != nil {
		return bytes.Equal(c.profile.DigestBytes(d), pub.Digest)
	}
	return c.profile.Key(d) == pub.Key
}

// shapeOK says whether words can be one block of this service: exactly
// block_size tokens for vLLM; 1 to block_size positions for SGLang, whose
// last page may be partial (bigram positions are word pairs).
func (c *Checker) shapeOK(words int) bool {
	switch c.profile.Strategy {
	case hashing.StrategyVLLMV1:
		return words == c.blockSize
	case hashing.StrategySGLangBigram:
		return words%2 == 0 && words > 0 && words/2 <= c.blockSize
	}
	return words > 0 && words <= c.blockSize
}

// Event is one stored event's blocks, for CheckEvent.
type Event struct {
	Parent Parent
	// Tokens are all the event's token ids (SGLang bigram: pairs,
	// flattened), block after block.
	Tokens []int32
	// BlockSize is the event's block_size (SGLang's may be below the
	// registered one for a final partial page).
	BlockSize int
	// Keys are the published hashes projected to index keys.
	Keys []uint64
	// Digests, when not nil, holds each block's published bytes (vLLM
	// with integer hashes off), parallel to Keys.
	Digests [][]byte
	// Extras, when its length equals Keys', describes each block; any
	// other length means the event did not say (all unknown).
	Extras []Extras
}

// CheckEvent checks the first n blocks of ev (n from Sample) as a chain,
// stopping at the first block it cannot check, since every later block
// hangs off it. It returns the number of matches and mismatches.
func (c *Checker) CheckEvent(ev *Event, n int) (matches, mismatches int) {
	p := ev.Parent
	w := ev.BlockSize
	if c.profile.Strategy == hashing.StrategySGLangBigram {
		w *= 2
	}
	if w <= 0 {
		return 0, 0
	}
	granted := min(n, len(ev.Keys))
	for i := 0; i < granted; i++ {
		start := i * w
		if start >= len(ev.Tokens) {
			why := SkipBlockShape
			if len(ev.Tokens) == 0 {
				why = SkipNoTokenIDs
			}
			c.Skip(why, granted-i)
			break
		}
		end := min(start+w, len(ev.Tokens))
		var ex Extras
		if len(ev.Extras) == len(ev.Keys) {
			ex = ev.Extras[i]
		}
		pub := Published{Key: ev.Keys[i]}
		if ev.Digests != nil {
			pub.Digest = ev.Digests[i]
		}
		var (
			r   Result
			why SkipReason
		)
		r, why, p = c.check(p, ev.Tokens[start:end], ex, pub)
		switch r {
		case Match:
			matches++
		case Mismatch:
			mismatches++
		default:
			// Every later block hangs off this one: none can be
			// checked, for the same reason.
			c.Skip(why, granted-i)
			if why == SkipParentMismatched && ev.Digests == nil {
				// and an event continuing them hangs off the
				// mismatch too
				for _, k := range ev.Keys[i:granted] {
					c.rememberMismatch(k)
				}
			}
			return matches, mismatches
		}
	}
	return matches, mismatches
}

// remember keeps a verified block's digest for events that continue it.
func (c *Checker) remember(key uint64, d *[32]byte) {
	if c.mem == nil {
		c.mem = new([rememberSlots]remembered)
	}
	c.mem[key%rememberSlots] = remembered{key: key, digest: *d, ok: true}
}

// rememberMismatch notes a block whose hash did not match, so that the
// blocks hanging off it are skipped for that reason.
func (c *Checker) rememberMismatch(key uint64) {
	if c.mem == nil {
		c.mem = new([rememberSlots]remembered)
	}
	c.mem[key%rememberSlots] = remembered{key: key, mismatched: true}
}

// recall returns a remembered block's digest (ok) or says it mismatched.
func (c *Checker) recall(key uint64) (d [32]byte, ok, mismatched bool) {
	if c.mem == nil {
		return [32]byte{}, false, false
	}
	r := &c.mem[key%rememberSlots]
	if r.key != key {
		return [32]byte{}, false, false
	}
	return r.digest, r.ok, r.mismatched
}

// Counts returns the matches and mismatches so far.
func (c *Checker) Counts() (matches, mismatches uint64) {
	return c.matches.Load(), c.mismatches.Load()
}

// Service is the key the checker was created for.
func (c *Checker) Service() string { return c.service }

// Set holds the checkers of the registered services, for the metrics.
type Set struct {
	opts Options
	mu   sync.Mutex
	m    map[string]*Checker
}

// NewSet returns an empty set whose checkers use opts.
func NewSet(opts Options) *Set {
	return &Set{opts: opts.withDefaults(), m: map[string]*Checker{}}
}

// Add creates the checker of a service registered with profile p, block
// size and LoRA name, replacing any earlier one of the same key; its counts
// are exported (at zero) from now on.
func (s *Set) Add(service string, p *hashing.Profile, blockSize int, lora string) *Checker {
	c := &Checker{
		service: service, profile: *p, blockSize: blockSize, lora: lora,
		opts: s.opts, log: s.opts.Logger.With().Str("service", service).Logger(),
	}
	s.mu.Lock()
	s.m[service] = c
	s.mu.Unlock()
	return c
}

// Remove drops c's counts when its service is unregistered. A checker that
// was already replaced by a newer one of the same key is ignored, so the
// order of a restart's stop and start does not matter.
func (s *Set) Remove(c *Checker) {
	if c == nil {
		return
	}
	s.mu.Lock()
	if s.m[c.service] == c {
		delete(s.m, c.service)
	}
	s.mu.Unlock()
}

// Count is one service's results.
type Count struct {
	Service             string
	Matches, Mismatches uint64
	// Skipped counts sampled blocks that could not be checked, by reason.
	Skipped [NumSkipReasons]uint64
}

// SkippedTotal is the sum of c.Skipped.
func (c *Count) SkippedTotal() uint64 {
	var n uint64
	for _, v := range c.Skipped {
		n += v
	}
	return n
}

// Skips returns the blocks skipped so far, by reason.
func (c *Checker) Skips() (out [NumSkipReasons]uint64) {
	for i := range out {
		out[i] = c.skips[i].Load()
	}
	return out
}

// Snapshot returns every current checker's counts, in no particular order.
func (s *Set) Snapshot() []Count {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Count, 0, len(s.m))
	for k, c := range s.m {
		m, mm := c.Counts()
		out = append(out, Count{Service: k, Matches: m, Mismatches: mm, Skipped: c.Skips()})
	}
	return out
}
