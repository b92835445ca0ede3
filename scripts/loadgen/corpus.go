package main

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"strconv"
	"strings"
)

// The corpus is what the fake engines store and what the router-side load
// asks for. Its shape mimics a production prompt mix: a few system prompts
// shared by many requests (groups), each stored prompt being a system prompt
// followed by a private suffix, and queries that hit a stored prompt fully,
// partially, only through its system prompt, or not at all (cold).
//
// Expected answers are computed from token identity alone (a trie of
// blocks), never from the hashing package the server uses, so a hashing or
// indexing bug in the server shows up as a wrong answer instead of being
// reproduced on both sides.

// corpusConfig sizes the corpus. Token counts are rounded down to whole
// blocks: the vLLM profile hashes full blocks only, and keeping every prompt
// block-aligned makes SGLang's partial-page rule irrelevant.
type corpusConfig struct {
	Publishers   int    // fake engines
	BlockSize    int    // tokens per KV block
	PromptTokens int    // length of every stored prompt and every query
	SystemTokens int    // length of each group's shared system prompt
	Groups       int    // distinct system prompts
	Blocks       int    // target for the blocks all publishers publish together
	Prompts      int    // when positive, exactly this many stored prompts (Blocks is ignored)
	Replicas     int    // publishers that store each prompt
	Queries      int    // size of the query pool
	Mix          mix    // query kinds, by weight
	Vocab        int32  // corpus tokens are drawn from [0, Vocab)
	Seed         uint64 // makes the corpus reproducible
}

// mix weights the query kinds in the pool.
type mix struct{ Full, Partial, System, Cold int }

// parseMix reads "full=4,partial=3,system=2,cold=1"; omitted kinds weigh 0.
func parseMix(s string) (mix, error) {
	var m mix
	for _, part := range strings.Split(s, ",") {
		name, val, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return m, fmt.Errorf("mix %q: want kind=weight", part)
		}
		w, err := strconv.Atoi(val)
		if err != nil || w < 0 {
			return m, fmt.Errorf("mix %q: weight must be a non-negative integer", part)
		}
		switch name {
		case "full":
			m.Full = w
		case "partial":
			m.Partial = w
		case "system":
			m.System = w
		case "cold":
			m.Cold = w
		default:
			return m, fmt.Errorf("mix: unknown kind %q (full, partial, system, cold)", name)
		}
	}
	if m.Full+m.Partial+m.System+m.Cold == 0 {
		return m, fmt.Errorf("mix %q: all weights are zero", s)
	}
	return m, nil
}

type queryKind uint8

const (
	kindFull    queryKind = iota // a stored prompt verbatim
	kindPartial                  // a stored prompt cut after k blocks, then fresh tokens
	kindSystem                   // a group's system prompt, then fresh tokens
	kindCold                     // fresh tokens only: never stored anywhere
	numKinds
)

func (k queryKind) String() string {
	return [...]string{"full", "partial", "system", "cold"}[k]
}

// prompt is one stored prompt and the publishers that store it.
type prompt struct {
	tokens  []int32
	group   int
	holders []int
}

// placement is one prompt as one publisher publishes it: only the blocks
// that publisher does not hold yet, as an engine with prefix caching would
// store (and announce) only the blocks it had to compute.
type placement struct {
	prompt   int // index into corpus.prompts
	firstNew int // first block index not yet held by the publisher
}

// query is one pool entry with the answer the server must give.
type query struct {
	kind   queryKind
	tokens []int32
	// expect[p] is publisher p's expected longest_matched in tokens.
	expect []int
}

// corpus is the generated workload.
type corpus struct {
	cfg       corpusConfig
	systems   [][]int32
	prompts   []prompt
	perPub    [][]placement
	queries   []query
	trie      *trie
	published int // blocks published by all publishers together
	kinds     [numKinds]int
}

// distinctBlocks is the number of distinct block prefixes in the corpus,
// which is what /global_view's prefix_count reaches once all is ingested.
func (c *corpus) distinctBlocks() int { return c.trie.nodes }

