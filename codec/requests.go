package codec

import (
	"encoding/binary"
	"math"
	"unsafe"

	"github.com/mooncake-conductor-go/conductor/internal/msgp"
	"github.com/mooncake-conductor-go/conductor/internal/registration"
	"github.com/mooncake-conductor-go/conductor/internal/reqfields"
	"github.com/mooncake-conductor-go/conductor/registry"
)

// Limits bound what one request may carry. They are enforced before
// anything is copied or changed, and a request over a limit is answered with
// out_of_range naming the field.
type Limits struct {
	// MaxTokens bounds len(token_ids) in /query.
	MaxTokens int
	// MaxIdentityBytes bounds instance_id, modelname/model, tenant_id,
	// type and endpoints.
	MaxIdentityBytes int
	// MaxNameBytes bounds lora_name and cache_salt, which enter hashed bytes;
	// engines hash names this long, so the limit is generous.
	MaxNameBytes int
}

// DefaultLimits are the documented defaults (docs/operations.md "Limits").
func DefaultLimits() Limits {
	reg := registration.DefaultLimits()
	return Limits{MaxTokens: 2 << 20, MaxIdentityBytes: reg.MaxIdentityBytes, MaxNameBytes: reg.MaxNameBytes}
}

// DefaultTenant is what an empty or omitted tenant_id means.
const DefaultTenant = registry.DefaultTenant

// DecodeRegister decodes a /register body under the registration record's
// schema (internal/registration), with the HTTP door's limits. The
// registration rules are the registry's, in registry.NewService.
func DecodeRegister(body []byte, lim Limits) (registry.Registration, *Error) {
	return registration.Decode(body, registration.Limits{MaxIdentityBytes: lim.MaxIdentityBytes, MaxNameBytes: lim.MaxNameBytes})
}

// UnregisterRequest is a validated /unregister body.
type UnregisterRequest struct {
	InstanceID string
	TenantID   string
	DPRank     int
}

// The members of an /unregister body, as fieldSet bits; a string's slot
// is its bit, dp_rank's integer slot 0.
const (
	unregInstanceID = iota
	unregTenantID
	unregDPRank
)

// unregisterTable is an /unregister body's members; the strings are
// copied, as the request outlives the body.
var unregisterTable = reqfields.NewTable("", true, []reqfields.Spec{
	unregInstanceID: {Name: "instance_id", Shape: reqfields.Str, Limit: reqfields.IdentityBytes, Slot: unregInstanceID},
	unregTenantID:   {Name: "tenant_id", Shape: reqfields.Str, Limit: reqfields.IdentityBytes, Slot: unregTenantID},
	unregDPRank:     {Name: "dp_rank", Shape: reqfields.Int, Min: 0, Max: maxInt32, Slot: 0},
})

// DecodeUnregister decodes and validates an /unregister body.
func DecodeUnregister(body []byte, lim Limits) (UnregisterRequest, *Error) {
	var r UnregisterRequest
	c, n, e := open(body)
	if e != nil {
		return r, e
	}
	var seen fieldSet
	var v reqfields.Values
	lims := byteLimits(lim)
	if _, e := unregisterTable.Next(&c.Cursor, &n, &seen.FieldSet, &v, &lims); e != nil {
		return r, e // no member has rules of its own: Next reads them all
	}
	r.InstanceID, r.TenantID, r.DPRank = v.Str[unregInstanceID], v.Str[unregTenantID], int(v.Int[0])
	if !seen.has(unregInstanceID) {
		return r, Errorf(Missing, "instance_id", "instance_id is required")
	}
	if !seen.has(unregDPRank) {
		return r, Errorf(Missing, "dp_rank", "dp_rank is required")
	}
	if r.InstanceID == "" {
		return r, Errorf(InvalidValue, "instance_id", "instance_id must not be empty")
	}
	if r.TenantID == "" {
		r.TenantID = DefaultTenant
	}
	return r, nil
}

