package hashcheck

import (
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
)

// warn logs a service's first mismatch, once. Besides the causes that fit
// where the block sat in its chain, it tries the likeliest single changes to
// the profile on this very block and names the first one that reproduces
// the engine's hash. Token ids and salts are never logged.
func (c *Checker) warn(parent *[32]byte, words []int32, ex Extras, pub Published) {
	start := parent == nil
	ev := c.log.Warn().
		Str("strategy", c.profile.Strategy).
		Str("algorithm", c.profile.Algorithm).
		Int("block_size", c.blockSize).
		Bool("chain_start", start).
		Str("likely_causes", causes(c.profile.Strategy, start))
	if alt := c.reproduce(parent, words, ex, pub); alt != "" {
		ev = ev.Str("reproduced_with", alt)
	}
	ev.Msg("an engine published a block hash its registered hash profile does not reproduce: queries will not find its blocks")
}

// causes lists what can make engine and profile disagree. A block hashed
// from a given parent digest does not depend on the seed, so the seed is
// named only for a chain's first block.
func causes(strategy string, start bool) string {
	switch {
	case strategy == hashing.StrategyVLLMV1 && start:
		return "python_hash_seed differs from the engine's PYTHONHASHSEED; algorithm differs from the engine's --prefix-caching-hash-algo; the LoRA name; cache salt handling; block_size differs from the engine's hash block size"
	case strategy == hashing.StrategyVLLMV1:
		return "algorithm differs from the engine's --prefix-caching-hash-algo; the LoRA name; block_size differs from the engine's hash block size"
	case start:
		return "strategy (sglang or sglang_bigram for speculative decoding); cache salt handling (SGLang releases that publish unsalted hashes for salted requests); page size differs from block_size"
	}
	return "strategy (sglang or sglang_bigram for speculative decoding); page size differs from block_size"
}

// vllmAlgorithms are vLLM's --prefix-caching-hash-algo values, in the
// order the check tries them (docs/hashing.md#vllm-algorithms).
var vllmAlgorithms = []string{hashing.AlgorithmSHA256, hashing.AlgorithmSHA256CBOR, hashing.AlgorithmXXHash, hashing.AlgorithmXXHashCBOR}

// vllmSeeds are the roots the check tries for a chain's first block: the
// explicit seeds people most often set, and the root of an engine started
// without PYTHONHASHSEED.
var vllmSeeds = []string{"0", hashing.SeedRandom, hashing.SeedVLLMNoneHash}

// reproduce tries changes to the profile and reports the first that
// yields the published hash, or "": single changes first (another
// algorithm, no LoRA name, another root, no salt), then, for a chain's
// first block, another algorithm with another root together, since a
// registration written for an explicit seed and one algorithm often meets
// engines at vLLM's defaults (sha256, PYTHONHASHSEED unset). It runs once
// per service.
func (c *Checker) reproduce(parent *[32]byte, words []int32, ex Extras, pub Published) string {
	type alt struct {
		name       string
		spec       hashing.Spec
		lora, salt string
	}
	seed := c.profile.PythonHashSeed
	base := hashing.Spec{Strategy: c.profile.Strategy, Algorithm: c.profile.Algorithm,
		IndexProjection: c.profile.IndexProjection, PythonHashSeed: &seed}
	salt := ""
	if parent == nil {
		salt = ex.Salt
	}
	var alts []alt
	if c.profile.Strategy == hashing.StrategyVLLMV1 {
		var others []string
		for _, a := range vllmAlgorithms {
			if a != c.profile.Algorithm {
				others = append(others, a)
			}
		}
		for _, a := range others {
			s := base
			s.Algorithm = a
			alts = append(alts, alt{"algorithm " + a, s, c.lora, salt})
		}
		if c.lora != "" {
			alts = append(alts, alt{"no LoRA name", base, "", salt})
		}
		if parent == nil {
			for _, sd := range vllmSeeds {
				if sd != seed {
					s := base
					s.PythonHashSeed = &sd
					alts = append(alts, alt{"python_hash_seed " + sd, s, c.lora, salt})
				}
			}
		}
		if parent == nil && salt != "" {
			alts = append(alts, alt{"no cache salt", base, c.lora, ""})
		}
		if parent == nil {
			for _, a := range others {
				for _, sd := range vllmSeeds {
					if sd != seed {
						s := base
						s.Algorithm, s.PythonHashSeed = a, &sd
						alts = append(alts, alt{"algorithm " + a + ", python_hash_seed " + sd, s, c.lora, salt})
					}
				}
			}
		}
	} else if parent == nil && salt != "" {
		alts = append(alts, alt{"no cache salt", base, c.lora, ""})
	}
	for _, a := range alts {
		p, err := hashing.Resolve(a.spec)
		if err != nil {
			continue // e.g. xxhash with "vllm-none-hash", which has no root
		}
		if parent != nil && p.DigestLen() != c.profile.DigestLen() {
			continue // the parent is a digest of the registered algorithm
		}
		d, ok := c.h.Digest(&p, parent, words, a.lora, a.salt)
		if ok && matchesUnder(&p, &d, pub) {
			return a.name
		}
	}
	return ""
}

// matchesUnder compares digest d, computed under p, with what the engine
// published: its whole digest when it sent bytes, else its key.
func matchesUnder(p *hashing.Profile, d *[32]byte, pub Published) bool {
	if pub.Digest != nil {
		return string(p.DigestBytes(d)) == string(pub.Digest)
	}
	return p.Key(d) == pub.Key
}