func (cfg *corpusConfig) validate() error {
	switch {
	case cfg.Publishers < 1:
		return fmt.Errorf("need at least one publisher")
	case cfg.BlockSize < 1:
		return fmt.Errorf("block size must be positive")
	case cfg.PromptTokens/cfg.BlockSize < 2:
		return fmt.Errorf("prompt must span at least two blocks")
	case cfg.SystemTokens/cfg.BlockSize < 1 || cfg.SystemTokens/cfg.BlockSize >= cfg.PromptTokens/cfg.BlockSize:
		return fmt.Errorf("system prompt must span at least one block and fewer blocks than the prompt")
	case cfg.Groups < 1:
		return fmt.Errorf("need at least one group")
	case cfg.Blocks < 1 && cfg.Prompts < 1:
		return fmt.Errorf("need at least one block")
	case cfg.Prompts < 0:
		return fmt.Errorf("prompts must not be negative")
	case cfg.Replicas < 1 || cfg.Replicas > cfg.Publishers:
		return fmt.Errorf("replicas must be in 1..publishers")
	case cfg.Queries < 1:
		return fmt.Errorf("need at least one query")
	case cfg.Vocab < 2:
		return fmt.Errorf("vocabulary too small")
	}
	return nil
}

// newCorpus generates the stored prompts until the publishers together
// publish at least cfg.Blocks blocks, then the query pool with its answers.
func newCorpus(cfg corpusConfig) (*corpus, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	bs := cfg.BlockSize
	promptLen := cfg.PromptTokens / bs * bs
	sysLen := cfg.SystemTokens / bs * bs
	rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))
	c := &corpus{cfg: cfg, perPub: make([][]placement, cfg.Publishers), trie: newTrie(bs, cfg.Publishers)}
	fresh := func(n int) []int32 {
		t := make([]int32, n)
		for i := range t {
			t[i] = rng.Int32N(cfg.Vocab)
		}
		return t
	}
	c.systems = make([][]int32, cfg.Groups)
	for g := range c.systems {
		c.systems[g] = fresh(sysLen)
	}

	// Every prompt adds at least one new block per holder (its suffix is
	// fresh), so this loop ends after at most cfg.Blocks prompts.
	more := func(i int) bool {
		if cfg.Prompts > 0 {
			return i < cfg.Prompts
		}
		return c.published < cfg.Blocks
	}
	for i := 0; more(i); i++ {
		g := rng.IntN(cfg.Groups)
		toks := make([]int32, promptLen)
		copy(toks, c.systems[g])
		copy(toks[sysLen:], fresh(promptLen-sysLen))
		// The primary holder goes round robin so publishers stay balanced;
		// replicas land on distinct random others.
		holders := []int{i % cfg.Publishers}
		for len(holders) < cfg.Replicas {
			p := rng.IntN(cfg.Publishers)
			if !containsInt(holders, p) {
				holders = append(holders, p)
			}
		}
		idx := len(c.prompts)
		c.prompts = append(c.prompts, prompt{tokens: toks, group: g, holders: holders})
		for _, p := range holders {
			first := c.trie.insert(toks, p)
			c.perPub[p] = append(c.perPub[p], placement{prompt: idx, firstNew: first})
			c.published += promptLen/bs - first
		}
	}

	total := cfg.Mix.Full + cfg.Mix.Partial + cfg.Mix.System + cfg.Mix.Cold
	c.queries = make([]query, cfg.Queries)
	for qi := range c.queries {
		w := rng.IntN(total)
		var kind queryKind
		switch {
		case w < cfg.Mix.Full:
			kind = kindFull
		case w < cfg.Mix.Full+cfg.Mix.Partial:
			kind = kindPartial
		case w < cfg.Mix.Full+cfg.Mix.Partial+cfg.Mix.System:
			kind = kindSystem
		default:
			kind = kindCold
		}
		var toks []int32
		switch kind {
		case kindFull:
			toks = c.prompts[rng.IntN(len(c.prompts))].tokens
		case kindPartial:
			src := c.prompts[rng.IntN(len(c.prompts))].tokens
			k := 1 + rng.IntN(promptLen/bs-1) // keep 1..blocks-1 blocks
			toks = make([]int32, promptLen)
			copy(toks, src[:k*bs])
			copy(toks[k*bs:], fresh(promptLen-k*bs))
		case kindSystem:
			toks = make([]int32, promptLen)
			copy(toks, c.systems[rng.IntN(cfg.Groups)])
			copy(toks[sysLen:], fresh(promptLen-sysLen))
		case kindCold:
			toks = fresh(promptLen)
		}
		c.queries[qi] = query{kind: kind, tokens: toks, expect: c.trie.expect(toks)}
		c.kinds[kind]++
	}
	return c, nil
}

