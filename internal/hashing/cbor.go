package hashing

import (
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"math/bits"
)

// Canonical CBOR (RFC 8949 shortest heads, definite lengths) for exactly the
// values vLLM's sha256_cbor hashes: text strings, the 32-byte parent, int32
// tokens, tuples and None (docs/hashing.md#cbor-encoding). What
// cbor2.dumps(canonical=True) emits for these types is fixed, so a hand-written
// encoder is both simpler and far cheaper than a general library.

const (
	cborMajorUint  = 0 << 5
	cborMajorNeg   = 1 << 5
	cborMajorBytes = 2 << 5
	cborMajorText  = 3 << 5
	cborMajorArray = 4 << 5
	cborNull       = 0xf6
)

// appendCBORHead appends the shortest head for major type major (already
// shifted into the top 3 bits) and argument v.
func appendCBORHead(b []byte, major byte, v uint64) []byte {
	switch {
	case v < 24:
		return append(b, major|byte(v))
	case v <= 0xff:
		return append(b, major|24, byte(v))
	case v <= 0xffff:
		return append(b, major|25, byte(v>>8), byte(v))
	case v <= 0xffffffff:
		return append(b, major|26, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	default:
		return binary.BigEndian.AppendUint64(append(b, major|27), v)
	}
}

// appendCBORText appends s as a CBOR text string (length in UTF-8 bytes).
func appendCBORText(b []byte, s string) []byte {
	return append(appendCBORHead(b, cborMajorText, uint64(len(s))), s...)
}

// cborTokenMax is the most bytes one int32 token item takes.
const cborTokenMax = 5

// putCBORTokens writes the CBOR items of toks at b[w:] and returns the new
// write offset. b must have len ≥ w + 5·len(toks) + 3: every item is stored
// as one 8-byte little-endian word and the offset advanced by its real
// length, which keeps the loop free of branches on the item width (widths
// are random in real prompts, so such branches would mispredict).
func putCBORTokens(b []byte, w int, toks []int32) int {
	// Local copies let the compiler address the tables off the stack
	// pointer instead of materializing global addresses every iteration.
	ai, shift, size := cborAI, cborShift, cborLen
	out := b[w:]
	for _, t := range toks {
		u := uint32(t)
		var major uint64
		if t < 0 { // never in real prompts, so this branch predicts well
			u, major = ^u, cborMajorNeg // -1-t, major type 1
		}
		// Width class 0..3 (u < 24, < 2^8, < 2^16, else) without branches,
		// as real token widths are unpredictable: for u < 2^31,
		// u + (2^31 - k) has its top bit set exactly when u ≥ k.
		cls := ((u+(1<<31-24))>>31 + (u+(1<<31-256))>>31 + (u+(1<<31-65536))>>31) & 3
		// ReverseBytes64 puts u's big-endian bytes at the top of the word;
		// shifting them down to bytes 1..n leaves byte 0 zero for the head
		// (n = argument width). For u < 24 the shift brings u itself to
		// byte 0, which is then the whole item.
		word := major | ai[cls] | bits.ReverseBytes64(uint64(u))>>(shift[cls]&63)
		if len(out) < 8 {
			panic("hashing: CBOR token buffer too small")
		}
		binary.LittleEndian.PutUint64(out, word)
		out = out[size[cls]&7:]
	}
	return len(b) - len(out)
}

var (
	cborAI    = [4]uint64{0, 24, 25, 26}
	cborShift = [4]uint8{56, 48, 40, 24}
	cborLen   = [4]uint8{1, 2, 3, 5}
)

func b2u(b bool) uint32 {
	var u uint32
	if b {
		u = 1
	}
	return u
}

// appendCBORExtras appends the third element of a vLLM block value: None
// (f6) when both names are absent, else the array of the non-empty ones,
// LoRA first. An empty lora or salt is absent.
func appendCBORExtras(b []byte, lora, salt string) []byte {
	switch {
	case lora == "" && salt == "":
		return append(b, cborNull)
	case lora != "" && salt != "":
		return appendCBORText(appendCBORText(append(b, cborMajorArray|2), lora), salt)
	case lora != "":
		return appendCBORText(append(b, cborMajorArray|1), lora)
	default:
		return appendCBORText(append(b, cborMajorArray|1), salt)
	}
}

// encodeCBORBlock builds a vLLM block value
//
//	83 58 20 <parent> head(4, len(toks)) <tokens> <extras>
//
// (83 50 <parent> for a 16-byte XXH3-128 parent) into buf[:0] and returns
// it; extras is the block's appendCBORExtras output, which a Chain
// computes once per query.
//
// When h is non-nil (and freshly Reset) the bytes are also fed to it, and
// the first 64-byte SHA-256 block is handed over as soon as it is encoded:
// SHA-NI compression is latency-bound, so the CPU can partly overlap it with
// encoding the remaining tokens.
func encodeCBORBlock(buf []byte, h hash.Hash, parent []byte, toks []int32, extras []byte) []byte {
	need := 3 + len(parent) + 9 + cborTokenMax*len(toks) + 8 + len(extras)
	if cap(buf) < need {
		buf = make([]byte, 0, need+need/4)
	}
	var b []byte
	if len(parent) == 32 {
		b = buf[:3+32]
		b[0], b[1], b[2] = cborMajorArray|3, cborMajorBytes|24, 32
		*(*[32]byte)(b[3:]) = [32]byte(parent)
	} else {
		b = appendCBORHead(append(buf[:0], cborMajorArray|3), cborMajorBytes, uint64(len(parent)))
		b = append(b, parent...)
	}
	if len(toks) < 24 {
		b = append(b, cborMajorArray|byte(len(toks)))
	} else {
		b = appendCBORHead(b, cborMajorArray, uint64(len(toks)))
	}
	// 8 items take 64 bytes past the 36-byte prefix unless most are < 256.
	i := min(8, len(toks))
	b = b[:putCBORTokens(b[:cap(b)], len(b), toks[:i])]
	fed := 0
	if h != nil && len(b) >= sha256.BlockSize {
		h.Write(b[:sha256.BlockSize])
		fed = sha256.BlockSize
	}
	b = b[:putCBORTokens(b[:cap(b)], len(b), toks[i:])]
	b = append(b, extras...)
	if h != nil {
		h.Write(b[fed:])
	}
	return b
}
