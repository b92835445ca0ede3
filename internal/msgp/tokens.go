package msgp

import (
	"encoding/binary"
	"math"
	"math/bits"
	"unsafe"
)

// DecodeTokenRun decodes token ids from b[p:] into dst from index i while
// they are in the common formats and at least five bytes of b remain, and
// returns the position and the index it stopped at; the caller takes the
// element there (a rare format, a value outside int32, a wrong type or one of
// the last few bytes) through the general path and calls again. Each element costs table lookups and one unaligned
// load rather than a branch per format, which mispredicts on real prompts.
// Two layouts skip even the per-element dependency on the type byte: an
// array of int32s (Go packers), and runs of uint16 (Python's packer, for
// ids from 256 to 65,535: nearly every id of a vocabulary under 65,536),
// taken four at a time and tried once per 16 ids so that a mixed
// vocabulary hardly pays for the test.
func DecodeTokenRun(b []byte, p int, dst []int32, i int) (int, int) {
	if p < len(b) && b[p] == 0xd2 {
		// Bounds fixed up front so the loop body carries no checks.
		m := min(len(dst)-i, (len(b)-p)/5)
		q, d := b[p:p+5*m], dst[i:i+m]
		j := 0
		for ; j < len(d) && 5*j+5 <= len(q); j++ {
			e := q[5*j : 5*j+5]
			if e[0] != 0xd2 {
				break
			}
			d[j] = int32(binary.BigEndian.Uint32(e[1:]))
		}
		i, p = i+j, p+5*j
	}
run:
	for i < len(dst) && p+5 <= len(b) {
		for i+4 <= len(dst) && p+12 <= len(b) && (b[p]^0xcd)|(b[p+3]^0xcd)|(b[p+6]^0xcd)|(b[p+9]^0xcd) == 0 {
			q := b[p : p+12]
			d := dst[i : i+4]
			d[0] = int32(binary.BigEndian.Uint16(q[1:]))
			d[1] = int32(binary.BigEndian.Uint16(q[4:]))
			d[2] = int32(binary.BigEndian.Uint16(q[7:]))
			d[3] = int32(binary.BigEndian.Uint16(q[10:]))
			p += 12
			i += 4
		}
		if end := min(len(dst), i+16); p+groupReach <= len(b) {
			var j int
			p, j = decodeGroup(b, p, dst[i:end], &tokenFormat)
			if i += j; i < end {
				break run
			}
			continue
		}
		// The last few elements of the body: the same formats, with the
		// word built from five checked bytes instead of one 8-byte load.
		for end := min(len(dst), i+16); i < end && p+5 <= len(b); i++ {
			t := b[p]
			v, ok := takeToken(uint64(t)<<56|uint64(binary.BigEndian.Uint32(b[p+1:p+5]))<<24, tokenFormat[t])
			if !ok {
				break run
			}
			dst[i] = v
			p += tokenSize(t)
		}
	}
	return p, i
}

// groupReach is how far past its start decodeGroup may read: 15 elements
// of at most 5 bytes, then the 8 bytes it loads for the 16th.
const groupReach = 15*5 + 8

// tokenFormat says, per first byte, how the fast token loops take an
// element from the big-endian word w whose top byte is that first byte and
// whose next bytes follow it in the body: the value is
// w>>(e&63) & (e>>32), which drops the first byte itself (a positive fixint
// keeps it). The formats are positive fixint, uint8, uint16 and uint32
// (Python's packer picks the smallest by value) and int32 (Go packers); bit
// 31 marks every other first byte, which the general path takes.
var tokenFormat = func() (t [256]uint64) {
	for c := range t {
		t[c] = 1 << 31
	}
	for c := 0; c <= 0x7f; c++ {
		t[c] = 56 | 0x7f<<32
	}
	t[0xcc] = 48 | 0xff<<32
	t[0xcd] = 40 | 0xffff<<32
	t[0xce] = 24 | 0xffffffff<<32
	t[0xd2] = 24 | 0xffffffff<<32
	return t
}()

// takeToken returns the token an element of format e (tokenFormat) packs in
// w, and false for a format the fast loops leave out or a value with bit 31
// set (a uint32 over the int32 range, or a negative int32), which the
// general path then accepts or rejects.
func takeToken(w, e uint64) (int32, bool) {
	v := w >> (e & 63) & (e >> 32)
	return int32(v), (v|e)&(1<<31) == 0
}

