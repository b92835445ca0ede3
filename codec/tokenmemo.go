package codec

import (
	"github.com/mooncake-conductor-go/conductor/internal/tokenmemo"
)

// memoMinTokens: shorter arrays decode in less time than a memo lookup.
const memoMinTokens = 256

// memoChunk is the number of tokens between the byte offsets a memo
// entry records (tokenmemo.Chunk).
const memoChunk = tokenmemo.Chunk

// DecodeQueryMemo is DecodeQuery consulting the token memo both doors share
// (internal/tokenmemo), which has the MessagePack array's remembered
// leading elements copied instead of decoded: the result, and the error for
// a malformed body, are the same. MessagePack values delimit themselves, so
// equal bytes are equal tokens, and a reused prefix was validated when it
// was first decoded; the rest of the array is decoded and checked as
// usual. q.Tokens may then be a remembered array, which must not be
// modified. A nil memo decodes in full. The memo learns the body's array
// only through RememberTokens.
func DecodeQueryMemo(m *tokenmemo.Memo, body []byte, lim Limits, q *QueryRequest) *Error {
	q.memo = m
	e := decodeQueryBody(body, lim, q)
	q.memo = nil
	if e != nil || m == nil || q.learn.fps == 0 {
		return e
	}
	l := &q.learn
	m.Count(uint64(l.reused), uint64(len(q.Tokens)-l.reused))
	if len(q.Tokens)-l.reused >= memoChunk {
		q.packed = body[l.start:l.end]
	}
	return nil
}

// RememberTokens lets m learn the token array q was just decoded from (by
// DecodeQueryMemo with m), if it holds enough tokens the memo did not
// have. The server calls it once it knows the query has a context to be
// answered from, so that queries for nothing (a model not registered, or
// no longer) do not fill the memo. The body q was decoded from must still
// be intact.
func RememberTokens(m *tokenmemo.Memo, q *QueryRequest) {
	packed := q.packed
	q.packed = nil
	if m == nil || packed == nil {
		return
	}
	if m.Remember(tokenmemo.MsgPack, packed, q.buf[:len(q.Tokens)], q.ends, q.fps[:q.learn.fps], true) {
		// The entry took the buffer: q.Tokens is now a remembered array,
		// and the next decode gets a new one.
		q.buf = nil
	}
}

// TokensShared reports whether q.Tokens is a token memo's remembered
// array, which is never modified and may be kept (hashing.Chain.KeepTokens)
// for as long as anyone needs it.
func (q *QueryRequest) TokensShared() bool {
	return len(q.Tokens) > 0 && (len(q.buf) == 0 || &q.buf[0] != &q.Tokens[0])
}

// memoLearn describes the token array of the body being decoded, for the
// memo to remember once the whole body is accepted.
type memoLearn struct {
	start, end int // the array's elements in the body
	reused     int // leading tokens copied from the memo
	fps        int // fingerprints computed (0: the memo was not consulted)
}
