package hashing

import (
	"encoding/binary"
	"math/bits"
)

// Canonical CBOR (RFC 8949 shortest heads, definite lengths) for exactly the
// values vLLM's sha256_cbor hashes: text strings, the 32-byte parent, int32
// tokens, tuples and None (hashing.md §3.3). What cbor2.dumps(canonical=True)
// emits for these types is fixed, so a hand-written encoder is both simpler
// and far cheaper than a general library.

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
// length, which keeps the loop free of data-dependent branches (token sizes
// are random in real prompts, so branches would mispredict).
func putCBORTokens(b []byte, w int, toks []int32) int {
	// Local copies let the compiler address the tables off the stack
	// pointer instead of materializing global addresses every iteration.
	ai, shift, size := cborAI, cborShift, cborLen
	out := b[w:]
	for _, t := range toks {
		neg := uint32(t >> 31) // all ones for negatives
		u := uint32(t) ^ neg   // -1-t for negatives (major type 1), < 2^31
		// Width class 0..3 (u < 24, < 2^8, < 2^16, else) without branches:
		// u + (2^31 - k) has its top bit set exactly when u ≥ k.
		cls := ((u+(1<<31-24))>>31 + (u+(1<<31-256))>>31 + (u+(1<<31-65536))>>31) & 3
		// ReverseBytes64 puts u's big-endian bytes at the top of the word;
		// shifting them down to bytes 1..n leaves byte 0 zero for the head
		// (n = argument width). For u < 24 the shift brings u itself to
		// byte 0, which is then the whole item.
		word := uint64(neg&cborMajorNeg) | ai[cls] | bits.ReverseBytes64(uint64(u))>>(shift[cls]&63)
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

// encodeCBORBlock builds a vLLM block value
//
//	83 58 20 <parent> head(4, len(toks)) <tokens> (f6 | 81 <s> | 82 <lora> <salt>)
//
// into buf[:0] and returns it. An empty lora or salt is absent.
func encodeCBORBlock(buf []byte, parent *[32]byte, toks []int32, lora, salt string) []byte {
	need := 3 + 32 + 9 + cborTokenMax*len(toks) + 8 + 2 + 18 + len(lora) + len(salt)
	if cap(buf) < need {
		buf = make([]byte, 0, need+need/4)
	}
	b := buf[:3+32]
	b[0], b[1], b[2] = cborMajorArray|3, cborMajorBytes|24, 32
	*(*[32]byte)(b[3:]) = *parent
	if len(toks) < 24 {
		b = append(b, cborMajorArray|byte(len(toks)))
	} else {
		b = appendCBORHead(b, cborMajorArray, uint64(len(toks)))
	}
	w := putCBORTokens(b[:cap(b)], len(b), toks)
	b = b[:w]
	switch {
	case lora == "" && salt == "":
		b = append(b, cborNull)
	case lora != "" && salt != "":
		b = append(b, cborMajorArray|2)
		b = appendCBORText(b, lora)
		b = appendCBORText(b, salt)
	default:
		one := lora
		if one == "" {
			one = salt
		}
		b = append(b, cborMajorArray|1)
		b = appendCBORText(b, one)
	}
	return b
}
