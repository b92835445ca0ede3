package hashing

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strconv"

	"github.com/zeebo/xxh3"
)

// kind is the parsed (strategy, algorithm) pair of a resolved Profile. It is
// a small integer so that Profile stays comparable and the per-block code can
// switch on it without string compares.
type kind uint8

const (
	kindNone          kind = iota // zero Profile: no blocks
	kindVLLMCBOR                  // vllm_v1 / sha256_cbor / low64_be
	kindVLLMPickle                // vllm_v1 / sha256 / low64_be
	kindSGLang                    // sglang / sha256_raw / first64_be
	kindSGLangBigram              // sglang_bigram / sha256_raw / first64_be
	kindRFC1527                   // rfc1527 / xxh3_64 (the standard hash)
	kindVLLMXXHCBOR               // vllm_v1 / xxhash_cbor / low64_be
	kindVLLMXXHPickle             // vllm_v1 / xxhash / low64_be
)

// vllm reports whether k is one of vLLM's four chains
// (docs/hashing.md#vllm-algorithms).
func (k kind) vllm() bool {
	return k == kindVLLMCBOR || k == kindVLLMPickle || k == kindVLLMXXHCBOR || k == kindVLLMXXHPickle
}

// cbor reports whether k's block values are canonical CBOR (else pickle).
func (k kind) cbor() bool { return k == kindVLLMCBOR || k == kindVLLMXXHCBOR }

// xxh reports whether k digests with XXH3-128 (16 bytes) instead of
// SHA-256 (32).
func (k kind) xxh() bool { return k == kindVLLMXXHCBOR || k == kindVLLMXXHPickle }

// xxhDigestLen is the size of an XXH3-128 digest.
const xxhDigestLen = 16

// digestLen is the size of k's digests: 16 for XXH3-128, 32 for SHA-256.
// A digest is kept in a [32]byte right-aligned, its unused leading bytes
// zero, so that low64_be is d[24:] whatever the size.
func (k kind) digestLen() int {
	if k.xxh() {
		return xxhDigestLen
	}
	return 32
}

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
	AlgorithmXXHash     = "xxhash"
	AlgorithmXXHashCBOR = "xxhash_cbor"

	ProjectionLow64BE   = "low64_be"
	ProjectionFirst64BE = "first64_be"

	// SeedRandom is the literal seed text vLLM hashes when PYTHONHASHSEED
	// is "random"; it is not a request for randomness.
	SeedRandom = "random"
	// SeedVLLMNoneHash is the text vLLM hashes into its root when
	// PYTHONHASHSEED is unset and the algorithm is sha256 or sha256_cbor
	// (vLLM PR #51875); registering it names such an engine.
	SeedVLLMNoneHash = "vllm-none-hash"
)

// seedHelp lists the accepted python_hash_seed texts, for error messages.
const seedHelp = `"random", decimal 0..4294967295 (the engines' PYTHONHASHSEED), or "vllm-none-hash" (engines started without PYTHONHASHSEED, sha256 and sha256_cbor only)`

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
		case AlgorithmXXHashCBOR:
			k = kindVLLMXXHCBOR
		case AlgorithmXXHash:
			k = kindVLLMXXHPickle
		default:
			return Profile{}, &ProfileError{Member: "algorithm",
				Msg: "unsupported algorithm " + quote(s.Algorithm) + " for strategy vllm_v1 (want sha256, sha256_cbor, xxhash or xxhash_cbor)"}
		}
		if s.IndexProjection != ProjectionLow64BE {
			return Profile{}, &ProfileError{Member: "index_projection",
				Msg: "unsupported index_projection " + quote(s.IndexProjection) + " for strategy vllm_v1 (want low64_be)"}
		}
		if s.PythonHashSeed == nil {
			return Profile{}, &ProfileError{Member: "python_hash_seed",
				Msg: "required for strategy vllm_v1: " + seedHelp}
		}
		seed := *s.PythonHashSeed
		if seed == SeedVLLMNoneHash && k.xxh() {
			// vLLM draws a random root per process for a
			// non-cryptographic hash when PYTHONHASHSEED is unset
			// (docs/hashing.md#engines-without-pythonhashseed): nothing can
			// reproduce it.
			return Profile{}, &ProfileError{Member: "python_hash_seed",
				Msg: `"vllm-none-hash" is not a root of algorithm ` + s.Algorithm + `: vLLM started without PYTHONHASHSEED draws a random root per process for xxhash and xxhash_cbor, which no registration can reproduce; set PYTHONHASHSEED (the same value) on the engines and register that text as python_hash_seed`}
		}
		if !validSeed(seed) {
			return Profile{}, &ProfileError{Member: "python_hash_seed",
				Msg: "invalid seed " + quote(seed) + `: want "random", decimal 0..4294967295 or "vllm-none-hash"`}
		}
		p := Profile{
			Strategy:        s.Strategy,
			Algorithm:       s.Algorithm,
			IndexProjection: s.IndexProjection,
			PythonHashSeed:  seed,
			kind:            k,
		}
		p.RootDigest = digest(k, rootInput(k, seed))
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

