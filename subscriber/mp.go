package subscriber

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/vmihailenco/msgpack/v5"
)

// mkind classifies a MessagePack type byte. Decoders peek it before every
// value so a wrong type becomes an event-level rejection (the value is then
// skipped) rather than a decode error that would abort the whole envelope.
type mkind uint8

const (
	kInvalid mkind = iota
	kNil
	kBool
	kUint // positive fixint, uint8..uint64
	kInt  // negative fixint, int8..int64 (the value may still be positive)
	kFloat
	kStr
	kBin
	kArray
	kMap
	kExt
)

func kindOf(c byte) mkind {
	switch {
	case c <= 0x7f:
		return kUint
	case c <= 0x8f:
		return kMap
	case c <= 0x9f:
		return kArray
	case c <= 0xbf:
		return kStr
	case c >= 0xe0:
		return kInt
	}
	switch c {
	case 0xc0:
		return kNil
	case 0xc2, 0xc3:
		return kBool
	case 0xc4, 0xc5, 0xc6:
		return kBin
	case 0xc7, 0xc8, 0xc9, 0xd4, 0xd5, 0xd6, 0xd7, 0xd8:
		return kExt
	case 0xca, 0xcb:
		return kFloat
	case 0xcc, 0xcd, 0xce, 0xcf:
		return kUint
	case 0xd0, 0xd1, 0xd2, 0xd3:
		return kInt
	case 0xd9, 0xda, 0xdb:
		return kStr
	case 0xdc, 0xdd:
		return kArray
	case 0xde, 0xdf:
		return kMap
	}
	return kInvalid
}

func (k mkind) isInt() bool { return k == kUint || k == kInt }

// errTruncated is returned when a length prefix points past the payload.
var errTruncated = errors.New("msgpack: truncated value")

// mpReader walks one payload with msgpack.Decoder's low-level calls. Strings
// are returned as sub-slices of the payload (no copy): the decoder reads
// straight from the bytes.Reader, which has no read-ahead, so the reader's
// offset is always the decoder's.
type mpReader struct {
	buf []byte
	br  bytes.Reader
	dec *msgpack.Decoder
}

func newMPReader() *mpReader {
	r := &mpReader{}
	r.dec = msgpack.NewDecoder(&r.br)
	return r
}

func (r *mpReader) reset(b []byte) {
	r.buf = b
	r.br.Reset(b)
}

func (r *mpReader) remaining() int { return r.br.Len() }

func (r *mpReader) pos() int { return len(r.buf) - r.br.Len() }

// peek returns the kind of the next value without consuming it. It reads
// the type byte from the payload directly: the decoder's PeekCode costs two
// interface calls, and peek runs before every value.
func (r *mpReader) peek() (mkind, error) {
	p := r.pos()
	if p >= len(r.buf) {
		return kInvalid, io.ErrUnexpectedEOF
	}
	return kindOf(r.buf[p]), nil
}

// advance moves past n bytes the caller has already decoded in place.
func (r *mpReader) advance(n int) {
	_, _ = r.br.Seek(int64(n), io.SeekCurrent)
}

// intAt decodes the integer whose type byte is at buf[p] in place and
// returns its encoded size (0 when p does not start an integer or the value
// is truncated).
func intAt(buf []byte, p int) (u uint64, s int64, neg bool, size int) {
	c := buf[p]
	switch {
	case c <= 0x7f:
		return uint64(c), int64(c), false, 1
	case c >= 0xe0:
		return 0, int64(int8(c)), true, 1
	}
	var n int
	switch c {
	case 0xcc, 0xd0:
		n = 2
	case 0xcd, 0xd1:
		n = 3
	case 0xce, 0xd2:
		n = 5
	case 0xcf, 0xd3:
		n = 9
	default:
		return 0, 0, false, 0
	}
	if p+n > len(buf) {
		return 0, 0, false, 0
	}
	b := buf[p+1 : p+n]
	switch c {
	case 0xcc:
		u = uint64(b[0])
	case 0xcd:
		u = uint64(binary.BigEndian.Uint16(b))
	case 0xce:
		u = uint64(binary.BigEndian.Uint32(b))
	case 0xcf:
		u = binary.BigEndian.Uint64(b)
	case 0xd0:
		s = int64(int8(b[0]))
	case 0xd1:
		s = int64(int16(binary.BigEndian.Uint16(b)))
	case 0xd2:
		s = int64(int32(binary.BigEndian.Uint32(b)))
	case 0xd3:
		s = int64(binary.BigEndian.Uint64(b))
	}
	if c >= 0xd0 {
		if s < 0 {
			return 0, s, true, n
		}
		return uint64(s), s, false, n
	}
	return u, int64(u), false, n
}

