package codec

import (
	"github.com/mooncake-conductor-go/conductor/internal/msgp"
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

// hashListNames are the names the hash list is accepted under, each with
// its fieldSet bit: the contract's seq_hashes, the earlier drafts'
// block_hash, and block_hashes, the member name of Dynamo's standalone
// indexer (docs/api.md#post-query_by_hash). At most one may be given.
var hashListNames = [...]struct {
	name string
	bit  int
}{{"seq_hashes", hqSeqHashes}, {"block_hash", hqBlockHash}, {"block_hashes", hqBlockHashes}}

// hashListBit is the fieldSet bit of list name k, or -1 when k is not
// one of hashListNames.
func hashListBit(k []byte) int {
	for _, n := range hashListNames {
		if string(k) == n.name {
			return n.bit
		}
	}
	return -1
}

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
	members := contextMembers{&q.Model, &q.LoraName, &q.TenantID, &q.InstanceID, &q.CacheSalt, &q.BlockSize}
	var seen fieldSet
	hasLoraID := false
	for i := 0; i < n; i++ {
		k, e := c.key("")
		if e != nil {
			return e
		}
		if shared, e := members.decode(&c, k, &seen, lim); shared {
			if e != nil {
				return e
			}
			continue
		}
		switch string(k) {
		case "lora_id":
			// RFC #1403 names the adapter by id as well; the context is
			// selected by lora_name, so an id is accepted only beside it
			// and not interpreted.
			if e = seen.mark(hqLoraID, "lora_id"); e == nil {
				if c.Kind() == msgp.Nil {
					e = c.nilValue()
					break
				}
				_, e = c.intField("lora_id", 0, maxInt32)
				hasLoraID = true
			}
		case "seq_hashes", "block_hash", "block_hashes":
			bit := hashListBit(k)
			if q.Field != "" && q.Field != string(k) {
				// The same name twice is mark's "appears more than
				// once"; two names is this, naming the second one given.
				return Errorf(InvalidValue, string(k), "%s and %s name the same list; give only one of seq_hashes, block_hash and block_hashes", q.Field, string(k))
			}
			if e = seen.mark(bit, string(k)); e == nil {
				q.Field = hashListNames[bit-hqSeqHashes].name
				e = decodeHashList(&c, q.Field, lim, q)
			}
		default:
			return Errorf(UnknownField, string(k), "unknown field %q", string(k))
		}
		if e != nil {
			return e
		}
	}
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