// tokenSize is the encoded size of an element that takeToken took, from
// its first byte rather than from the table: the next element's position
// then waits for one load (t), not two. For fixint 1, uint8 2, uint16 3,
// uint32 and int32 5 it is 1+(t>>7)<<(t&3).
func tokenSize(t byte) int { return 1 + int(t>>7)<<(t&3) }

// decodeGroup is DecodeTokenRun's general loop for up to 16 elements
// (len(d) <= 16) when b holds at least groupReach bytes from p, which its
// caller checks once: the loads then need no bounds checks. It returns the
// position and the number of ids decoded, stopping at the first element
// takeToken does not take.
//
// The loop was bound by its instruction count, so it is written for few
// instructions: one 8-byte load gives the payload of every format (the
// first byte is shifted and masked away), and one table word gives the
// shift, the mask and the not-taken mark, where a payload load after the
// first byte needed a second shift and an add for fixints and two tests.
// At 26 instructions per id (36 before) it takes about as long as the chain
// of element positions (load the type byte, compute the size, add). tab is
// tokenFormat, passed in so that its address stays in a register.
func decodeGroup(b []byte, p int, d []int32, tab *[256]uint64) (int, int) {
	_ = b[p+groupReach-1]   // the promise above; every read is below it
	d = d[:min(len(d), 16)] // and no read goes past 16 elements
	base := unsafe.Pointer(unsafe.SliceData(b))
	for j := range d {
		t := *(*byte)(unsafe.Add(base, p))
		v, ok := takeToken(bits.ReverseBytes64(*(*uint64)(unsafe.Add(base, p))), tab[t])
		if !ok {
			return p, j
		}
		d[j] = v
		p += tokenSize(t)
	}
	return p, len(d)
}

// ScanInt32Run consumes, from buf[p:], up to max consecutive integer values
// (stopping before the first value of another type or a cut one) and
// returns the position after them, how many it consumed and whether all
// were within int32. Event token-id arrays are the bulk of an engine payload
// and are only range-checked, never kept, so they are scanned in place
// rather than value by value.
//
// The first loop covers what token ids are on the wire (positive fixint,
// uint8, uint16, uint32) without a data-dependent branch: with a vocabulary
// above 65,536 ids the uint16/uint32 mix is random, and the branchy loop
// below mispredicts on about half the ids (BENCHMARKS.md, parts:
// BenchmarkTokenRun). A value's width is 1 + (c>>7)<<(c&3)
// for those type bytes c (1, 2, 3, 5), and a uint32 exceeds int32 exactly
// when its first byte has the top bit set, which c&(c<<6)&0x80 selects for
// c == 0xce alone among them. Runs of uint16 (smaller vocabularies) go four
// ids at a time. The loop runs while 5 bytes remain, so the
// widest value is never cut; the rest of the run, and every other integer
// format, takes the second loop.
func ScanInt32Run(buf []byte, p, max int) (next, n int, inRange bool) {
	var high byte
fast:
	for n < max && p+5 <= len(buf) {
		// Vocabularies under 65,536 ids encode nearly every id as uint16:
		// four at a time, with no per-id dependency on the type byte.
		// Tried once per 16 ids, so a mixed vocabulary rarely pays for it.
		for n+4 <= max && p+12 <= len(buf) && (buf[p]^0xcd)|(buf[p+3]^0xcd)|(buf[p+6]^0xcd)|(buf[p+9]^0xcd) == 0 {
			p += 12
			n += 4
		}
		for end := min(max, n+16); n < end && p+5 <= len(buf); n++ {
			c := buf[p]
			if c > 0x7f && c-0xcc > 2 {
				break fast // not fixint, uint8, uint16 or uint32
			}
			high |= buf[p+1] & c & (c << 6) & 0x80
			p += 1 + int(c>>7)<<(c&3)
		}
	}
	inRange = high == 0
	for n < max && p < len(buf) {
		// Fast paths for the encodings token ids actually use (fixint,
		// uint8, uint16 — all within int32 — and uint32).
		switch c := buf[p]; {
		case c <= 0x7f:
			p++
		case c == 0xcd && p+3 <= len(buf):
			p += 3
		case c == 0xcc && p+2 <= len(buf):
			p += 2
		case c == 0xce && p+5 <= len(buf):
			if binary.BigEndian.Uint32(buf[p+1:]) > math.MaxInt32 {
				inRange = false
			}
			p += 5
		default:
			v, neg, size := IntAt(buf, p)
			if size == 0 {
				return p, n, inRange
			}
			if !Int32Range(v, neg) {
				inRange = false
			}
			p += size
		}
		n++
	}
	return p, n, inRange
}