// int32Run consumes up to max consecutive integer values (stopping before
// the first value of another type) and reports how many it consumed and
// whether all were within int32. Token-id arrays are the bulk of an engine
// payload and are only range-checked, so they are scanned in place rather
// than value by value through the decoder (which copies every integer
// through io.ReadFull; this keeps ingest well above 1M blocks/s).
//
// The first loop covers what token ids are on the wire (positive fixint,
// uint8, uint16, uint32) without a data-dependent branch: with a vocabulary
// above 65,536 ids the uint16/uint32 mix is random, and the branchy loop
// below mispredicted on about half the ids (7 ns per id, a tenth of ingest
// CPU; now 4 ns, BenchmarkTokenRun). A value's width is 1 + (c>>7)<<(c&3)
// for those type bytes c (1, 2, 3, 5), and a uint32 exceeds int32 exactly
// when its first byte has the top bit set, which c&(c<<6)&0x80 selects for
// c == 0xce alone among them. Runs of uint16 (smaller vocabularies) go four
// ids at a time (0.9 ns per id). The loop runs while 5 bytes remain, so the
// widest value is never cut; the rest of the run, and every other integer
// format, takes the second loop.
func (r *mpReader) int32Run(max int) (n int, inRange bool) {
	buf, p := r.buf, r.pos()
	start := p
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
			u, s, neg, size := intAt(buf, p)
			if size == 0 {
				r.advance(p - start)
				return n, inRange
			}
			if (neg && s < math.MinInt32) || (!neg && u > math.MaxInt32) {
				inRange = false
			}
			p += size
		}
		n++
	}
	r.advance(p - start)
	return n, inRange
}

func (r *mpReader) skip() error { return r.dec.Skip() }

func (r *mpReader) nil() error { return r.dec.DecodeNil() }

func (r *mpReader) arrayLen() (int, error) { return r.dec.DecodeArrayLen() }

func (r *mpReader) mapLen() (int, error) { return r.dec.DecodeMapLen() }

// integer reads a value of kind kUint or kInt. neg reports a negative value
// (then s holds it); otherwise u holds it. MessagePack producers may encode a
// positive value in a signed format, so callers decide by value, not format.
//
// The value is decoded in place (see int32Run for why).
func (r *mpReader) integer(k mkind) (u uint64, s int64, neg bool, err error) {
	p := r.pos()
	if p >= len(r.buf) {
		return 0, 0, false, io.ErrUnexpectedEOF
	}
	u, s, neg, size := intAt(r.buf, p)
	if size == 0 {
		if k.isInt() {
			return 0, 0, false, errTruncated
		}
		return 0, 0, false, fmt.Errorf("msgpack: type byte %#x is not an integer", r.buf[p])
	}
	r.advance(size)
	return u, s, neg, nil
}

// str reads a str or bin value as a sub-slice of the payload.
func (r *mpReader) str() ([]byte, error) {
	n, err := r.dec.DecodeBytesLen()
	if err != nil {
		return nil, err
	}
	if n < 0 {
		return nil, nil
	}
	if n > r.br.Len() {
		return nil, errTruncated
	}
	start := r.pos()
	if _, err := r.br.Seek(int64(n), io.SeekCurrent); err != nil {
		return nil, fmt.Errorf("msgpack: skip string: %w", err)
	}
	return r.buf[start : start+n : start+n], nil
}

// float reads a float32/float64 value.
func (r *mpReader) float() (float64, error) { return r.dec.DecodeFloat64() }

// optStr reads str|nil; ok=false means the value had another type and was
// skipped. present=false means nil.
func (r *mpReader) optStr() (b []byte, present, ok bool, err error) {
	k, err := r.peek()
	if err != nil {
		return nil, false, false, err
	}
	switch k {
	case kNil:
		return nil, false, true, r.nil()
	case kStr:
		b, err = r.str()
		return b, true, true, err
	}
	return nil, false, false, r.skip()
}

