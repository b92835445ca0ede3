package query

import (
	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
)

// Explanation is, for one prompt, the block keys computed and, per owner,
// where its cached run stopped and why; see Engine.Explain.
type Explanation struct {
	// ContextKnown is false when no service registered the query's
	// context (tenant, model, LoRA, block size): no profile to hash with,
	// so no blocks and no owners, the commonest cause of zero hits.
	ContextKnown bool
	Blocks       []index.ExplainedBlock
	Owners       []index.OwnerRun
}

// Explain explains the answer Lookup gives req. Unlike Lookup it hashes
// the whole prompt, neither reads nor teaches the caches (so what it
// shows is computed afresh, and explaining a prompt leaves no trace), and
// allocates freely: it is for operators. The counts it reports per owner
// are those Lookup answers. The error, if any, is an *Error.
func (e *Engine) Explain(req *Request) (*Explanation, error) {
	ctx, err := e.check(req)
	if err != nil {
		return nil, err
	}
	x := &Explanation{}
	c := e.opts.Contexts.Get(ctx)
	if c == nil {
		return x, nil
	}
	tbl := c.Table
	x.ContextKnown = true
	ch := hashing.AcquireChain()
	ch.Reset(&c.Profile, ctx.BlockSize, req.Tokens, ctx.Lora, req.CacheSalt)
	var keys []uint64
	var tokens []int
	total := 0
	for {
		k, covered, ok := ch.Next()
		if !ok {
			break
		}
		total += covered
		keys, tokens = append(keys, k), append(tokens, total)
	}
	hashing.ReleaseChain(ch)
	x.Blocks, x.Owners = tbl.Explain(keys, tokens, req.Instance)
	return x, nil
}
