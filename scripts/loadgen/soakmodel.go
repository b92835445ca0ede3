package main

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
)

// The soak's content model. Unlike the benchmark corpus, which is fixed
// before the run, soak publishers keep storing new prompts and evicting old
// ones for as long as the soak lasts, so that a server which leaks evicted
// entries grows without bound while a correct one plateaus. Everything a
// query can match is therefore described structurally instead of by a trie:
//
//   - a prompt is a content key; its tokens are its group's system prompt
//     followed by a suffix drawn from a PRNG seeded with the key, so every
//     worker regenerates the same tokens without sharing them;
//   - a publisher's state is the set of contents it holds (a FIFO window)
//     and, per group, how many of them use that group's system prompt, which
//     is stored while at least one does, as an engine with prefix caching
//     keeps shared blocks while any request references them;
//   - a query is a source content (or none), its group and how many leading
//     blocks it keeps from that source before fresh tokens.
//
// Expected answers come from token identity through this model, never from
// the hashing package the server uses; TestSoakModelMatchesTrie checks the
// model against the benchmark's brute-force trie on the real tokens.

// contentKey names a prompt. Private contents are held by one publisher,
// shared ones (the same tokens) may be stored by every publisher, each at
// its own pace, which exercises blocks with several owners. 0 is no content.
type contentKey uint64

const sharedSlot = 0xffff // publisher slot of shared contents

func privateContent(pub, step int) contentKey {
	return contentKey(uint64(step)<<16 | uint64(pub))
}

func sharedContent(step int) contentKey { return contentKey(uint64(step)<<16 | sharedSlot) }

// sharedEvery makes every third step of every publisher a shared content.
const sharedEvery = 3

// contentAt is the content publisher pub stores at step (1-based).
func contentAt(pub, step int) contentKey {
	if step%sharedEvery == 0 {
		return sharedContent(step)
	}
	return privateContent(pub, step)
}

// soakShape sizes prompts and generates their tokens.
type soakShape struct {
	bs        int   // tokens per block
	sysBlocks int   // blocks of each group's system prompt
	blocks    int   // blocks of every prompt
	groups    int   // distinct system prompts
	vocab     int32 // tokens are drawn from [0, vocab)
	seed      uint64
	systems   [][]int32
}

func newSoakShape(bs, promptTokens, systemTokens, groups int, vocab int32, seed uint64) (*soakShape, error) {
	s := &soakShape{bs: bs, sysBlocks: systemTokens / bs, blocks: promptTokens / bs, groups: groups, vocab: vocab, seed: seed}
	switch {
	case bs < 1:
		return nil, fmt.Errorf("block size must be positive")
	case s.sysBlocks < 1 || s.sysBlocks >= s.blocks:
		return nil, fmt.Errorf("the system prompt must span at least one block and fewer blocks than the prompt")
	case groups < 1:
		return nil, fmt.Errorf("need at least one group")
	}
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	s.systems = make([][]int32, groups)
	for g := range s.systems {
		s.systems[g] = make([]int32, s.sysBlocks*bs)
		for i := range s.systems[g] {
			s.systems[g][i] = rng.Int32N(vocab)
		}
	}
	return s, nil
}

// mix64 is SplitMix64's finalizer: a cheap, well-spread hash of a key.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

func (s *soakShape) group(k contentKey) int { return int(mix64(uint64(k)^s.seed) % uint64(s.groups)) }

// tokens returns content k's prompt: its group's system prompt, then a
// suffix only k has.
func (s *soakShape) tokens(k contentKey) []int32 {
	t := make([]int32, s.blocks*s.bs)
	n := copy(t, s.systems[s.group(k)])
	rng := rand.New(rand.NewPCG(s.seed^0x9e3779b97f4a7c15, uint64(k)))
	for i := n; i < len(t); i++ {
		t[i] = rng.Int32N(s.vocab)
	}
	return t
}

// heldState is one publisher's cache at one version. Versions are
// immutable once published, so query workers read them without copying.
type heldState struct {
	contents []contentKey // oldest first
	sysRef   []int32      // per group, held contents using its system prompt
}