// optInt reads int|nil as a signed value; ok=false means another type (or a
// value beyond int64), skipped or consumed.
func (r *mpReader) optInt() (v int64, present, ok bool, err error) {
	k, err := r.peek()
	if err != nil {
		return 0, false, false, err
	}
	switch k {
	case kNil:
		return 0, false, true, r.nil()
	case kUint, kInt:
		u, s, neg, err := r.integer(k)
		if err != nil {
			return 0, false, false, err
		}
		if neg {
			return s, true, true, nil
		}
		if u > math.MaxInt64 {
			return 0, true, false, nil
		}
		return int64(u), true, true, nil
	}
	return 0, false, false, r.skip()
}

// rejecter is an event under decoding that can be rejected; the first
// reason given is the one reported.
type rejecter interface{ fail(Reason) }

// eventMapReader is one event being decoded by readEventMap: it names the
// recognized keys, records which were seen, and reads their values.
type eventMapReader interface {
	rejecter
	// fieldID maps a key to its field id; known is false for keys to
	// ignore (forward compatibility).
	fieldID(key []byte) (id uint8, known bool)
	// seenMask is the set of field ids read so far (bit id).
	seenMask() *uint32
	// failed reports whether the event is already rejected; its remaining
	// values are then skipped, though duplicates are still noticed.
	failed() bool
	readField(r *mpReader, id uint8) error
}

// readEventMap reads one element of a batch's event array with the rules
// every event family shares (events.md §3.2): an element that is not a map
// is rejected (array-encoded events with their own reason), non-string keys
// and repeated recognized keys reject the event, unknown keys are skipped,
// and nothing is read after a rejection. It returns only payload-level
// errors (the envelope is then rejected); event rejections go through fail.
func readEventMap(r *mpReader, ev eventMapReader) error {
	k, err := r.peek()
	if err != nil {
		return err
	}
	if k != kMap {
		if k == kArray {
			ev.fail(EvArrayEncoded)
		} else {
			ev.fail(EvNotMap)
		}
		return r.skip()
	}
	n, err := r.mapLen()
	if err != nil {
		return err
	}
	seen := ev.seenMask()
	for i := 0; i < n; i++ {
		k, err := r.peek()
		if err != nil {
			return err
		}
		if k != kStr {
			ev.fail(EvNonStringKey)
			if err := r.skip(); err != nil {
				return err
			}
			if err := r.skip(); err != nil {
				return err
			}
			continue
		}
		key, err := r.str()
		if err != nil {
			return err
		}
		id, known := ev.fieldID(key)
		switch {
		case !known:
			err = r.skip()
		case *seen&(1<<id) != 0:
			ev.fail(EvDuplicateKey)
			err = r.skip()
		case ev.failed():
			*seen |= 1 << id
			err = r.skip()
		default:
			*seen |= 1 << id
			err = ev.readField(r, id)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// readTokenArray checks a token_ids array (§3.9): every id within int32,
// and, when pairs is set (SGLang EAGLE bigram keys), elements may also be
// [a, b] pairs of ids. Token ids are only range-checked, never kept or
// logged; runs of plain integers are scanned in place (int32Run).
func readTokenArray(r *mpReader, pairs bool, ev rejecter) error {
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		run, ok := r.int32Run(n - i)
		if !ok {
			ev.fail(EvTokenRange)
		}
		if i += run; i == n {
			break
		}
		k, err := r.peek()
		if err != nil {
			return err
		}
		switch {
		case k.isInt():
			if err := readTokenID(r, k, ev); err != nil {
				return err
			}
		case k == kArray && pairs:
			m, err := r.arrayLen()
			if err != nil {
				return err
			}
			if m != 2 {
				ev.fail(EvTokenRange)
			}
			for j := 0; j < m; j++ {
				k, err := r.peek()
				if err != nil {
					return err
				}
				if !k.isInt() {
					ev.fail(EvWrongType)
					if err := r.skip(); err != nil {
						return err
					}
					continue
				}
				if err := readTokenID(r, k, ev); err != nil {
					return err
				}
			}
		default:
			ev.fail(EvWrongType)
			if err := r.skip(); err != nil {
				return err
			}
		}
	}
	return nil
}

func readTokenID(r *mpReader, k mkind, ev rejecter) error {
	u, s, neg, err := r.integer(k)
	if err != nil {
		return err
	}
	if (neg && s < math.MinInt32) || (!neg && u > math.MaxInt32) {
		ev.fail(EvTokenRange)
	}
	return nil
}
