package hashing

import "encoding/binary"

// CPython pickle protocol 5, as pickle.dumps(v, protocol=5) lays out the values
// vLLM's "sha256" algorithm hashes (docs/hashing.md#pickle-encoding): one str,
// or a block tuple (parent bytes, token tuple, None | (str,) | (str, str)).
//
// Two encoders produce the same bytes. encodePickleBlockFast covers every
// realistic block (everything fits one ≤ 64 KiB frame) in one straight pass;
// pickler is the general framer that follows CPython's frame, boundary and
// large-payload rules and is used for seeds and oversized blocks.

const (
	opProto         = 0x80
	opFrame         = 0x95
	opShortBinBytes = 0x43
	opBinBytes      = 0x42
	opBinBytes8     = 0x8e
	opShortBinUni   = 0x8c
	opBinUnicode    = 0x58
	opBinUnicode8   = 0x8d
	opBinInt1       = 0x4b
	opBinInt2       = 0x4d
	opBinInt        = 0x4a
	opNone          = 0x4e
	opEmptyTuple    = 0x29
	opTuple1        = 0x85 // TUPLE2 = 0x86, TUPLE3 = 0x87
	opMark          = 0x28
	opTuple         = 0x74
	opMemoize       = 0x94
	opBinGet        = 0x68
	opLongBinGet    = 0x6a
	opStop          = 0x2e

	// frameTarget is CPython's _FRAME_SIZE_TARGET: a frame is committed at
	// an object boundary once it holds this many bytes, and a str/bytes
	// payload this long bypasses framing entirely.
	frameTarget = 64 * 1024
	// frameMin is CPython's FRAME_SIZE_MIN: shorter frames get no header.
	frameMin = 4
	// frameHeader is FRAME plus its u64le length.
	frameHeader = 9
	// loraMemoIndex is the memo slot of the LoRA name on block 0: 0 is the
	// parent bytes, 1 the token tuple.
	loraMemoIndex = 2
)

// pickleTokenMax is the most bytes one int32 token takes (BININT).
const pickleTokenMax = 5

var (
	pickleIntOp  = [3]uint64{opBinInt1, opBinInt2, opBinInt}
	pickleIntLen = [3]uint8{2, 3, 5}
)

// putPickleTokens writes the pickle ints of toks at b[w:] and returns the new
// offset. BININT1 / BININT2 are only for non-negative values; every negative
// id is a 4-byte BININT (uint32 of a negative is > 65535, which selects it).
// b needs len ≥ w + 5·len(toks) + 3, as each int is stored as one 8-byte word.
func putPickleTokens(b []byte, w int, toks []int32) int {
	for _, t := range toks {
		u := uint32(t)
		cls := b2u(u > 0xff) + b2u(u > 0xffff)
		binary.LittleEndian.PutUint64(b[w:], pickleIntOp[cls]|uint64(u)<<8)
		w += int(pickleIntLen[cls])
	}
	return w
}

// appendPickleStrOp appends the opcode and length field for a str of n
// UTF-8 bytes (the data itself follows).
func appendPickleStrOp(b []byte, n int) []byte {
	switch {
	case n <= 0xff:
		return append(b, opShortBinUni, byte(n))
	case uint64(n) <= 0xffffffff:
		return binary.LittleEndian.AppendUint32(append(b, opBinUnicode), uint32(n))
	default:
		return binary.LittleEndian.AppendUint64(append(b, opBinUnicode8), uint64(n))
	}
}

// memoAlias reports whether CPython pickles the salt of block 0 as a memo
// reference to the LoRA name: both are the same object only when they are
// equal and a single code point below U+0100, which CPython serves from its
// per-process latin-1 character cache (docs/hashing.md#pickle-memo).
func memoAlias(lora, salt string) bool {
	if lora != salt {
		return false
	}
	switch len(lora) {
	case 1:
		return lora[0] < 0x80
	case 2:
		// U+0080..U+00FF encode as C2 80..C3 BF.
		return (lora[0] == 0xc2 || lora[0] == 0xc3) && lora[1]&0xc0 == 0x80
	}
	return false
}

