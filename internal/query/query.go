// Package query is the lookup engine: given a context, token ids and an
// optional instance filter, it hashes the prompt's blocks and walks them
// against the index, and returns per-owner tier counts. It owns the whole
// sequence (the pooled key chain with the prefix memo and the verified
// links, the walk and the chain's release) and the caches it uses, so the
// HTTP door and the gRPC door call one Engine instead of repeating it. It
// knows no wire format and keeps nothing for a door: each door decodes
// its own requests (codec for /query) and hands over decoded ones.
package query

import (
	"fmt"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/contexts"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
)

// DefaultMaxTokens bounds a request's token ids unless Options say
// otherwise (the /query contract's limit, docs/api.md).
const DefaultMaxTokens = 2 << 20

// Options configure an Engine.
type Options struct {
	// Contexts is where a request's context is found: its table and the
	// profile its tokens are hashed with.
	Contexts *contexts.Catalogue
	// MaxTokens bounds a request's token ids (DefaultMaxTokens if 0).
	MaxTokens int
	// Memo, when set, lets warm lookups skip SHA-256 for blocks seen
	// before; answers are identical either way.
	Memo *hashing.Memo
	// Links, when set, lets lookups take the digests of blocks ingest
	// verified instead of computing SHA-256; answers are identical
	// either way.
	Links *hashing.Links
}

// Engine answers lookups for both doors and owns the caches that serve
// them: the prefix memo and the verified links. Forget is the one way they
// are forgotten. What a door keeps beside it (the token memo) is the
// door's, and its owner's to forget. It holds no per-request state and is
// safe for concurrent use.
type Engine struct {
	opts Options
}

// New returns an engine over opts.Contexts.
func New(opts Options) *Engine {
	if opts.MaxTokens <= 0 {
		opts.MaxTokens = DefaultMaxTokens
	}
	return &Engine{opts: opts}
}

// Memo is the engine's prefix memo (nil when off), for its metrics.
func (e *Engine) Memo() *hashing.Memo { return e.opts.Memo }

// Links is the engine's verified links (nil when off), for its metrics
// and for ingest, which fills them.
func (e *Engine) Links() *hashing.Links { return e.opts.Links }

// Forget drops what the caches remember once no context is left for them
// to answer about: their budgets would otherwise stay resident for an
// empty index. The service calls it whenever a context goes.
func (e *Engine) Forget() {
	if e.opts.Contexts.Len() > 0 {
		return
	}
	e.opts.Memo.Reset()
	e.opts.Links.Reset()
}

// Request is one lookup with its token ids already decoded.
type Request struct {
	// Context selects the table; an unknown context answers no owners.
	// An empty tenant is the default one.
	Context index.ContextKey
	// Instance, when not "", restricts the answer to that instance.
	Instance  string
	CacheSalt string
	// Tokens are read, never modified, and not kept past the call unless
	// Shared.
	Tokens []int32
	// Shared says Tokens are never modified by anyone and may be kept by
	// the prefix memo without a copy (a token memo's remembered array).
	Shared bool
}

// Result is the per-owner answer: instances sorted by id, each with its
// ranks' cumulative tier counts. Reuse one Result across lookups (one at a
// time) so that a warm lookup allocates nothing.
type Result = index.QueryResult

// Reason is the closed set of ways a request can be invalid.
type Reason uint8

const (
	// Missing: a required field is absent.
	Missing Reason = iota + 1
	// InvalidValue: a field's value is not allowed.
	InvalidValue
	// OutOfRange: a field is over its limit.
	OutOfRange
)

// Error is a refused lookup: the request breaks a rule, named by Reason
// and the request field. Nothing has been changed when one is returned.
type Error struct {
	Reason Reason
	Field  string
	Msg    string
}

func (e *Error) Error() string { return e.Field + ": " + e.Msg }

// Lookup answers req into res, the one call a door makes per request: it
// checks what a decoder would have (a model, a positive block size, the
// token limit), finds the context req names (an empty tenant being the
// default one) and, when it exists, hashes the prompt's blocks and walks
// its table. known says whether the context exists (a door's token memo
// learns only bodies that name one); a context nobody registered answers
// no owners. The error, if any, is an *Error, and res is then untouched.
func (e *Engine) Lookup(req *Request, res *Result) (known bool, err error) {
	ctx, err := e.check(req)
	if err != nil {
		return false, err
	}
	c := e.opts.Contexts.Get(ctx)
	e.lookupIn(c, req, res)
	return c != nil, nil
}

// lookupIn answers req into res from c (nil: no owners).
func (e *Engine) lookupIn(c *contexts.Entry, req *Request, res *Result) {
	res.Instances = res.Instances[:0]
	if c == nil {
		return
	}
	e.walk(c, req.Tokens, req.Shared, req.Context.Lora, req.CacheSalt, req.Instance, res)
}

// LookupFound answers req into res from c, a context the door found
// itself (the gRPC door matches a hash scheme against every registered
// context): the rules Lookup applies hold, and the catalogue is not read
// a second time.
func (e *Engine) LookupFound(c *contexts.Entry, req *Request, res *Result) error {
	if _, err := e.check(req); err != nil {
		return err
	}
	e.lookupIn(c, req, res)
	return nil
}

// walk hashes tokens lazily under the context's profile and walks its
// table.
// shared says tokens are never modified and may be kept by the memos
// without a copy.
func (e *Engine) walk(c *contexts.Entry, tokens []int32, shared bool, lora, salt, instance string, res *Result) {
	ch := hashing.AcquireChain()
	ch.Reset(&c.Profile, c.Table.Context().BlockSize, tokens, lora, salt)
	if shared {
		ch.KeepTokens()
	}
	ch.UseMemo(e.opts.Memo)
	ch.UseLinks(e.opts.Links)
	c.Table.Query(ch, instance, res)
	hashing.ReleaseChain(ch)
}

// check applies the rules every request passes and returns its context,
// the default tenant filled in.
func (e *Engine) check(req *Request) (index.ContextKey, error) {
	switch {
	case req.Context.Model == "":
		return index.ContextKey{}, &Error{Missing, "model", "model is required"}
	case req.Context.BlockSize <= 0:
		return index.ContextKey{}, &Error{InvalidValue, "block_size", "block_size must be positive"}
	case len(req.Tokens) > e.opts.MaxTokens:
		return index.ContextKey{}, &Error{OutOfRange, "token_ids", fmt.Sprintf("token_ids has %d tokens, the limit is %d", len(req.Tokens), e.opts.MaxTokens)}
	}
	ctx := req.Context
	if ctx.Tenant == "" {
		ctx.Tenant = index.DefaultTenant
	}
	return ctx, nil
}