// QueryRequest is a validated /query body. Its strings are views into the
// request body and are valid only while the body is; Tokens is read-only
// (it may be ids a TokenHook supplied) and valid until the next decode into
// the same QueryRequest. Buffers are reused across requests, so a pooled
// QueryRequest decodes without allocating once they have grown.
type QueryRequest struct {
	Model      string
	LoraName   string
	TenantID   string
	InstanceID string
	CacheSalt  string
	BlockSize  int
	Tokens     []int32

	buf []int32 // the token buffer this request owns
}

// DetachTokens gives Tokens' buffer away: the caller may keep Tokens for
// good, and the next decode into q gets a new buffer. (The token memo's
// door wrapper takes a learned array this way instead of copying it.)
func (q *QueryRequest) DetachTokens() {
	if len(q.Tokens) > 0 && len(q.buf) > 0 && &q.buf[0] == &q.Tokens[0] {
		q.buf = nil
	}
}

// A TokenHook takes part in decoding a MessagePack token_ids array
// (DecodeQueryHook): it may supply ids already known for the array's
// leading bytes, and it is shown the array once the whole body is
// accepted. The token memo's door wrapper (internal/tokenmemo, Session) is
// the one hook; the codec keeps nothing of it past the call. A binary
// token_ids is never shown to it.
type TokenHook interface {
	// KnownTokens is called once the array's header is read: elems is the
	// body from the array's first element on (the array and whatever
	// follows it), n its number of elements. It returns ids known to be
	// exactly what elems[:size] decodes to (none: nil and 0), which are
	// copied, or, when they are all n, become Tokens themselves; the rest
	// is decoded and checked as usual. stride > 0 asks for TokenChunkEnd
	// after every stride-th id decoded. A body decoded twice (a malformed
	// one, see DecodeQuery) calls it twice.
	KnownTokens(elems []byte, n int) (ids []int32, size, stride int)
	// TokenChunkEnd is the offset in elems just past id k·stride−1, for
	// each such id decoded rather than supplied, in order.
	TokenChunkEnd(off int)
	// TokensAccepted is called once the whole body is accepted: elems is
	// the array's elements exactly and tokens what they decode to
	// (q.Tokens).
	TokensAccepted(elems []byte, tokens []int32)
}

// The members /query and /query_by_hash share, as fieldSet bits (their
// ids in each body's table); each body's own members take the bits after
// them.
const (
	ctxModel = iota
	ctxLoraName
	ctxTenantID
	ctxInstanceID
	ctxBlockSize
	ctxCacheSalt
	ctxMembers // the first bit a body's own members use
)

// Where the shared members' values go in reqfields.Values.
const (
	slotModel = iota
	slotLoraName
	slotTenantID
	slotInstanceID
	slotCacheSalt
)

// contextSpecs are the shared members, at their ids, followed by a body's
// own. Strings are views into the body (QueryRequest's doc).
func contextSpecs(own ...reqfields.Spec) []reqfields.Spec {
	return append([]reqfields.Spec{
		ctxModel:      {Name: "model", Shape: reqfields.Str, Limit: reqfields.IdentityBytes, Slot: slotModel},
		ctxLoraName:   {Name: "lora_name", Shape: reqfields.Str, Limit: reqfields.NameBytes, Slot: slotLoraName},
		ctxTenantID:   {Name: "tenant_id", Shape: reqfields.Str, Limit: reqfields.IdentityBytes, Slot: slotTenantID},
		ctxInstanceID: {Name: "instance_id", Shape: reqfields.Str, Limit: reqfields.IdentityBytes, Slot: slotInstanceID},
		ctxBlockSize:  {Name: "block_size", Shape: reqfields.BlockSize, Slot: 0},
		ctxCacheSalt:  {Name: "cache_salt", Shape: reqfields.StrOrNil, Limit: reqfields.NameBytes, Slot: slotCacheSalt},
	}, own...)
}

// contextValues is what the shared members read into v: pointers to a
// body's copies of them.
func contextValues(v *reqfields.Values, model, loraName, tenantID, instanceID, cacheSalt *string, blockSize *int) {
	*model, *loraName, *tenantID = v.Str[slotModel], v.Str[slotLoraName], v.Str[slotTenantID]
	*instanceID, *cacheSalt, *blockSize = v.Str[slotInstanceID], v.Str[slotCacheSalt], int(v.Int[0])
}