func emptyState(groups int) *heldState { return &heldState{sysRef: make([]int32, groups)} }

func (h *heldState) holds(k contentKey) bool { return slices.Contains(h.contents, k) }

// soakQuery is what the checker needs to know about a query's tokens.
type soakQuery struct {
	kind   queryKind
	source contentKey // 0 for system and cold queries
	group  int
	keep   int // leading blocks taken from the source (or the system prompt)
}

// match is the number of leading blocks of q a publisher in state h holds.
// Suffix blocks chain onto the system prompt's, so without the system prompt
// nothing matches; with it, the source's own blocks extend the match only if
// the source is held.
func (h *heldState) match(q *soakQuery, sysBlocks int) int {
	if q.kind == kindCold || h.sysRef[q.group] == 0 {
		return 0
	}
	if q.source != 0 && h.holds(q.source) {
		return q.keep
	}
	return min(q.keep, sysBlocks)
}

// phase is where a publisher is in its registration lifecycle.
type phase uint8

const (
	phaseLive      phase = iota // registered, subscription carries events
	phaseLeaving                // unregister call in flight
	phaseGone                   // unregistered
	phaseJoining                // registered, subscription not yet confirmed
	phaseReplacing              // registered, its process restarted in place
)

// historySize bounds the versions kept per publisher. A query whose span
// covers more versions than this cannot be bounded and is counted as
// unchecked instead of guessed at.
const historySize = 256

// pubModel is the shared record of one publisher's published state: the
// versions it has sent, the last one the server is known to have applied,
// and its registration phase. The publisher goroutine writes it; query
// workers read it at the start and at the end of every query.
//
// The order of writes is what makes the check sound: a version is recorded
// and counted as sent before its message leaves the socket, and counted as
// applied only after a query showed its effect. So a query spanning
// [t0, t1] ran against the server somewhere between versions applied(t0)
// and sent(t1). A batch records a version after each of its events, and
// each event only adds blocks or only removes them, so while the server is
// part-way through one the blocks it holds lie between those of the two
// versions around it; longest_matched grows with the blocks held, so it
// lies between the smallest and the largest match of those versions.
type pubModel struct {
	mu       sync.RWMutex
	versions [historySize]*heldState
	applied  uint64
	sent     uint64
	phase    phase
	gen      uint64 // bumped at every phase change
}

func newPubModel(groups int) *pubModel {
	m := &pubModel{phase: phaseJoining}
	m.versions[0] = emptyState(groups)
	return m
}

// current returns the newest version (the publisher's own view).
func (m *pubModel) current() *heldState {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.versions[m.sent%historySize]
}

// push records states as the next versions and counts them as sent.
func (m *pubModel) push(states ...*heldState) {
	m.mu.Lock()
	for _, s := range states {
		m.sent++
		m.versions[m.sent%historySize] = s
	}
	m.mu.Unlock()
}

// markApplied marks every sent version as applied by the server.
func (m *pubModel) markApplied() {
	m.mu.Lock()
	m.applied = m.sent
	m.mu.Unlock()
}

func (m *pubModel) setPhase(p phase) {
	m.mu.Lock()
	m.phase = p
	m.gen++
	m.mu.Unlock()
}

func (m *pubModel) getPhase() phase {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.phase
}

// mark is a publisher's model as a query saw it when it was sent.
type mark struct {
	applied uint64
	phase   phase
	gen     uint64
}

func (m *pubModel) mark() mark {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return mark{m.applied, m.phase, m.gen}
}

// expectation is what one publisher's entry in an answer may be.
type expectation struct {
	pres presence
	// lo and hi bound longest_matched in blocks; lo == hi where the state
	// was stable for the whole query.
	lo, hi int
	// unchecked is set when the query outlived the kept history.
	unchecked bool
}

