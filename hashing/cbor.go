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
	for _, t := range toks {
		neg := uint32(t >> 31)   // all ones for negatives
		u := uint32(t) ^ neg     // -1-t for negatives (major type 1)
		major := uint64(neg & cborMajorNeg)
		cls := b2u(u >= 24) + b2u(u >= 256) + b2u(u >= 65536)
		// Big-endian argument bytes, right-aligned to the argument width.
		be := uint64(bits.ReverseBytes32(u)) >> cborShift[cls]
		word := major | cborAI[cls] | be<<8
		if cls == 0 {
			word = major | uint64(u)
		}
		binary.LittleEndian.PutUint64(b[w:], word)
		w += int(cborLen[cls])
	}
	return w
}

var (
	cborAI    = [4]uint64{0, 24, 25, 26}
	cborShift = [4]uint8{0, 24, 16, 0}
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
	b := buf[:3]
	b[0], b[1], b[2] = cborMajorArray|3, cborMajorBytes|24, 32
	b = append(b, parent[:]...)
	b = appendCBORHead(b, cborMajorArray, uint64(len(toks)))
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