// byteLimits are lim's string limits as a table reads them.
func byteLimits(lim Limits) reqfields.ByteLimits {
	return reqfields.ByteLimits{reqfields.IdentityBytes: lim.MaxIdentityBytes, reqfields.NameBytes: lim.MaxNameBytes}
}

const qTokenIDs = ctxMembers

// queryTable is a /query body's members: token_ids has rules of its own
// (decodeTokens).
var queryTable = reqfields.NewTable("", false, contextSpecs(
	reqfields.Spec{Name: "token_ids", Shape: reqfields.Own},
))

// DecodeQuery decodes and validates a /query body into q, reusing q.Tokens.
//
// A well-formed body is read in one pass: each field is validated just
// before it is read, and the token array, nearly all of the body, is
// bounds-checked by the token decoder itself rather than walked a second
// time by validate (which cost as much as decoding it). Any failure on that
// pass, malformed or not, is decoded again the validated way, so errors are
// exactly those of validate-then-read: a malformed body is invalid_msgpack
// even when an earlier field also has a schema error.
func DecodeQuery(body []byte, lim Limits, q *QueryRequest) *Error {
	return DecodeQueryHook(body, lim, q, nil)
}

// DecodeQueryHook is DecodeQuery with a MessagePack token_ids array read
// through h (nil: none): the result, and the error for a malformed body,
// are the same, since MessagePack values delimit themselves (equal bytes
// are equal ids) and the ids h supplies were validated when first decoded.
func DecodeQueryHook(body []byte, lim Limits, q *QueryRequest, h TokenHook) *Error {
	arr, e := decodeQueryBody(body, lim, q, h)
	if e == nil && h != nil && arr.elems {
		h.TokensAccepted(body[arr.start:arr.end], q.Tokens)
	}
	return e
}

// tokenSpan is where a body's token_ids array lies in it: elems says it is
// a MessagePack array (not a binary), start and end bound its elements.
type tokenSpan struct {
	elems      bool
	start, end int
}

func decodeQueryBody(body []byte, lim Limits, q *QueryRequest, h TokenHook) (tokenSpan, *Error) {
	if c, n, e := openChecked(body); e == nil {
		if arr, e := decodeQuery(c, n, lim, q, h); e == nil {
			return arr, nil
		}
	}
	c, n, e := open(body)
	if e != nil {
		return tokenSpan{}, e
	}
	return decodeQuery(c, n, lim, q, h)
}

func decodeQuery(c cursor, n int, lim Limits, q *QueryRequest, h TokenHook) (arr tokenSpan, _ *Error) {
	*q = QueryRequest{buf: q.buf}
	var seen fieldSet
	var v reqfields.Values
	lims := byteLimits(lim)
	for {
		id, e := queryTable.Next(&c.Cursor, &n, &seen.FieldSet, &v, &lims)
		if e != nil {
			return arr, e
		}
		if id == reqfields.Done {
			break
		}
		// token_ids, the one member with rules of its own, which checks
		// its own bounds on a checked cursor.
		if e = seen.mark(qTokenIDs, "token_ids"); e == nil {
			arr, e = decodeTokens(&c, lim, q, h)
		}
		if e != nil {
			return arr, e
		}
	}
	if c.Checked && c.Remaining() != 0 {
		return arr, errUnchecked // trailing bytes
	}
	contextValues(&v, &q.Model, &q.LoraName, &q.TenantID, &q.InstanceID, &q.CacheSalt, &q.BlockSize)
	switch {
	case !seen.has(ctxModel):
		return arr, Errorf(Missing, "model", "model is required")
	case !seen.has(ctxBlockSize):
		return arr, Errorf(Missing, "block_size", "block_size is required")
	case !seen.has(qTokenIDs):
		return arr, Errorf(Missing, "token_ids", "token_ids is required")
	case q.Model == "":
		return arr, Errorf(InvalidValue, "model", "model must not be empty")
	}
	if q.TenantID == "" {
		q.TenantID = DefaultTenant
	}
	return arr, nil
}

