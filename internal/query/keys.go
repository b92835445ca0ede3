package query

import (
	"fmt"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
)

// KeysRequest is a lookup by the prompt's block hashes instead of its
// tokens (/query_by_hash, docs/api.md#post-query_by_hash): entry i is block
// i's hash as the context's publishers send it, an unsigned integer or a
// raw digest, projected by the context's profile. The server hashes
// nothing.
type KeysRequest struct {
	Context   index.ContextKey
	Instance  string
	CacheSalt string
	// Field names the list in errors (seq_hashes or block_hash).
	Field string
	// Values are the integer entries; Raw[i], when Raw is not nil and
	// Raw[i] is not, is entry i's binary form instead.
	Values []uint64
	Raw    [][]byte
}

// EntryError is a refused entry of a KeysRequest's list: a binary the
// context's projection cannot read. Nothing has been changed.
type EntryError struct {
	Field string
	Index int
	Msg   string
}

func (e *EntryError) Error() string { return fmt.Sprintf("%s[%d]: %s", e.Field, e.Index, e.Msg) }

// LookupKeys answers req into res with /query's rules: the same owners,
// tiers, instance filter and hybrid layouts, each entry covering one hash
// block. It reports whether req's context exists; the error is an *Error
// or an *EntryError.
func (e *Engine) LookupKeys(req *KeysRequest, res *Result) (known bool, err error) {
	ctx, err := e.check(&Request{Context: req.Context})
	if err != nil {
		return false, err
	}
	if n := len(req.Values); int64(n)*int64(ctx.BlockSize) > int64(e.opts.MaxTokens) {
		return false, &Error{OutOfRange, req.Field, fmt.Sprintf("%s has %d blocks of %d tokens, the limit is %d tokens", req.Field, n, ctx.BlockSize, e.opts.MaxTokens)}
	}
	res.Instances = res.Instances[:0]
	c := e.opts.Contexts.Get(ctx)
	if c == nil {
		return false, nil
	}
	tbl, p := c.Table, &c.Profile
	proj := p.Projection()
	keys := req.Values
	for i, raw := range req.Raw {
		if raw == nil {
			continue
		}
		k, err := hashing.KeyFromBytes(proj, raw)
		if err != nil {
			return true, &EntryError{req.Field, i, err.Error()}
		}
		keys[i] = k
	}
	if p.IsStandard() && req.CacheSalt != "" {
		// As /query: the standard hash has no salt, and a salted
		// request matches no block (docs/hashing.md#standard-hash-rfc1527).
		keys = nil
	}
	ch := keysChain{keys: keys, bs: ctx.BlockSize}
	tbl.Query(&ch, req.Instance, res)
	return true, nil
}

// keysChain is an index.BatchChain over given keys: every key is ready, and
// covers one block.
type keysChain struct {
	keys []uint64
	bs   int
	i    int
}

func (c *keysChain) Next() (uint64, int, bool) {
	if c.i >= len(c.keys) {
		return 0, 0, false
	}
	c.i++
	return c.keys[c.i-1], c.bs, true
}

func (c *keysChain) Ready() int { return len(c.keys) - c.i }

func (c *keysChain) TakeReady(n int, keys []uint64, covs []int, hints []uint32) ([]uint64, []int, []uint32) {
	n = min(n, len(c.keys)-c.i)
	keys = append(keys, c.keys[c.i:c.i+n]...)
	for range n {
		covs = append(covs, c.bs)
		hints = append(hints, 0)
	}
	c.i += n
	return keys, covs, hints
}
