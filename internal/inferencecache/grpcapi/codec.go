package grpcapi

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"math/bits"
	"slices"
	"sync"
	"unicode/utf8"
	"unsafe"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // registers the base codec
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	pb "github.com/mooncake-conductor-go/conductor/internal/inferencecache/proto/inferencecache/v1alpha1"
	"github.com/mooncake-conductor-go/conductor/internal/tokenmemo"
)

// lookupCodec is the server's wire codec: the standard protobuf codec,
// except that a LookupRouteRequest is decoded by decodeLookup. That is the
// hot request, and the generic decoder spends most of a lookup's time on
// it: it grows the token_ids slice step by step over 8K varints and
// allocates every block hash separately; decodeLookup sizes the ids once
// and points the hashes into one copy of the message.
//
// token_ids runs are read through the token memo's door wrapper
// (tokenmemo.Door, in the memo's Varint format; docs/architecture.md,
// "The gRPC door"): a varint ends at its first byte below 0x80, so equal
// packed bytes are equal ids, and a lookup repeating a prefix seen on
// either door (a system prompt, the previous turn) copies those ids
// instead of decoding them. The transport reuses the message's buffer once
// Unmarshal returns, so a run to learn is copied; the ids stay in the
// request's pooled array, which the memo copies too.
type lookupCodec struct {
	base encoding.CodecV2
	memo *tokenmemo.Door
}

func newLookupCodec(memo *tokenmemo.Memo) lookupCodec {
	return lookupCodec{encoding.GetCodecV2("proto"), &tokenmemo.Door{Memo: memo, Format: tokenmemo.Varint, Transient: true}}
}

func (c lookupCodec) Name() string { return c.base.Name() }

// Marshal encodes LookupRoute's answers itself (marshalLookupResponse)
// and everything else with the base codec.
func (c lookupCodec) Marshal(v any) (mem.BufferSlice, error) {
	if r, ok := v.(*pb.LookupRouteResponse); ok {
		if data, ok := marshalLookupResponse(r); ok {
			return data, nil
		}
	}
	return c.base.Marshal(v)
}

func (c lookupCodec) Unmarshal(data mem.BufferSlice, v any) error {
	var (
		m    *pb.LookupRouteRequest
		bufs *decodeBufs
		own  tokenmemo.Session
	)
	switch x := v.(type) {
	case *lookupCall:
		m, bufs = &x.req, &x.bufs
	case *pb.LookupRouteRequest:
		m = x
	default:
		return c.base.Unmarshal(data, v)
	}
	// One contiguous view of the message (no copy when the transport
	// holds it in one buffer); the transport reuses it once Unmarshal
	// returns, so decodeLookup copies what the request keeps.
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	s := &own
	if bufs != nil {
		// The server's handler: the memo learns the run only once the
		// lookup proved to have a context (Server.lookup).
		s = &bufs.memo
	}
	s.Begin(c.memo)
	err := decodeLookup(buf.ReadOnlyData(), m, bufs, s)
	if bufs == nil {
		// A request decoded on its own has no lookup to wait for.
		if err == nil {
			s.Teach()
		}
		s.Forget()
	}
	return err
}

// lookupCall is one LookupRoute call as the server receives it: the
// request and the memory its repeated fields are decoded into. It is
// pooled (lookupCalls), so a steady stream of lookups reuses the same
// arrays instead of allocating, zeroing and collecting a 512-hash chain's
// 16 KiB or 8K token ids' 32 KiB on every call: for a chain that was most
// of the decoding's cost.
type lookupCall struct {
	req  pb.LookupRouteRequest
	bufs decodeBufs
	// srv is the server answering the call; handle, made once per pooled
	// call, is the handler the interceptors wrap (no closure per call).
	srv    *Server
	handle grpc.UnaryHandler
}

func newLookupCall() any {
	c := new(lookupCall)
	c.handle = func(ctx context.Context, req any) (any, error) {
		r := req.(*pb.LookupRouteRequest)
		// What the decode learnt of the ids holds only for its request.
		var bufs *decodeBufs
		if r == &c.req {
			bufs = &c.bufs
		}
		return c.srv.lookupRoute(ctx, r, bufs), nil
	}
	return c
}

// decodeBufs is what decodeLookup may decode into instead of allocating:
// the arena bytes fields are copied to, and the backing arrays of
// block_hashes, block_token_counts and token_ids.
type decodeBufs struct {
	arena  []byte
	hashes [][]byte
	counts []int32
	ids    []uint32
	// idsNarrow says every token id the last decode produced is known to
	// fit an int32 (so the lookup need not check them again).
	idsNarrow bool
	// strs holds, by field number, the last string decoded for the
	// string fields up to adapter_id (11); strings are immutable, so a
	// later request may share one.
	strs [12]string
	// memo is the request's use of the token memo: the token_ids run it
	// may learn once the lookup proved to have a context.
	memo tokenmemo.Session
}

