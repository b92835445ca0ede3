// Package query is the lookup engine: given a context, token ids and an
// optional instance filter, it hashes the prompt's blocks and walks them
// against the index, and returns per-owner tier counts. It owns the whole
// sequence (decoding through the token memo, remembering the body's array,
// a remembered answer at the same index version, or the pooled key chain
// with the prefix memo, the walk and the chain's release), so the HTTP
// handler, and any other door such as a gRPC lookup, calls one method
// instead of repeating it.
package query

import (
	"sync"

	"github.com/zeebo/xxh3"

	"github.com/mooncake-conductor-go/conductor/codec"
	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
)

// Options configure an Engine.
type Options struct {
	Index *index.Index
	// Limits bound a request; zero takes codec.DefaultLimits.
	Limits codec.Limits
	// Memo, when set, lets warm lookups skip SHA-256 for blocks seen
	// before; answers are identical either way.
	Memo *hashing.Memo
	// Links, when set, lets lookups follow the links ingest verified
	// instead of computing SHA-256; answers are identical either way.
	Links *hashing.Links
	// TokenMemo, when set, lets warm bodies copy the token ids of a
	// prefix seen before instead of decoding them.
	TokenMemo *codec.TokenMemo
	// Answers, when set, lets a prompt asked again while its table is
	// unchanged skip the hashing and the walk; answers are identical
	// either way.
	Answers *Answers
}

// Engine answers lookups. It holds no per-request state and is safe for
// concurrent use.
type Engine struct {
	opts Options
}

// New returns an engine over opts.Index.
func New(opts Options) *Engine {
	if opts.Limits == (codec.Limits{}) {
		opts.Limits = codec.DefaultLimits()
	}
	return &Engine{opts: opts}
}

// Limits are the bounds the engine enforces.
func (e *Engine) Limits() codec.Limits { return e.opts.Limits }

// Request is one lookup with its token ids already decoded.
type Request struct {
	// Context selects the table; an unknown context answers no owners.
	Context index.ContextKey
	// Instance, when not "", restricts the answer to that instance.
	Instance  string
	CacheSalt string
	// Tokens are read, never modified, and not kept past the call.
	Tokens []int32
}

// Result is the per-owner answer: instances sorted by id, each with its
// ranks' cumulative tier counts. Reuse one Result across lookups (one at a
// time) so that a warm lookup allocates nothing.
type Result = index.QueryResult

// Kind is the closed set of ways a lookup can fail.
type Kind uint8

const (
	// InvalidRequest: the request breaks the schema or a limit; Detail
	// names the contract's reason, field and element.
	InvalidRequest Kind = iota + 1
)

// Error is a failed lookup. Nothing has been changed when one is returned.
type Error struct {
	Kind   Kind
	Detail *codec.Error
}

func (e *Error) Error() string { return e.Detail.Error() }

// Unwrap exposes the contract's validation error.
func (e *Error) Unwrap() error { return e.Detail }

func invalid(d *codec.Error) error { return &Error{Kind: InvalidRequest, Detail: d} }

// bodyPool holds the decoded form of a body, so a lookup from bytes
// allocates nothing once its buffers have grown.
var bodyPool = sync.Pool{New: func() any { return new(codec.QueryRequest) }}

// LookupBody decodes a /query body and answers it into res. A body whose
// token array was decoded and whose context exists teaches the token memo
// that array; a query for a context nobody registered leaves both memos
// as they were. The error, if any, is an *Error.
func (e *Engine) LookupBody(body []byte, res *Result) error {
	q := bodyPool.Get().(*codec.QueryRequest)
	defer bodyPool.Put(q)
	if d := e.opts.TokenMemo.DecodeQuery(body, e.opts.Limits, q); d != nil {
		return invalid(d)
	}
	res.Instances = res.Instances[:0]
	tbl := e.opts.Index.Table(index.ContextKey{Tenant: q.TenantID, Model: q.Model, Lora: q.LoraName, BlockSize: q.BlockSize})
	if tbl == nil {
		return nil
	}
	e.opts.TokenMemo.Remember(q)
	e.walk(tbl, q.Tokens, q.TokensShared(), q.LoraName, q.CacheSalt, q.InstanceID, res)
	return nil
}

// Lookup answers req into res. It checks what a decoder would have: a
// model, a positive block size and the token limit. The error, if any, is
// an *Error.
func (e *Engine) Lookup(req *Request, res *Result) error {
	switch {
	case req.Context.Model == "":
		return invalid(codec.Errorf(codec.Missing, "model", "model is required"))
	case req.Context.BlockSize <= 0:
		return invalid(codec.Errorf(codec.InvalidValue, "block_size", "block_size must be positive"))
	case len(req.Tokens) > e.opts.Limits.MaxTokens:
		return invalid(codec.Errorf(codec.OutOfRange, "token_ids", "token_ids has %d tokens, the limit is %d", len(req.Tokens), e.opts.Limits.MaxTokens))
	}
	ctx := req.Context
	if ctx.Tenant == "" {
		ctx.Tenant = codec.DefaultTenant
	}
	res.Instances = res.Instances[:0]
	if tbl := e.opts.Index.Table(ctx); tbl != nil {
		e.walk(tbl, req.Tokens, false, ctx.Lora, req.CacheSalt, req.Instance, res)
	}
	return nil
}

// walk answers from a remembered answer at the table's current version
// when there is one; otherwise it hashes tokens lazily under the table's
// profile, walks the keys, and remembers the answer if no writer changed
// the table meanwhile. shared says tokens are never modified and may be
// kept by the memos without a copy.
func (e *Engine) walk(tbl *index.Table, tokens []int32, shared bool, lora, salt, instance string, res *Result) {
	ans := e.opts.Answers
	if len(tokens) < MinAnswerTokens {
		ans = nil
	}
	var fp uint64
	var id xxh3.Uint128
	if ans != nil {
		id = promptID(tokens)
		fp = fingerprint(tbl, instance, salt, id)
		if ans.lookup(fp, tbl, instance, salt, id, res) {
			return
		}
	}
	ch := hashing.AcquireChain()
	ch.Reset(tbl.Profile(), tbl.Context().BlockSize, tokens, lora, salt)
	if shared {
		ch.KeepTokens()
	}
	ch.UseMemo(e.opts.Memo)
	ch.UseLinks(e.opts.Links)
	if ans == nil {
		tbl.Query(ch, instance, res)
	} else if ver, exact := tbl.QueryVersioned(ch, instance, res); exact {
		ans.remember(fp, tbl, ver, instance, salt, id, res)
	}
	hashing.ReleaseChain(ch)
}