// validSeed reports whether seed is "random", "vllm-none-hash" or one or
// more ASCII digits whose decimal value fits in uint32. Leading zeros are
// allowed and kept: vLLM hashes the text, so "0" and "00" are different
// roots.
func validSeed(seed string) bool {
	if seed == SeedRandom || seed == SeedVLLMNoneHash {
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

// digest hashes b with k's function into a right-aligned [32]byte (see
// kind.digestLen).
func digest(k kind, b []byte) [32]byte {
	if !k.xxh() {
		return sha256.Sum256(b)
	}
	var d [32]byte
	putXXH(&d, xxh3.Hash128(b))
	return d
}

// putXXH stores an XXH3-128 value as python xxhash's xxh3_128_digest
// writes it (the 128-bit value big-endian) in d's last 16 bytes, zeroing
// the first 16.
func putXXH(d *[32]byte, u xxh3.Uint128) {
	*d = [32]byte{}
	binary.BigEndian.PutUint64(d[16:], u.Hi)
	binary.BigEndian.PutUint64(d[24:], u.Lo)
}

// rootInput is the serialized seed text whose digest is vLLM's NONE_HASH.
func rootInput(k kind, seed string) []byte {
	switch {
	case k.vllm() && k.cbor():
		return appendCBORText(nil, seed)
	case k.vllm():
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
	case kindVLLMCBOR, kindVLLMPickle, kindVLLMXXHCBOR, kindVLLMXXHPickle:
		return Low64BE
	case kindSGLang, kindSGLangBigram:
		return First64BE
	case kindRFC1527:
		return Native
	}
	return 0
}

// RootDigestHex is RootDigest as the lowercase hex that read endpoints
// report: 64 characters, or 32 for an XXH3-128 root (all zeros for SGLang,
// a sentinel that is never hashed).
func (p *Profile) RootDigestHex() string {
	return hex.EncodeToString(p.DigestBytes(&p.RootDigest))
}

// AlgorithmDigestLen is the size of a full block digest under a hash
// profile's algorithm: 16 for vLLM's xxhash and xxhash_cbor (XXH3-128), 32
// for the SHA-256 ones (and any other text).
func AlgorithmDigestLen(algorithm string) int {
	if algorithm == AlgorithmXXHash || algorithm == AlgorithmXXHashCBOR {
		return xxhDigestLen
	}
	return 32
}

// DigestLen is the size of p's block digests as engines publish them in
// full (vLLM's bin form): 16 for xxhash and xxhash_cbor, else 32.
func (p *Profile) DigestLen() int { return p.kind.digestLen() }

// DigestBytes is d as the engine publishes it: its last DigestLen bytes
// (digests are kept right-aligned in a [32]byte).
func (p *Profile) DigestBytes(d *[32]byte) []byte { return d[32-p.kind.digestLen():] }