// coldQueries returns every stored prompt once, in a random order, as a
// full query with its expected answer: with all blocks indexed and none of
// them asked before, these are the cold lookups of --cold-pass.
func (c *corpus) coldQueries() []query {
	rng := rand.New(rand.NewPCG(c.cfg.Seed^0x5bd1e995, c.cfg.Seed))
	out := make([]query, len(c.prompts))
	for i, j := range rng.Perm(len(c.prompts)) {
		toks := c.prompts[j].tokens
		out[i] = query{kind: kindFull, tokens: toks, expect: c.trie.expect(toks)}
	}
	return out
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// trie indexes block prefixes by token content. Node ids start at 1; 0 is
// the empty prefix. holders is a flat bitset, words uint64s per node, of the
// publishers holding that prefix. Because an engine stores a prompt's
// blocks from the first on, every publisher's set is prefix-closed, which is
// what makes "deepest held node on the query's path" the longest continuous
// match.
type trie struct {
	bs       int
	pubs     int
	words    int
	children map[string]uint32 // parent id (4 bytes) ‖ block tokens (4·bs bytes) → node
	holders  []uint64
	nodes    int
	key      []byte
}

func newTrie(bs, publishers int) *trie {
	w := (publishers + 63) / 64
	return &trie{
		bs: bs, pubs: publishers, words: w,
		children: make(map[string]uint32),
		holders:  make([]uint64, w), // node 0
		key:      make([]byte, 4+4*bs),
	}
}

func (t *trie) fillKey(parent uint32, block []int32) []byte {
	binary.LittleEndian.PutUint32(t.key, parent)
	for i, v := range block {
		binary.LittleEndian.PutUint32(t.key[4+4*i:], uint32(v))
	}
	return t.key
}

// insert records that publisher p holds every full block of tokens and
// returns the index of the first block p did not hold before.
func (t *trie) insert(tokens []int32, p int) (firstNew int) {
	n := len(tokens) / t.bs
	firstNew = n
	var node uint32
	for b := 0; b < n; b++ {
		k := t.fillKey(node, tokens[b*t.bs:(b+1)*t.bs])
		child, ok := t.children[string(k)]
		if !ok {
			t.nodes++
			child = uint32(t.nodes)
			t.children[string(k)] = child
			t.holders = append(t.holders, make([]uint64, t.words)...)
		}
		node = child
		w := &t.holders[int(node)*t.words+p/64]
		if *w&(1<<(p%64)) == 0 {
			*w |= 1 << (p % 64)
			if b < firstNew {
				firstNew = b
			}
		}
	}
	return firstNew
}

// expect returns, per publisher, how many leading tokens of tokens it holds.
func (t *trie) expect(tokens []int32) []int {
	out := make([]int, t.pubs)
	var node uint32
	for b := 0; b < len(tokens)/t.bs; b++ {
		child, ok := t.children[string(t.fillKey(node, tokens[b*t.bs:(b+1)*t.bs]))]
		if !ok {
			break
		}
		node = child
		for w := 0; w < t.words; w++ {
			for word := t.holders[int(node)*t.words+w]; word != 0; word &= word - 1 {
				out[w*64+bits.TrailingZeros64(word)] = (b + 1) * t.bs
			}
		}
	}
	return out
}
