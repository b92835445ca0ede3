package hashing

// An eager, deliberately naive reference implementation of docs/hashing.md,
// used to cross-check the lazy Chain in tests and fuzzing. It models Python
// objects (with identity, for pickle's memo) and serializes them with recursive
// encoders and the spec's F/O framing description, sharing no code with the
// production encoders.

import (
	"crypto/sha256"
	"encoding/binary"
	"unicode/utf8"

	"github.com/zeebo/xxh3"
)

type pyObj interface{}

type (
	pyStr   struct{ s string }
	pyBytes struct{ b []byte }
	pyInt   int64
	pyNone  struct{}
	pyTuple struct{ items []pyObj }
)

// latin1Cache mimics CPython's cache of one-character strings below U+0100:
// building such a string from bytes returns the shared object.
var latin1Cache = map[rune]*pyStr{}

func newPyStr(s string) *pyStr {
	if r, size := utf8.DecodeRuneInString(s); size == len(s) && len(s) > 0 && r != utf8.RuneError && r < 0x100 {
		if o, ok := latin1Cache[r]; ok {
			return o
		}
		o := &pyStr{s}
		latin1Cache[r] = o
		return o
	}
	return &pyStr{s}
}

// ---- CBOR ----

func refCBORHead(major int, v uint64) []byte {
	m := byte(major << 5)
	if v < 24 {
		return []byte{m + byte(v)}
	}
	if v < 1<<8 {
		return []byte{m + 24, byte(v)}
	}
	if v < 1<<16 {
		out := []byte{m + 25, 0, 0}
		binary.BigEndian.PutUint16(out[1:], uint16(v))
		return out
	}
	if v < 1<<32 {
		out := []byte{m + 26, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(out[1:], uint32(v))
		return out
	}
	out := []byte{m + 27, 0, 0, 0, 0, 0, 0, 0, 0}
	binary.BigEndian.PutUint64(out[1:], v)
	return out
}

func refCBOR(v pyObj) []byte {
	switch x := v.(type) {
	case *pyStr:
		return append(refCBORHead(3, uint64(len(x.s))), []byte(x.s)...)
	case *pyBytes:
		return append(refCBORHead(2, uint64(len(x.b))), x.b...)
	case pyInt:
		if x >= 0 {
			return refCBORHead(0, uint64(x))
		}
		return refCBORHead(1, uint64(-1-int64(x)))
	case pyNone:
		return []byte{0xf6}
	case *pyTuple:
		out := refCBORHead(4, uint64(len(x.items)))
		for _, it := range x.items {
			out = append(out, refCBOR(it)...)
		}
		return out
	}
	panic("refCBOR: unsupported value")
}

// ---- pickle ----

type refPickler struct {
	out   []byte        // O
	frame []byte        // F
	memo  map[pyObj]int // identity -> memo index
}

func refPickle(v pyObj) []byte {
	p := &refPickler{out: []byte{0x80, 0x05}, memo: map[pyObj]int{}}
	p.save(v)
	p.frame = append(p.frame, 0x2e)
	p.commit()
	return p.out
}

func (p *refPickler) commit() {
	if len(p.frame) == 0 {
		return
	}
	if len(p.frame) >= 4 {
		p.out = append(p.out, 0x95)
		p.out = binary.LittleEndian.AppendUint64(p.out, uint64(len(p.frame)))
	}
	p.out = append(p.out, p.frame...)
	p.frame = nil
}

func (p *refPickler) memoize(v pyObj) {
	p.memo[v] = len(p.memo)
	p.frame = append(p.frame, 0x94)
}

// payload writes a str/bytes opcode: into F normally, straight to O (after
// committing F) when the data is 64 KiB or more.
func (p *refPickler) payload(small, mid, big byte, data []byte) {
	var op []byte
	n := len(data)
	switch {
	case n < 256:
		op = []byte{small, byte(n)}
	case uint64(n) < 1<<32:
		op = binary.LittleEndian.AppendUint32([]byte{mid}, uint32(n))
	default:
		op = binary.LittleEndian.AppendUint64([]byte{big}, uint64(n))
	}
	if n >= 65536 {
		p.commit()
		p.out = append(append(p.out, op...), data...)
		return
	}
	p.frame = append(append(p.frame, op...), data...)
}

func (p *refPickler) save(v pyObj) {
	if len(p.frame) >= 65536 {
		p.commit()
	}
	if idx, ok := p.memo[v]; ok {
		if idx < 256 {
			p.frame = append(p.frame, 0x68, byte(idx))
		} else {
			p.frame = binary.LittleEndian.AppendUint32(append(p.frame, 0x6a), uint32(idx))
		}
		return
	}
	switch x := v.(type) {
	case *pyStr:
		p.payload(0x8c, 0x58, 0x8d, []byte(x.s))
		p.memoize(v)
	case *pyBytes:
		p.payload(0x43, 0x42, 0x8e, x.b)
		p.memoize(v)
	case pyInt:
		switch {
		case x >= 0 && x < 256:
			p.frame = append(p.frame, 0x4b, byte(x))
		case x >= 256 && x < 65536:
			p.frame = binary.LittleEndian.AppendUint16(append(p.frame, 0x4d), uint16(x))
		default:
			p.frame = binary.LittleEndian.AppendUint32(append(p.frame, 0x4a), uint32(int32(x)))
		}
	case pyNone:
		p.frame = append(p.frame, 0x4e)
	case *pyTuple:
		n := len(x.items)
		if n == 0 {
			p.frame = append(p.frame, 0x29)
			return
		}
		if n > 3 {
			p.frame = append(p.frame, 0x28)
		}
		for _, it := range x.items {
			p.save(it)
		}
		if n > 3 {
			p.frame = append(p.frame, 0x74)
		} else {
			p.frame = append(p.frame, []byte{0x85, 0x86, 0x87}[n-1])
		}
		p.memoize(v)
	default:
		panic("refPickle: unsupported value")
	}
}

// ---- chains ----

type refBlock struct {
	input   []byte
	digest  [32]byte
	key     uint64
	covered int
}

// refRoot is vLLM's NONE_HASH for algorithm alg, right-aligned in 32
// bytes as the chain keeps it.
func refRoot(alg, seed string) [32]byte {
	return refDigest(alg, refEncode(alg, newPyStr(seed)))
}

func refEncode(alg string, v pyObj) []byte {
	if alg == "sha256_cbor" || alg == "xxhash_cbor" {
		return refCBOR(v)
	}
	return refPickle(v)
}

// refDigestLen is the size of alg's digests.
func refDigestLen(alg string) int {
	if alg == "xxhash" || alg == "xxhash_cbor" {
		return 16
	}
	return 32
}

// refDigest hashes in with alg's function: SHA-256, or XXH3-128 written
// big-endian (python's xxh3_128_digest) into the last 16 bytes.
func refDigest(alg string, in []byte) [32]byte {
	if refDigestLen(alg) == 32 {
		return sha256.Sum256(in)
	}
	var d [32]byte
	u := xxh3.Hash128(in)
	for i := range 8 {
		d[16+i] = byte(u.Hi >> (56 - 8*i))
		d[24+i] = byte(u.Lo >> (56 - 8*i))
	}
	return d
}

// refVLLM computes every block of a vLLM query eagerly.
func refVLLM(alg string, root [32]byte, bs int, toks []int32, lora, salt string) []refBlock {
	var loraObj, saltObj pyObj
	if lora != "" {
		loraObj = newPyStr(lora)
	}
	if salt != "" {
		saltObj = newPyStr(salt)
	}
	var out []refBlock
	parent := root
	for i := 0; (i+1)*bs <= len(toks); i++ {
		tt := &pyTuple{}
		for _, t := range toks[i*bs : (i+1)*bs] {
			tt.items = append(tt.items, pyInt(t))
		}
		var extras []pyObj
		if loraObj != nil {
			extras = append(extras, loraObj)
		}
		if saltObj != nil && i == 0 {
			extras = append(extras, saltObj)
		}
		var extra pyObj = pyNone{}
		if len(extras) > 0 {
			extra = &pyTuple{items: extras}
		}
		n := refDigestLen(alg)
		pb := make([]byte, n)
		copy(pb, parent[32-n:])
		in := refEncode(alg, &pyTuple{items: []pyObj{&pyBytes{pb}, tt, extra}})
		d := refDigest(alg, in)
		out = append(out, refBlock{in, d, binary.BigEndian.Uint64(d[24:]), bs})
		parent = d
	}
	return out
}

// refSGLang computes every page of an sglang / sglang_bigram query eagerly.
func refSGLang(bigram bool, bs int, toks []int32, salt string) []refBlock {
	for _, t := range toks {
		if t < 0 {
			return nil
		}
	}
	// Word lists per position.
	var positions [][]uint32
	if bigram {
		for p := 0; p+1 < len(toks); p++ {
			positions = append(positions, []uint32{uint32(toks[p]), uint32(toks[p+1])})
		}
	} else {
		for _, t := range toks {
			positions = append(positions, []uint32{uint32(t)})
		}
	}
	var prior []byte
	if salt != "" {
		s := sha256.Sum256(append([]byte("sglang-cache-salt-v1\x00"), salt...))
		prior = s[:]
	}
	var out []refBlock
	for start := 0; start < len(positions); start += bs {
		end := min(start+bs, len(positions))
		in := append([]byte{}, prior...)
		for _, ws := range positions[start:end] {
			for _, w := range ws {
				in = binary.LittleEndian.AppendUint32(in, w)
			}
		}
		d := sha256.Sum256(in)
		out = append(out, refBlock{in, d, binary.BigEndian.Uint64(d[:8]), end - start})
		prior = d[:]
	}
	return out
}

// refChain dispatches on the profile's public selector strings.
func refChain(p Profile, bs int, toks []int32, lora, salt string) []refBlock {
	if bs <= 0 {
		return nil
	}
	switch p.Strategy {
	case "vllm_v1":
		return refVLLM(p.Algorithm, refRoot(p.Algorithm, p.PythonHashSeed), bs, toks, lora, salt)
	case "sglang":
		return refSGLang(false, bs, toks, salt)
	case "sglang_bigram":
		return refSGLang(true, bs, toks, salt)
	}
	return nil
}
