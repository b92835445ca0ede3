package query

import (
	"github.com/mooncake-conductor-go/conductor/codec"
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

// ExplainBody decodes a /query body and explains its answer. Unlike
// LookupBody it hashes the whole prompt, neither reads nor teaches the
// memos (so what it shows is computed afresh, and explaining a prompt
// leaves no trace), and allocates freely: it is for operators. The counts
// it reports per owner are those /query answers.
func (e *Engine) ExplainBody(body []byte) (*Explanation, error) {
	var q codec.QueryRequest
	if d := codec.DecodeQuery(body, e.opts.Limits, &q); d != nil {
		return nil, invalid(d)
	}
	x := &Explanation{}
	tbl := e.opts.Index.Table(index.ContextKey{Tenant: q.TenantID, Model: q.Model, Lora: q.LoraName, BlockSize: q.BlockSize})
	if tbl == nil {
		return x, nil
	}
	x.ContextKnown = true
	ch := hashing.AcquireChain()
	ch.Reset(tbl.Profile(), q.BlockSize, q.Tokens, q.LoraName, q.CacheSalt)
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
	x.Blocks, x.Owners = tbl.Explain(keys, tokens, q.InstanceID)
	return x, nil
}