// maxPooledBytes bounds each array a pooled lookupCall keeps: a rare huge
// request (up to 2^20 token ids) does not pin its buffers in the pool.
const maxPooledBytes = 256 << 10

var lookupCalls = sync.Pool{New: newLookupCall}

// release returns the call to the pool. Nothing may use its request, or
// anything read from it, afterwards: the handler returns only copies
// (strings, and the index's own data) in its response.
func (c *lookupCall) release() {
	b := &c.bufs
	if cap(b.arena) > maxPooledBytes {
		b.arena = nil
	}
	if 24*cap(b.hashes) > maxPooledBytes {
		b.hashes = nil
	}
	if 4*cap(b.counts) > maxPooledBytes {
		b.counts = nil
	}
	if 4*cap(b.ids) > maxPooledBytes {
		b.ids = nil
	}
	b.memo.Forget()
	for i := range b.strs {
		if len(b.strs[i]) > 256 {
			b.strs[i] = "" // a prompt text, say: not worth keeping
		}
	}
	c.req.Reset()
	c.srv = nil
	lookupCalls.Put(c)
}

// serviceDesc is the generated service description with LookupRoute's
// handler replaced by lookupRouteHandler, which decodes into a pooled
// lookupCall; every other method is the generated one.
func serviceDesc() *grpc.ServiceDesc {
	d := pb.InferenceCache_ServiceDesc
	d.Methods = slices.Clone(d.Methods)
	for i := range d.Methods {
		if d.Methods[i].MethodName == "LookupRoute" {
			d.Methods[i].Handler = lookupRouteHandler
		}
	}
	return &d
}

// lookupRouteHandler is the generated LookupRoute handler except that the
// request comes from, and goes back to, the lookupCall pool once the
// handler (and the interceptors around it) returned; gRPC encodes the
// response after that, and the response holds nothing of the request.
func lookupRouteHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	c := lookupCalls.Get().(*lookupCall)
	defer c.release()
	if err := dec(c); err != nil {
		return nil, err
	}
	c.srv = srv.(*Server)
	if interceptor == nil {
		return c.handle(ctx, &c.req)
	}
	return interceptor(ctx, &c.req, c.srv.lookupInfo, c.handle)
}

var errBadLookup = errors.New("malformed LookupRouteRequest")

// blockHashTag is the one-byte tag of block_hashes (field 7, bytes).
var blockHashTag = byte(protowire.EncodeTag(7, protowire.BytesType))