// decodeTokens reads token_ids, an array of int32-range integers or a bin
// of little-endian int32 values, into q.Tokens, and reports where an
// array's elements lie. On a checked cursor it validates what it reads
// itself: the array header, the run's bounds, and each element the run
// leaves to the general path. With a hook, an array's leading ids the hook
// knows are copied and only the rest is decoded.
func decodeTokens(c *cursor, lim Limits, q *QueryRequest, h TokenHook) (tokenSpan, *Error) {
	const field = "token_ids"
	if c.Checked {
		if k, n, _, err := c.PeekHeader(); err != nil || k == msgp.Array && n > uint64(c.Remaining()) {
			return tokenSpan{}, errUnchecked
		} else if k != msgp.Array {
			if e := c.ahead(); e != nil {
				return tokenSpan{}, e
			}
		}
	}
	switch k := c.Kind(); k {
	case msgp.Array:
		n, err := c.ArrayLen()
		if err != nil {
			return tokenSpan{}, errUnchecked
		}
		if n > lim.MaxTokens {
			return tokenSpan{}, Errorf(OutOfRange, field, "token_ids has %d tokens, the limit is %d", n, lim.MaxTokens)
		}
		start, from, stride := c.Pos(), 0, 0
		dst := grow(q.buf, n)
		q.buf, q.Tokens = dst, dst
		if h != nil {
			var known []int32
			var size int
			known, size, stride = h.KnownTokens(c.Bytes()[start:], n)
			if len(known) == n {
				q.Tokens = known[:n:n]
				c.SetPos(start + size)
				return tokenSpan{true, start, c.Pos()}, nil
			} else if len(known) > 0 {
				from = copy(dst, known)
				c.SetPos(start + size)
			}
		}
		for i := from; i < n; {
			stop := n
			if stride > 0 {
				stop = min(n, (i/stride+1)*stride)
			}
			if i = c.TokenRun(dst[:stop], i); i < stop {
				// An element the run could not take: a rare format (negative,
				// int8/16, 64-bit), a value out of range, a wrong type, or one
				// of the last few elements of the body.
				if e := c.ahead(); e != nil {
					return tokenSpan{}, e
				}
				if k := c.Kind(); k != msgp.Int {
					return tokenSpan{}, elemErrorf(InvalidType, field, i, "token_ids[%d] must be an integer, got %s", i, k)
				}
				v, ok := msgp.Int64Range(c.int())
				if !ok || v < math.MinInt32 || v > math.MaxInt32 {
					return tokenSpan{}, elemErrorf(OutOfRange, field, i, "token_ids[%d] is outside the int32 range", i)
				}
				dst[i] = int32(v)
				i++
			}
			if stride > 0 && i == stop && i%stride == 0 {
				h.TokenChunkEnd(c.Pos() - start)
			}
		}
		return tokenSpan{true, start, c.Pos()}, nil
	case msgp.Bin:
		b, err := c.Str()
		if err != nil {
			return tokenSpan{}, errUnchecked
		}
		if len(b)%4 != 0 {
			return tokenSpan{}, Errorf(InvalidValue, field, "binary token_ids must be a multiple of 4 bytes, got %d", len(b))
		}
		n := len(b) / 4
		if n > lim.MaxTokens {
			return tokenSpan{}, Errorf(OutOfRange, field, "token_ids has %d tokens, the limit is %d", n, lim.MaxTokens)
		}
		dst := grow(q.buf, n)
		q.buf, q.Tokens = dst, dst
		if hostLittleEndian && n > 0 {
			// The wire's layout is the host's: one copy instead of a
			// conversion per element (BENCHMARKS.md, the request floor).
			copy(unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), 4*n), b)
			return tokenSpan{}, nil
		}
		for i := range dst {
			dst[i] = int32(binary.LittleEndian.Uint32(b[4*i:]))
		}
		return tokenSpan{}, nil
	default:
		return tokenSpan{}, Errorf(InvalidType, field, "token_ids must be an array of integers or a binary of little-endian int32, got %s", k)
	}
}

// hostLittleEndian says int32s are laid out in memory as a binary
// token_ids array packs them, so decoding one is a copy.
var hostLittleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

func grow(dst []int32, n int) []int32 {
	if cap(dst) < n {
		return make([]int32, n)
	}
	return dst[:n]
}