// expect combines the mark taken when a query was sent with the model when
// its answer arrived. Registered throughout (same phase generation, live):
// present, and within the range of the versions that may have been applied
// meanwhile. Unregistered throughout: absent. Anything else overlapped a
// registration change: absent, or present with at most the highest match of
// those versions (an unregistration retracts entries one by one, so any
// lower value is consistent too).
func (m *pubModel) expect(start mark, q *soakQuery, sysBlocks int) expectation {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.sent-start.applied >= historySize {
		return expectation{pres: mayVanish, hi: q.keep, unchecked: true}
	}
	lo, hi := q.keep, 0
	for v := start.applied; v <= m.sent; v++ {
		n := m.versions[v%historySize].match(q, sysBlocks)
		lo, hi = min(lo, n), max(hi, n)
	}
	switch {
	case start.gen == m.gen && start.phase == phaseLive:
		return expectation{pres: mustMatch, lo: lo, hi: hi}
	case start.gen == m.gen && start.phase == phaseGone:
		return expectation{pres: mustBeGone}
	}
	return expectation{pres: mayVanish, lo: 0, hi: hi}
}

// checkSoakAnswer checks a decoded /query answer against per-publisher
// expectations (in blocks of bs tokens). Transient services (names starting
// with transientPrefix) hold nothing, so they may appear with zero counts
// unless isGone says they were unregistered before the query was sent.
// Every publisher stores on the device tier of rank 0 only, so all four
// tiers, dp["0"] and rank_matches["0"] equal longest_matched.
func checkSoakAnswer(r *queryResponse, ids []string, exp []expectation, bs int, transientPrefix string, isGone func(string) bool) error {
	seen := 0
	for i, id := range ids {
		h, ok := r.Instances[id]
		e := exp[i]
		switch {
		case e.pres == mustBeGone && ok:
			return fmt.Errorf("%w: %s answered after its unregistration", errMismatch, id)
		case e.pres == mustMatch && !ok:
			return fmt.Errorf("%w: %s missing", errMismatch, id)
		case !ok:
			continue
		}
		seen++
		if err := consistentHit(id, h); err != nil {
			return err
		}
		lo, hi := int64(e.lo*bs), int64(e.hi*bs)
		if e.pres == mayVanish {
			lo = 0
		}
		if h.LongestMatched < lo || h.LongestMatched > hi {
			if lo == hi {
				return fmt.Errorf("%w: %s: longest_matched=%d, expected %d", errMismatch, id, h.LongestMatched, lo)
			}
			return fmt.Errorf("%w: %s: longest_matched=%d, expected %d..%d (update in flight)", errMismatch, id, h.LongestMatched, lo, hi)
		}
	}
	for id, h := range r.Instances {
		if !strings.HasPrefix(id, transientPrefix) {
			continue
		}
		seen++
		if isGone != nil && isGone(id) {
			return fmt.Errorf("%w: transient %s answered after its unregistration", errMismatch, id)
		}
		if err := consistentHit(id, h); err != nil {
			return err
		}
		if h.LongestMatched != 0 {
			return fmt.Errorf("%w: transient %s with nothing behind its endpoint matched %d tokens", errMismatch, id, h.LongestMatched)
		}
	}
	if seen != len(r.Instances) {
		return fmt.Errorf("%w: %d instances in the answer, %d known", errMismatch, len(r.Instances), seen)
	}
	return nil
}

// consistentHit checks one entry is internally consistent for a publisher
// that stores on the device tier of rank 0 only.
func consistentHit(id string, h instanceHits) error {
	n := h.LongestMatched
	if h.Device != n || h.CPULocal != n || h.CPUShare != n || h.Disk != n {
		return fmt.Errorf("%w: %s: longest_matched=%d device=%d cpu_local=%d cpu_share=%d disk=%d, expected equal tiers",
			errMismatch, id, n, h.Device, h.CPULocal, h.CPUShare, h.Disk)
	}
	if len(h.DP) != 1 || h.DP["0"] != n {
		return fmt.Errorf("%w: %s: dp=%v, expected {0: %d}", errMismatch, id, h.DP, n)
	}
	if rm, ok := h.RankMatches["0"]; len(h.RankMatches) != 1 || !ok || rm != (tiers{n, n, n, n}) {
		return fmt.Errorf("%w: %s: rank_matches=%v, expected all %d on rank 0", errMismatch, id, h.RankMatches, n)
	}
	return nil
}