// decodeLookup decodes b into m as proto.Unmarshal would (the same values
// and the same inputs rejected), except that unknown fields are dropped
// rather than kept. m keeps nothing of b: bytes fields are copied into one
// arena. bufs, when not nil, supplies the arena and the repeated fields'
// arrays (and gets back any it had to grow). token_ids runs are read
// through s, the request's session with the token memo (decodeRun).
func decodeLookup(b []byte, m *pb.LookupRouteRequest, bufs *decodeBufs, s *tokenmemo.Session) error {
	m.Reset()
	var arena []byte
	// borrowed is the array of ids the memo lent (never to be reused).
	var borrowed *uint32
	// narrow stays true while every token id decoded is known to fit an
	// int32 without looking at it again.
	narrow := true
	if bufs != nil {
		if cap(bufs.arena) < len(b) {
			// The hashes' old entries point into the old arena: let it go.
			clear(bufs.hashes[:cap(bufs.hashes)])
			bufs.arena = make([]byte, 0, len(b))
		}
		arena = bufs.arena[:0]
		m.BlockHashes, m.BlockTokenCounts, m.TokenIds = bufs.hashes[:0], bufs.counts[:0], bufs.ids[:0]
		defer func() {
			if cap(m.BlockHashes) > cap(bufs.hashes) {
				bufs.hashes = m.BlockHashes[:0]
			}
			if cap(m.BlockTokenCounts) > cap(bufs.counts) {
				bufs.counts = m.BlockTokenCounts[:0]
			}
			if cap(m.TokenIds) > cap(bufs.ids) && unsafe.SliceData(m.TokenIds) != borrowed {
				bufs.ids = m.TokenIds[:0]
			}
			bufs.idsNarrow = narrow
		}()
	}
	// The first bytes field the request keeps moves the rest of the
	// message into the arena, one copy; from then on b is read there and
	// kept fields are views of it.
	inArena := false
	for len(b) > 0 {
		// The common field of a chain lookup, a block hash shorter than
		// 128 bytes (one-byte tag and length), is read inline, a run of
		// hashes of one length at a time: their records then lie at a
		// fixed stride, so no read waits for the length before it.
		if len(b) >= 2 && b[0] == blockHashTag && b[1] < 0x80 && int(b[1]) <= len(b)-2 {
			if !inArena {
				arena, b = toArena(arena, b)
				inArena = true
			}
			l := int(b[1])
			stride := l + 2
			n := 1
			for (n+1)*stride <= len(b) && b[n*stride] == blockHashTag && int(b[n*stride+1]) == l {
				n++
			}
			// Room for as many hashes of this length as the rest could
			// hold: hashes of mixed lengths grow the array a bounded
			// number of times, never once per run.
			hs := growTo(m.BlockHashes, len(b)/stride)
			for i := range n {
				at := i*stride + 2
				hs = append(hs, b[at:at+l:at+l])
			}
			m.BlockHashes = hs
			b = b[n*stride:]
			continue
		}
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || num > protowire.MaxValidNumber {
			return errBadLookup
		}
		b = b[n:]
		known := true
		switch {
		case typ == protowire.BytesType && (num == 1 || num == 2 || num == 5 || num == 10 || num == 11):
			v, n := protowire.ConsumeBytes(b)
			if n < 0 || !utf8.Valid(v) {
				return errBadLookup
			}
			b = b[n:]
			var s string
			if bufs != nil && num < protowire.Number(len(bufs.strs)) {
				// A gateway repeats its tenant, model and scheme:
				// the string this pooled call made last time is
				// reused when the bytes are the same.
				if last := &bufs.strs[num]; string(v) == *last {
					s = *last
				} else {
					s = string(v)
					*last = s
				}
			} else {
				s = string(v)
			}
			switch num {
			case 1:
				m.ModelId = s
			case 2:
				m.TenantId = s
			case 5:
				m.HashScheme = s
			case 10:
				m.PromptText = s
			case 11:
				m.AdapterId = s
			}
		case typ == protowire.BytesType && (num == 3 || num == 7):
			if !inArena {
				arena, b = toArena(arena, b)
				inArena = true
			}
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return errBadLookup
			}
			b = b[n:]
			v = v[:len(v):len(v)] // never nil, as protobuf's
			if num == 3 {
				m.PrefixHash = v
			} else {
				m.BlockHashes = append(m.BlockHashes, v)
			}
		case typ == protowire.VarintType && num == 4:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return errBadLookup
			}
			b = b[n:]
			m.PrefixTokenCount = int32(v)
		case typ == protowire.BytesType && num == 6:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return errBadLookup
			}
			b = b[n:]
			if m.Slo == nil {
				m.Slo = &pb.SLO{}
			}
			if err := (proto.UnmarshalOptions{Merge: true}).Unmarshal(v, m.Slo); err != nil {
				return err
			}
		case num == 8 && (typ == protowire.BytesType || typ == protowire.VarintType):
			var ok bool
			if m.BlockTokenCounts, b, _, ok = consumeRepeated(m.BlockTokenCounts, b, typ); !ok {
				return errBadLookup
			}
		case num == 9 && typ == protowire.BytesType:
			run, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return errBadLookup
			}
			b = b[n:]
			var ok, lent, nar bool
			if m.TokenIds, lent, nar, ok = decodeRun(s, m.TokenIds, run); !ok {
				return errBadLookup
			}
			narrow = narrow && nar
			if lent {
				borrowed = unsafe.SliceData(m.TokenIds)
			}
		case num == 9 && typ == protowire.VarintType:
			var ok, nar bool
			if m.TokenIds, b, nar, ok = consumeRepeated(m.TokenIds, b, typ); !ok {
				return errBadLookup
			}
			narrow = narrow && nar
		default:
			known = false
		}
		if !known {
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return errBadLookup
			}
			b = b[n:]
		}
	}
	return nil
}

// decodeRun appends the ids packed in run to dst (as uint32, truncating as
// protobuf does), through the token memo's session s: a remembered prefix
// is copied, the rest decoded, and s told what the run decoded to (it
// keeps the request's first run worth learning for Teach). ok is false for
// a malformed run, exactly when decoding it in full would fail. lent says
// the result is the memo's own array (read-only, never to be reused);
// narrow, that every id appended is known to fit an int32.
func decodeRun(s *tokenmemo.Session, dst []uint32, run []byte) (out []uint32, lent, narrow, ok bool) {
	// The run is exactly the ids: no bound on their number to give.
	known, size, _ := s.KnownTokens(run, math.MaxInt)
	base := len(dst)
	if size == len(run) && size > 0 { // the whole run was remembered
		s.Accepted(run, known, true)
		ids := uint32s(known)
		if base == 0 {
			// The entry is immutable and the request only reads its
			// ids: share them (capped, so an append would copy).
			return ids, true, true, true
		}
		return append(dst, ids...), false, true, true
	}
	rest := varintCount(run[size:]) // only the bytes not reused are counted
	dst = growTo(dst, len(known)+rest)
	dst = append(dst, uint32s(known)...)
	if dst, narrow, ok = appendCounted(dst, run[size:], rest); !ok {
		return dst, false, false, false
	}
	// Ids that took three bytes or fewer fit an int32; otherwise the
	// session checks them before learning the run (Session.Accepted).
	s.Accepted(run, int32s(dst[base:len(dst):len(dst)]), narrow)
	return dst, false, narrow, true
}

