package eventfixtures

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
)

// The golden hash material is recomputed here from first principles rather
// than taken from the hashing package: the fixtures test that package's
// users, so they must not be derived from it.

// cborHead is a canonical CBOR head for major type major and argument n.
func cborHead(major byte, n uint64) []byte {
	switch {
	case n < 24:
		return []byte{major<<5 | byte(n)}
	case n < 1<<8:
		return []byte{major<<5 | 24, byte(n)}
	case n < 1<<16:
		return binary.BigEndian.AppendUint16([]byte{major<<5 | 25}, uint16(n))
	case n < 1<<32:
		return binary.BigEndian.AppendUint32([]byte{major<<5 | 26}, uint32(n))
	}
	return binary.BigEndian.AppendUint64([]byte{major<<5 | 27}, n)
}

// vllmCBORChain is vLLM's sha256_cbor chain for a prompt without LoRA,
// salt or other extra keys: the root hashes the seed text, each full block
// hashes (parent digest, token tuple, None).
func vllmCBORChain(seed string, tokens []int64, blockSize int) [][32]byte {
	parent := sha256.Sum256(append(cborHead(3, uint64(len(seed))), seed...))
	var out [][32]byte
	for start := 0; start+blockSize <= len(tokens); start += blockSize {
		enc := cborHead(4, 3)
		enc = append(enc, cborHead(2, 32)...)
		enc = append(enc, parent[:]...)
		enc = append(enc, cborHead(4, uint64(blockSize))...)
		for _, t := range tokens[start : start+blockSize] {
			if t >= 0 {
				enc = append(enc, cborHead(0, uint64(t))...)
			} else {
				enc = append(enc, cborHead(1, uint64(-1-t))...)
			}
		}
		enc = append(enc, 0xf6)
		parent = sha256.Sum256(enc)
		out = append(out, parent)
	}
	return out
}

// sglangChain is SGLang's page chain: each page hashes the previous digest
// (none for the first) followed by its tokens as little-endian uint32.
func sglangChain(tokens []int64, page int) [][32]byte {
	var out [][32]byte
	for start := 0; start < len(tokens); start += page {
		h := sha256.New()
		if len(out) > 0 {
			h.Write(out[len(out)-1][:])
		}
		for _, t := range tokens[start:min(start+page, len(tokens))] {
			h.Write(binary.LittleEndian.AppendUint32(nil, uint32(t)))
		}
		var d [32]byte
		h.Sum(d[:0])
		out = append(out, d)
	}
	return out
}

func low64(d [32]byte) uint64   { return binary.BigEndian.Uint64(d[24:]) }
func first64(d [32]byte) uint64 { return binary.BigEndian.Uint64(d[:8]) }

func hexOf(d [32]byte) string { return hex.EncodeToString(d[:]) }

var (
	vllmTokens = []int64{1, 2, 3, 4, 5, 6, 7, 8}
	vllmDig    = vllmCBORChain("0", vllmTokens, 4)
	v1, v2     = low64(vllmDig[0]), low64(vllmDig[1])

	sglTokens = []int64{11, 12, 13, 14, 21, 22, 23, 24, 31, 32, 33, 34, 41, 42, 43, 44}
	sglDig    = sglangChain(sglTokens, 4)
	// sU are the unsigned projections (index keys), sS the signed int64
	// SGLang puts on the wire: the same bits.
	sU, sS = projectSGLang(sglDig)
)

func projectSGLang(ds [][32]byte) (u []uint64, s []int64) {
	for _, d := range ds {
		u = append(u, first64(d))
		s = append(s, int64(first64(d)))
	}
	return u, s
}

// checkGolden panics if the recomputed chains drift from the values every
// fixture and document quotes.
func checkGolden() {
	if hexOf(vllmDig[0]) != "c9d58ba695280d69b243e1e0df813136ca9196b286fb1a021e0b2e028ef071cb" ||
		v1 != 2164874634404590027 || v2 != 17270480062156288726 {
		panic("eventfixtures: vLLM golden chain changed")
	}
	if hexOf(sglDig[0])[:16] != "f67c5ff154ee4961" || sS[0] != -685567553150498463 {
		panic("eventfixtures: SGLang golden chain changed")
	}
}
