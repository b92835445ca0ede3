package codec

import (
	"github.com/mooncake-conductor-go/conductor/internal/msgp"
	"github.com/mooncake-conductor-go/conductor/internal/reqfields"
)

// HashQueryRequest is a validated /query_by_hash body
// (docs/api.md#post-query_by_hash). Its strings and Raw views are valid
// only while the body is; Entries is reused across decodes.
type HashQueryRequest struct {
	Model      string
	LoraName   string
	TenantID   string
	InstanceID string
	CacheSalt  string
	BlockSize  int
	// Field is the name the list came under: seq_hashes, the earlier
	// drafts' block_hash, or block_hashes (Dynamo's standalone indexer).
	Field string
	// Values holds the integer entries (0 where an entry is binary);
	// Raw, nil when no entry is binary, holds entry i's binary (a view
	// into the body) at Raw[i]. A binary is projected to its index key
	// only once the context, and so its projection, is known.
	Values []uint64
	Raw    [][]byte
}

const (
	hqSeqHashes = ctxMembers + iota
	hqBlockHash
	hqBlockHashes
	hqLoraID
)

// hashQueryTable is a /query_by_hash body's members. The hash list is
// accepted under three names, each its own member and fieldSet bit: the
// contract's seq_hashes, the earlier drafts' block_hash, and block_hashes,
// the member name of Dynamo's standalone indexer
// (docs/api.md#post-query_by_hash); at most one may be given, so they are
// read by DecodeHashQuery itself. The specs follow contextSpecs' in the
// order of their bits.
var hashQueryTable = reqfields.NewTable("", false, contextSpecs(
	reqfields.Spec{Name: "seq_hashes", Shape: reqfields.Own},
	reqfields.Spec{Name: "block_hash", Shape: reqfields.Own},
	reqfields.Spec{Name: "block_hashes", Shape: reqfields.Own},
	// RFC #1403 names the adapter by id as well; the context is selected
	// by lora_name, so an id is accepted only beside it (checked below)
	// and not kept.
	reqfields.Spec{Name: "lora_id", Shape: reqfields.OptInt, Min: 0, Max: maxInt32, Slot: reqfields.NoSlot},
))

// DecodeHashQuery decodes a /query_by_hash body under its schema: /query's
// members with seq_hashes (or block_hash, or block_hashes; one of them)
// in place of token_ids. The list counts against MaxTokens in blocks: entries ×
// block_size may not exceed it.
func DecodeHashQuery(body []byte, lim Limits, q *HashQueryRequest) *Error {
	*q = HashQueryRequest{Values: q.Values[:0]}
	c, n, e := open(body)
	if e != nil {
		return e
	}
	var seen fieldSet
	var v reqfields.Values
	lims := byteLimits(lim)
	for {
		id, e := hashQueryTable.Next(&c.Cursor, &n, &seen.FieldSet, &v, &lims)
		if e != nil {
			return e
		}
		if id == reqfields.Done {
			break
		}
		// One of the hash list's names, the members with rules of their own.
		name := hashQueryTable.Field(id)
		if q.Field != "" && q.Field != name {
			// The same name twice is Mark's "appears more than
			// once"; two names is this, naming the second one given.
			return Errorf(InvalidValue, name, "%s and %s name the same list; give only one of seq_hashes, block_hash and block_hashes", q.Field, name)
		}
		if e = seen.mark(id, name); e == nil {
			q.Field = name
			e = decodeHashList(&c, q.Field, lim, q)
		}
		if e != nil {
			return e
		}
	}
	contextValues(&v, &q.Model, &q.LoraName, &q.TenantID, &q.InstanceID, &q.CacheSalt, &q.BlockSize)
	hasLoraID := v.Given.Has(hqLoraID)
	switch {
	case !seen.has(ctxModel):
		return Errorf(Missing, "model", "model is required")
	case !seen.has(ctxBlockSize):
		return Errorf(Missing, "block_size", "block_size is required")
	case q.Field == "":
		return Errorf(Missing, "seq_hashes", "seq_hashes is required")
	case q.Model == "":
		return Errorf(InvalidValue, "model", "model must not be empty")
	case hasLoraID && q.LoraName == "":
		// An adapter named by id alone would select the base model's
		// context: refused rather than answered for the wrong model.
		return Errorf(InvalidValue, "lora_id", "lora_id needs lora_name, which selects the context")
	case int64(len(q.Values))*int64(q.BlockSize) > int64(lim.MaxTokens):
		return Errorf(OutOfRange, q.Field, "%s has %d blocks of %d tokens, the limit is %d tokens", q.Field, len(q.Values), q.BlockSize, lim.MaxTokens)
	}
	if q.TenantID == "" {
		q.TenantID = DefaultTenant
	}
	return nil
}

// decodeHashList reads the list: unsigned integers or binaries, nothing
// else.
func decodeHashList(c *cursor, field string, lim Limits, q *HashQueryRequest) *Error {
	if k := c.Kind(); k != msgp.Array {
		return Errorf(InvalidType, field, "%s must be an array of unsigned integers or binaries, got %s", field, k)
	}
	n, err := c.ArrayLen()
	if err != nil {
		return errUnchecked
	}
	if n > lim.MaxTokens {
		// Every block covers at least one token.
		return Errorf(OutOfRange, field, "%s has %d blocks, the limit is %d tokens", field, n, lim.MaxTokens)
	}
	for i := 0; i < n; i++ {
		switch k := c.Kind(); k {
		case msgp.Int:
			u, neg := c.int()
			if neg {
				return elemErrorf(InvalidValue, field, i, "%s[%d] is negative; entries are unsigned 64-bit keys", field, i)
			}
			q.Values = append(q.Values, u)
		case msgp.Bin:
			b, err := c.Str()
			if err != nil {
				return errUnchecked
			}
			if len(b) == 0 {
				return elemErrorf(InvalidValue, field, i, "%s[%d] is an empty binary", field, i)
			}
			if q.Raw == nil {
				q.Raw = make([][]byte, n)
			}
			q.Raw[i] = b
			q.Values = append(q.Values, 0)
		default:
			if err := c.Skip(); err != nil {
				return errUnchecked
			}
			return elemErrorf(InvalidType, field, i, "%s[%d] must be an unsigned integer or a binary, got %s", field, i, k)
		}
	}
	return nil
}
