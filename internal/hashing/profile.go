package hashing

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
)

// kind is the parsed (strategy, algorithm) pair of a resolved Profile. It is
// a small integer so that Profile stays comparable and the per-block code can
// switch on it without string compares.
type kind uint8

const (
	kindNone         kind = iota // zero Profile: no blocks
	kindVLLMCBOR                 // vllm_v1 / sha256_cbor / low64_be
	kindVLLMPickle               // vllm_v1 / sha256 / low64_be
	kindSGLang                   // sglang / sha256_raw / first64_be
	kindSGLangBigram             // sglang_bigram / sha256_raw / first64_be
	kindRFC1527                  // rfc1527 / xxh3_64 (the standard hash)
)

// The selector strings a hash profile may carry
// (docs/hashing.md#hash-profiles). Matching is exact and case-sensitive, as
// upstream's; they are exported so that callers building or checking profiles
// do not repeat the literals.
const (
	StrategyVLLMV1       = "vllm_v1"
	StrategySGLang       = "sglang"
	StrategySGLangBigram = "sglang_bigram"

	AlgorithmSHA256     = "sha256"
	AlgorithmSHA256CBOR = "sha256_cbor"
	AlgorithmSHA256Raw  = "sha256_raw"

	ProjectionLow64BE   = "low64_be"
	ProjectionFirst64BE = "first64_be"

	// SeedRandom is the literal seed text vLLM hashes when PYTHONHASHSEED
	// is "random"; it is not a request for randomness.
	SeedRandom = "random"
)

// maxSeedQuote bounds how much of a rejected seed is echoed in an error, so
// that a hostile multi-megabyte value cannot bloat responses or logs.
const maxSeedQuote = 40

// Resolve validates a registration's hash profile
// (docs/hashing.md#hash-profiles, docs/hashing.md#root-digest) and derives its
// root digest. It is meant to run once per registration; the per-query path
// then only needs the returned Profile.
//
// On failure the error is a *ProfileError naming the first offending member
// in the order strategy, algorithm, index_projection, python_hash_seed, so
// the API can answer invalid_value for that field.
func Resolve(s Spec) (Profile, error) {
	var k kind
	switch s.Strategy {
	case StrategyVLLMV1:
		if s.Seed != nil {
			return Profile{}, noSeed(s.Strategy)
		}
		switch s.Algorithm {
		case AlgorithmSHA256CBOR:
			k = kindVLLMCBOR
		case AlgorithmSHA256:
			k = kindVLLMPickle
		default:
			return Profile{}, &ProfileError{Member: "algorithm",
				Msg: "unsupported algorithm " + quote(s.Algorithm) + " for strategy vllm_v1 (want sha256 or sha256_cbor)"}
		}
		if s.IndexProjection != ProjectionLow64BE {
			return Profile{}, &ProfileError{Member: "index_projection",
				Msg: "unsupported index_projection " + quote(s.IndexProjection) + " for strategy vllm_v1 (want low64_be)"}
		}
		if s.PythonHashSeed == nil {
			return Profile{}, &ProfileError{Member: "python_hash_seed",
				Msg: `required for strategy vllm_v1 ("random" or decimal 0..4294967295)`}
		}
		seed := *s.PythonHashSeed
		if !validSeed(seed) {
			return Profile{}, &ProfileError{Member: "python_hash_seed",
				Msg: "invalid seed " + quote(seed) + `: want "random" or decimal digits with value 0..4294967295`}
		}
		p := Profile{
			Strategy:        s.Strategy,
			Algorithm:       s.Algorithm,
			IndexProjection: s.IndexProjection,
			PythonHashSeed:  seed,
			kind:            k,
		}
		p.RootDigest = sha256.Sum256(rootInput(k, seed))
		return p, nil

	case StrategySGLang, StrategySGLangBigram:
		if s.Seed != nil {
			return Profile{}, noSeed(s.Strategy)
		}
		k = kindSGLang
		if s.Strategy == StrategySGLangBigram {
			k = kindSGLangBigram
		}
		if s.Algorithm != AlgorithmSHA256Raw {
			return Profile{}, &ProfileError{Member: "algorithm",
				Msg: "unsupported algorithm " + quote(s.Algorithm) + " for strategy " + s.Strategy + " (want sha256_raw)"}
		}
		if s.IndexProjection != ProjectionFirst64BE {
			return Profile{}, &ProfileError{Member: "index_projection",
				Msg: "unsupported index_projection " + quote(s.IndexProjection) + " for strategy " + s.Strategy + " (want first64_be)"}
		}
		// SGLang has no process-wide root: the seed is ignored and the reported
		// values are upstream's display sentinel
		// (docs/hashing.md#sglang-sentinel).
		return Profile{
			Strategy:        s.Strategy,
			Algorithm:       s.Algorithm,
			IndexProjection: s.IndexProjection,
			PythonHashSeed:  "0",
			kind:            k,
		}, nil

	case StrategyRFC1527:
		return resolveStandard(s)

	default:
		return Profile{}, &ProfileError{Member: "strategy",
			Msg: "unsupported strategy " + quote(s.Strategy) + " (want vllm_v1, sglang, sglang_bigram or rfc1527)"}
	}
}

// noSeed refuses rfc1527's seed member under a SHA-256 strategy.
func noSeed(strategy string) error {
	return &ProfileError{Member: "seed", Msg: "strategy " + strategy + " takes no seed (its seed member is python_hash_seed)"}
}

// validSeed reports whether seed is "random" or one or more ASCII digits whose
// decimal value fits in uint32. Leading zeros are allowed and kept: vLLM
// hashes the text, so "0" and "00" are different roots.
func validSeed(seed string) bool {
	if seed == SeedRandom {
		return true
	}
	if seed == "" {
		return false
	}
	var v uint64
	for i := 0; i < len(seed); i++ {
		c := seed[i]
		if c < '0' || c > '9' {
			return false
		}
		v = v*10 + uint64(c-'0')
		if v > 0xffffffff {
			return false
		}
	}
	return true
}

// rootInput is the serialized seed text whose SHA-256 is vLLM's NONE_HASH.
func rootInput(k kind, seed string) []byte {
	switch k {
	case kindVLLMCBOR:
		return appendCBORText(nil, seed)
	case kindVLLMPickle:
		var pk pickler
		pk.begin(nil)
		pk.boundary()
		pk.str(seed)
		pk.op1(opMemoize)
		pk.op1(opStop)
		return pk.finish()
	}
	return nil
}

func quote(s string) string {
	if len(s) > maxSeedQuote {
		return strconv.Quote(s[:maxSeedQuote]) + "…"
	}
	return strconv.Quote(s)
}

// Projection reports which 8 digest bytes become index keys for p, so event
// ingestion can map wire hashes with KeyFrom*. A zero Profile returns 0.
func (p *Profile) Projection() Projection {
	switch p.kind {
	case kindVLLMCBOR, kindVLLMPickle:
		return Low64BE
	case kindSGLang, kindSGLangBigram:
		return First64BE
	case kindRFC1527:
		return Native
	}
	return 0
}

// RootDigestHex is RootDigest as the 64 lowercase hex characters that read
// endpoints report (all zeros for SGLang, a sentinel that is never hashed).
func (p *Profile) RootDigestHex() string {
	return hex.EncodeToString(p.RootDigest[:])
}
