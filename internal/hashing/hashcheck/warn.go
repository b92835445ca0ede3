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

// reproduce tries single changes to the profile and reports the first that
// yields the published hash, or "". It runs once per service.
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
		other := hashing.AlgorithmSHA256
		if c.profile.Algorithm == hashing.AlgorithmSHA256 {
			other = hashing.AlgorithmSHA256CBOR
		}
		s := base
		s.Algorithm = other
		alts = append(alts, alt{"algorithm " + other, s, c.lora, salt})
		if c.lora != "" {
			alts = append(alts, alt{"no LoRA name", base, "", salt})
		}
		if parent == nil {
			for _, sd := range []string{"0", hashing.SeedRandom} {
				if sd != seed {
					s := base
					s.PythonHashSeed = &sd
					alts = append(alts, alt{"python_hash_seed " + sd, s, c.lora, salt})
				}
			}
		}
	}
	if parent == nil && salt != "" {
		alts = append(alts, alt{"no cache salt", base, c.lora, ""})
	}
	for _, a := range alts {
		p, err := hashing.Resolve(a.spec)
		if err != nil {
			continue
		}
		d, ok := c.h.Digest(&p, parent, words, a.lora, a.salt)
		if ok && c.matches1(&d, pub) {
			return a.name
		}
	}
	return ""
}
