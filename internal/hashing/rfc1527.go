package hashing

import (
	"encoding/binary"
	"slices"
	"strconv"

	"github.com/zeebo/xxh3"
)

// The standard hash of RFC #1527 (docs/hashing.md#standard-hash-rfc1527):
// XXH3-64 with a seed, rolling over blocks, the hash NVIDIA Dynamo's router
// computes. A block's local hash covers its token ids as little-endian u32
// and then, for a block with multimodal objects, their 64-bit hashes sorted
// ascending as little-endian u64; block i's key is
// H_i = XXH3(le64(H_{i−1}) ‖ le64(L_i)), H_0 = L_0. The key is H itself:
// there is no digest to project.
//
// XXH3 comes from github.com/zeebo/xxh3, already the module's dependency
// (fingerprints), a pure-Go implementation with SIMD kernels for long
// inputs that is tested against the C reference; a hand-written XXH3 would
// be a second implementation of a hash whose every bit must agree with
// Dynamo's, with nothing gained.
const (
	StrategyRFC1527    = "rfc1527"
	AlgorithmXXH3_64   = "xxh3_64"
	DefaultRFC1527Seed = "1337"
)

// StdLocal is L: the seeded XXH3-64 of a block's token ids (little-endian
// u32 each) followed by mm, the block's multimodal hashes, which must be
// sorted ascending (SortedMM). buf is scratch, returned for reuse.
func StdLocal(seed uint64, tokens []int32, mm []uint64, buf []byte) (uint64, []byte) {
	need := 4*len(tokens) + 8*len(mm)
	if cap(buf) < need {
		buf = make([]byte, need, need+need/4)
	}
	b := buf[:need]
	w := 0
	for _, t := range tokens {
		binary.LittleEndian.PutUint32(b[w:], uint32(t))
		w += 4
	}
	for _, m := range mm {
		binary.LittleEndian.PutUint64(b[w:], m)
		w += 8
	}
	return xxh3.HashSeed(b, seed), buf
}

// StdNext is H_i from H_{i−1} and L_i.
func StdNext(seed, parent, local uint64) uint64 {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], parent)
	binary.LittleEndian.PutUint64(b[8:], local)
	return xxh3.HashSeed(b[:], seed)
}

// StdSeed is the seed of an rfc1527 profile (0 for any other).
func (p *Profile) StdSeed() uint64 { return p.seed }

// IsStandard reports whether p is the standard hash (rfc1527).
func (p *Profile) IsStandard() bool { return p.kind == kindRFC1527 }

// ParseDecimalU64 reads one or more ASCII digits whose value fits in u64
// (no sign, no spaces): the standard profile's seed text, and a master
// object key in decimal.
func ParseDecimalU64(s string) (uint64, bool) {
	if s == "" || len(s) > 20 {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	v, err := strconv.ParseUint(s, 10, 64)
	return v, err == nil
}

// resolveStandard is Resolve for strategy rfc1527: algorithm xxh3_64, an
// optional decimal u64 seed (default 1337), and none of the members the
// SHA-256 strategies take.
func resolveStandard(s Spec) (Profile, error) {
	if s.Algorithm != AlgorithmXXH3_64 {
		return Profile{}, &ProfileError{Member: "algorithm",
			Msg: "unsupported algorithm " + quote(s.Algorithm) + " for strategy rfc1527 (want xxh3_64)"}
	}
	if s.IndexProjection != "" {
		return Profile{}, &ProfileError{Member: "index_projection",
			Msg: "strategy rfc1527 takes no index_projection (its keys are the hashes themselves)"}
	}
	if s.PythonHashSeed != nil {
		return Profile{}, &ProfileError{Member: "python_hash_seed",
			Msg: "strategy rfc1527 takes no python_hash_seed (its seed member is seed)"}
	}
	text := DefaultRFC1527Seed
	if s.Seed != nil {
		text = *s.Seed
	}
	v, ok := ParseDecimalU64(text)
	if !ok {
		return Profile{}, &ProfileError{Member: "seed",
			Msg: "invalid seed " + quote(text) + ": want decimal digits with value 0..18446744073709551615"}
	}
	return Profile{Strategy: StrategyRFC1527, Algorithm: AlgorithmXXH3_64, Seed: text, seed: v, kind: kindRFC1527}, nil
}

// SortedMM returns the multimodal hashes sorted ascending, as they enter a
// block's local hash, sorting mm in place.
func SortedMM(mm []uint64) []uint64 {
	slices.Sort(mm)
	return mm
}