// appendPickleTail appends everything a single-frame block pickle holds after
// the token tuple: the extra keys (None, (lora,), (salt,) or (lora, salt), with
// the memo alias of docs/hashing.md#pickle-memo), then the outer TUPLE3, its
// MEMOIZE and STOP. An empty lora or salt is absent. It is the same for every
// block of a query but block 0, so a Chain builds it once per query; it is only
// valid for strings under 64 KiB (no large payloads).
func appendPickleTail(b []byte, lora, salt string) []byte {
	switch {
	case lora == "" && salt == "":
		b = append(b, opNone)
	case lora != "" && salt != "":
		b = appendPickleStrOp(b, len(lora))
		b = append(append(b, lora...), opMemoize)
		if memoAlias(lora, salt) {
			b = append(b, opBinGet, loraMemoIndex)
		} else {
			b = appendPickleStrOp(b, len(salt))
			b = append(append(b, salt...), opMemoize)
		}
		b = append(b, opTuple1+1, opMemoize)
	default:
		one := lora
		if one == "" {
			one = salt
		}
		b = appendPickleStrOp(b, len(one))
		b = append(append(b, one...), opMemoize, opTuple1, opMemoize)
	}
	return append(b, opTuple1+2, opMemoize, opStop)
}

// encodePickleBlockFast encodes a block value as one frame
// (80 05 95 u64le(L) <content>) when that is what CPython emits: no str of
// 64 KiB or more (the caller guarantees that by building tail with
// appendPickleTail) and content, STOP included, of at most 64 KiB, in which
// case no boundary check can fire. It reports false (and leaves garbage in
// the returned buffer) for a longer content; the caller then uses
// encodePickleBlockGeneral.
func encodePickleBlockFast(buf []byte, parent []byte, toks []int32, tail []byte) ([]byte, bool) {
	if len(toks) > frameTarget/2 || len(tail) > frameTarget || len(parent) > 0xff {
		return buf, false
	}
	need := 2 + frameHeader + 3 + len(parent) + 1 + pickleTokenMax*len(toks) + 8 + 2 + len(tail)
	if cap(buf) < need {
		buf = make([]byte, 0, need+need/4)
	}
	b := buf[:2+frameHeader+2+len(parent)]
	b[0], b[1], b[2] = opProto, 5, opFrame
	b[11], b[12] = opShortBinBytes, byte(len(parent))
	if len(parent) == 32 {
		*(*[32]byte)(b[13:]) = [32]byte(parent)
	} else {
		copy(b[13:], parent)
	}
	n := len(toks)
	switch {
	case n >= 4:
		b = append(b, opMemoize, opMark)
		b = b[:putPickleTokens(b[:cap(b)], len(b), toks)]
		b = append(b, opTuple, opMemoize)
	case n > 0:
		b = append(b, opMemoize)
		b = b[:putPickleTokens(b[:cap(b)], len(b), toks)]
		b = append(b, opTuple1-1+byte(n), opMemoize)
	default:
		b = append(b, opMemoize, opEmptyTuple)
	}
	b = append(b, tail...)
	l := len(b) - 2 - frameHeader
	if l > frameTarget {
		return b, false
	}
	binary.LittleEndian.PutUint64(b[3:], uint64(l))
	return b, true
}

// encodePickleBlockGeneral encodes a block value with the general framer.
// The order of boundary checks mirrors CPython's save(): one at the start of
// every object, ints and None included (docs/hashing.md#pickle-frames).
func encodePickleBlockGeneral(buf []byte, parent []byte, toks []int32, lora, salt string) []byte {
	var p pickler
	p.begin(buf)
	p.boundary() // outer 3-tuple
	p.boundary() // parent bytes
	p.bytes(parent)
	p.op1(opMemoize)
	p.boundary() // token tuple
	n := len(toks)
	if n == 0 {
		p.op1(opEmptyTuple)
	} else {
		if n >= 4 {
			p.op1(opMark)
		}
		for _, t := range toks {
			p.boundary()
			p.int(t)
		}
		if n >= 4 {
			p.op1(opTuple)
		} else {
			p.op1(opTuple1 - 1 + byte(n))
		}
		p.op1(opMemoize)
	}
	p.boundary() // extra keys
	switch {
	case lora == "" && salt == "":
		p.op1(opNone)
	case lora != "" && salt != "":
		p.boundary()
		p.str(lora)
		p.op1(opMemoize)
		p.boundary()
		if memoAlias(lora, salt) {
			p.op1(opBinGet)
			p.op1(loraMemoIndex)
		} else {
			p.str(salt)
			p.op1(opMemoize)
		}
		p.op1(opTuple1 + 1)
		p.op1(opMemoize)
	default:
		one := lora
		if one == "" {
			one = salt
		}
		p.boundary()
		p.str(one)
		p.op1(opMemoize)
		p.op1(opTuple1)
		p.op1(opMemoize)
	}
	p.op1(opTuple1 + 2)
	p.op1(opMemoize)
	p.op1(opStop)
	return p.finish()
}