// uint32s is ids as the uint32 token_ids protobuf decodes to: the same
// memory, read only. The memo's Varint forms hold no negative id, so the
// values are the ids themselves.
func uint32s(ids []int32) []uint32 {
	return unsafe.Slice((*uint32)(unsafe.Pointer(unsafe.SliceData(ids))), len(ids))
}

// int32s is ids, each at most MaxInt32 when the memo is to learn them, as
// the int32 tokens the memo and the query engine take: the same memory.
func int32s(ids []uint32) []int32 {
	return unsafe.Slice((*int32)(unsafe.Pointer(unsafe.SliceData(ids))), len(ids))
}

// toArena copies b into arena, growing it when it is too small, and returns
// the arena and the copy (the same slice).
func toArena(arena, b []byte) ([]byte, []byte) {
	if cap(arena) < len(b) {
		arena = make([]byte, 0, len(b))
	}
	arena = append(arena[:0], b...)
	return arena, arena
}

// consumeRepeated appends one packed run or one unpacked varint of a
// repeated 32-bit scalar field to dst (values truncated to 32 bits, as
// protobuf does) and returns the rest of b. narrow is appendPacked's (an
// unpacked value is not looked at: false).
func consumeRepeated[T int32 | uint32](dst []T, b []byte, typ protowire.Type) (out []T, rest []byte, narrow, ok bool) {
	if typ == protowire.VarintType {
		v, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return dst, nil, false, false
		}
		return append(dst, T(v)), b[n:], false, true
	}
	run, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return dst, nil, false, false
	}
	dst, narrow, ok = appendPacked(dst, run)
	return dst, b[n:], narrow, ok
}

// appendPacked appends the varints packed in run to dst. The run is
// counted first so dst grows once. narrow says every value took at most
// three bytes, so is below 2^21: token ids known to fit an int32 without
// another look.
func appendPacked[T int32 | uint32](dst []T, run []byte) (out []T, narrow, ok bool) {
	return appendCounted(dst, run, varintCount(run))
}

// appendCounted is appendPacked for a run already counted: n is
// varintCount(run).
func appendCounted[T int32 | uint32](dst []T, run []byte, n int) (out []T, narrow, ok bool) {
	dst = growTo(dst, n)
	base := len(dst)
	out = dst[base:cap(dst)]
	narrow = true
	j := 0
	for i := 0; i < len(run); j++ {
		if j >= len(out) {
			return dst, false, false // a value without a final byte
		}
		// Ids below 2^21 take at most three bytes: decoded here, inline,
		// where the branches predict well on real vocabularies (a
		// branch-free four-byte assembly measured slower); longer or
		// malformed ones go to the general decoder.
		c := run[i]
		switch {
		case c < 0x80:
			out[j] = T(c)
			i++
		case i+1 < len(run) && run[i+1] < 0x80:
			out[j] = T(uint64(c&0x7f) | uint64(run[i+1])<<7)
			i += 2
		case i+2 < len(run) && run[i+1] >= 0x80 && run[i+2] < 0x80:
			out[j] = T(uint64(c&0x7f) | uint64(run[i+1]&0x7f)<<7 | uint64(run[i+2])<<14)
			i += 3
		default:
			v, vn := protowire.ConsumeVarint(run[i:])
			if vn < 0 {
				return dst, false, false
			}
			narrow = false
			out[j] = T(v)
			i += vn
		}
	}
	return dst[:base+j], narrow, true
}

// varintCount is the number of varints that end in b: its bytes without
// the continuation bit, counted eight at a time.
func varintCount(b []byte) int {
	k := 0
	for ; len(b) >= 8; b = b[8:] {
		k += 8 - bits.OnesCount64(binary.LittleEndian.Uint64(b)&0x8080808080808080)
	}
	for _, c := range b {
		if c < 0x80 {
			k++
		}
	}
	return k
}

// growTo makes room for k more elements.
func growTo[T any](s []T, k int) []T {
	if cap(s)-len(s) >= k {
		return s
	}
	out := make([]T, len(s), len(s)+k)
	copy(out, s)
	return out
}