// pickler is the general protocol-5 framer. Like CPython's C pickler it
// writes everything into one output buffer and reserves a 9-byte FRAME
// header when a frame opens, filling it (or squeezing it out, for frames
// under 4 bytes) when the frame is committed.
type pickler struct {
	b      []byte
	fstart int // offset of the open frame's header placeholder; -1 if none
}

func (p *pickler) begin(buf []byte) {
	p.b = append(buf[:0], opProto, 5)
	p.fstart = -1
}

// open starts a frame if none is open; every framed write goes through it.
func (p *pickler) open() {
	if p.fstart < 0 {
		p.fstart = len(p.b)
		p.b = append(p.b, 0, 0, 0, 0, 0, 0, 0, 0, 0)
	}
}

// commit closes the open frame, if any.
func (p *pickler) commit() {
	if p.fstart < 0 {
		return
	}
	n := len(p.b) - p.fstart - frameHeader
	if n >= frameMin {
		p.b[p.fstart] = opFrame
		binary.LittleEndian.PutUint64(p.b[p.fstart+1:], uint64(n))
	} else {
		copy(p.b[p.fstart:], p.b[p.fstart+frameHeader:])
		p.b = p.b[:len(p.b)-frameHeader]
	}
	p.fstart = -1
}

// boundary is the check CPython makes at the start of saving each object.
func (p *pickler) boundary() {
	if p.fstart >= 0 && len(p.b)-p.fstart-frameHeader >= frameTarget {
		p.commit()
	}
}

func (p *pickler) op1(c byte) {
	p.open()
	p.b = append(p.b, c)
}

func (p *pickler) int(t int32) {
	p.open()
	u := uint32(t)
	switch {
	case u <= 0xff:
		p.b = append(p.b, opBinInt1, byte(u))
	case u <= 0xffff:
		p.b = append(p.b, opBinInt2, byte(u), byte(u>>8))
	default:
		p.b = binary.LittleEndian.AppendUint32(append(p.b, opBinInt), u)
	}
}

// str writes a str; payloads of 64 KiB or more go outside any frame.
func (p *pickler) str(s string) {
	if len(s) >= frameTarget {
		p.commit()
		p.b = append(appendPickleStrOp(p.b, len(s)), s...)
		return
	}
	p.open()
	p.b = append(appendPickleStrOp(p.b, len(s)), s...)
}

// bytes writes a bytes object; payloads of 64 KiB or more go outside any
// frame. Only the parent digest (32 or 16 bytes) is ever written here.
func (p *pickler) bytes(d []byte) {
	var hdr []byte
	switch n := len(d); {
	case n <= 0xff:
		hdr = []byte{opShortBinBytes, byte(n)}
	case uint64(n) <= 0xffffffff:
		hdr = binary.LittleEndian.AppendUint32([]byte{opBinBytes}, uint32(n))
	default:
		hdr = binary.LittleEndian.AppendUint64([]byte{opBinBytes8}, uint64(n))
	}
	if len(d) >= frameTarget {
		p.commit()
	} else {
		p.open()
	}
	p.b = append(append(p.b, hdr...), d...)
}

// finish commits the last frame and returns the complete pickle.
func (p *pickler) finish() []byte {
	p.commit()
	return p.b
}
