package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/mooncake-conductor-go/conductor/internal/hashing"
)

// engine is the kind of inference engine the fake publishers imitate. It
// decides the registration type, the hash profile and the event shape.
type engine string

const (
	engineVLLM   engine = "vllm"
	engineSGLang engine = "sglang"
	// engineVLLMStd is a vLLM publisher registered with the standard hash
	// (rfc1527): the server recomputes its keys from token ids, and
	// queries hash with XXH3 instead of SHA-256.
	engineVLLMStd engine = "vllm-rfc1527"
	// engineVLLMDefaults is a vLLM publisher at vLLM's defaults: sha256
	// (pickle) and PYTHONHASHSEED unset, registered with the root
	// "vllm-none-hash" (docs/hashing.md#vllm-algorithms).
	engineVLLMDefaults engine = "vllm-sha256"
	// engineVLLMXXHash is a vLLM publisher under --prefix-caching-hash-algo
	// xxhash with PYTHONHASHSEED=0.
	engineVLLMXXHash engine = "vllm-xxhash"
)

// hashSpec is the profile the publishers hash with; the same members go into
// the registration, so the server recomputes query hashes the same way.
func (e engine) hashSpec() hashing.Spec {
	if e == engineSGLang {
		return hashing.Spec{Strategy: "sglang", Algorithm: "sha256_raw", IndexProjection: "first64_be"}
	}
	if e == engineVLLMStd {
		return hashing.Spec{Strategy: "rfc1527", Algorithm: "xxh3_64"}
	}
	seed, alg := "0", "sha256_cbor"
	switch e {
	case engineVLLMDefaults:
		seed, alg = hashing.SeedVLLMNoneHash, hashing.AlgorithmSHA256
	case engineVLLMXXHash:
		alg = hashing.AlgorithmXXHash
	}
	return hashing.Spec{Strategy: "vllm_v1", Algorithm: alg, IndexProjection: "low64_be", PythonHashSeed: &seed}
}

// registration is the /register body for one publisher.
func (e engine) registration(endpoint, model, instance string, blockSize int) map[string]any {
	s := e.hashSpec()
	hp := map[string]any{"strategy": s.Strategy, "algorithm": s.Algorithm}
	if s.IndexProjection != "" {
		hp["index_projection"] = s.IndexProjection
	}
	if s.PythonHashSeed != nil {
		hp["python_hash_seed"] = *s.PythonHashSeed
	}
	typ := "vLLM"
	if e == engineSGLang {
		typ = "SGLang"
	}
	return map[string]any{
		"endpoint": endpoint, "type": typ, "modelname": model, "instance_id": instance,
		"block_size": blockSize, "dp_rank": 0, "hash_profile": hp,
	}
}

// vllmStored is vLLM's BlockStored as a tagged map
// (docs/events.md#vllm-events), with the keys in the order vLLM emits them. nil
// pointers encode as nil.
type vllmStored struct {
	Type        string   `msgpack:"type"`
	BlockHashes []uint64 `msgpack:"block_hashes"`
	Parent      *uint64  `msgpack:"parent_block_hash"`
	TokenIDs    []int32  `msgpack:"token_ids"`
	BlockSize   int      `msgpack:"block_size"`
	LoraID      *int     `msgpack:"lora_id"`
	Medium      string   `msgpack:"medium"`
	LoraName    *string  `msgpack:"lora_name"`
	// ExtraKeys, one nil per block, says no block has extra keys: under
	// the standard hash a block without them is not keyed (a salt may
	// have entered it unseen).
	ExtraKeys []any `msgpack:"extra_keys,omitempty"`
}

// sglangStored is SGLang's BlockStored (docs/events.md#sglang-events): hashes
// are the first 8 digest bytes as a signed int64.
type sglangStored struct {
	Type        string  `msgpack:"type"`
	BlockHashes []int64 `msgpack:"block_hashes"`
	Parent      *int64  `msgpack:"parent_block_hash"`
	TokenIDs    []int32 `msgpack:"token_ids"`
	BlockSize   int     `msgpack:"block_size"`
	LoraID      *int    `msgpack:"lora_id"`
	Medium      string  `msgpack:"medium"`
}

// encoder packs payloads as Python's msgpack does: smallest integer
// formats, float64 timestamps.
type encoder struct {
	buf bytes.Buffer
	enc *msgpack.Encoder
}

func newEncoder() *encoder {
	e := &encoder{}
	e.enc = msgpack.NewEncoder(&e.buf)
	e.enc.UseCompactInts(true)
	return e
}

func (e *encoder) encode(v any) ([]byte, error) {
	e.buf.Reset()
	if err := e.enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.Clone(e.buf.Bytes()), nil
}

// storedPayload encodes one batch envelope [ts, [BlockStored], dp_rank=0]
// for blocks keys (the chain's projected keys) covering tokens. parent is
// the key of the block before the first, if any.
func (e *encoder) storedPayload(eng engine, blockSize int, keys []uint64, parent *uint64, tokens []int32) ([]byte, error) {
	var ev any
	if eng == engineSGLang {
		h := make([]int64, len(keys))
		for i, k := range keys {
			h[i] = int64(k) // the wire form is the bit pattern as int64
		}
		var p *int64
		if parent != nil {
			v := int64(*parent)
			p = &v
		}
		ev = sglangStored{Type: "BlockStored", BlockHashes: h, Parent: p, TokenIDs: tokens, BlockSize: blockSize, Medium: "GPU"}
	} else {
		v := vllmStored{Type: "BlockStored", BlockHashes: keys, Parent: parent, TokenIDs: tokens, BlockSize: blockSize, Medium: "GPU"}
		if eng == engineVLLMStd {
			v.ExtraKeys = make([]any, len(keys))
		}
		ev = v
	}
	ts := float64(time.Now().UnixNano()) / 1e9
	return e.encode([]any{ts, []any{ev}, 0})
}

// chainKeys returns the projected key of every full block of tokens under
// profile p, computed by the same hashing package as the server: the load
// generator trusts it to produce what real engines publish (it is tested
// against vLLM and SGLang vectors there); the answers it checks do not
// depend on it.
func chainKeys(ch *hashing.Chain, p *hashing.Profile, blockSize int, tokens []int32) []uint64 {
	ch.Reset(p, blockSize, tokens, "", "")
	keys := make([]uint64, 0, len(tokens)/blockSize)
	for {
		k, covered, ok := ch.Next()
		if !ok || covered != blockSize {
			return keys
		}
		keys = append(keys, k)
	}
}

// publisher is one fake engine: a real ZMQ PUB socket bound on loopback,
// speaking the three-frame messages of docs/events.md#framing.
type publisher struct {
	idx      int
	instance string
	sock     *zmq.Socket
	endpoint string
	seq      uint64
	seqBuf   [8]byte // the sequence frame being sent
	// payloads are the corpus batches, encoded before the timed ingest so
	// that the ingest rate measures the server, not our hashing.
	payloads [][]byte
	blocks   int
	probe    []byte // a one-block store of probeTokens
	probeTok []int32
}

// newPublisher binds a PUB socket on an ephemeral loopback port. The send
// high-water mark is unlimited: a PUB drops messages silently when it is
// reached, which the server would see as a sequence gap and, without a
// replay endpoint, mark the source stale. Our corpus is bounded, so the
// queue is too.
func newPublisher(zctx *zmq.Context, idx int, instance string) (*publisher, error) {
	s, err := zctx.NewSocket(zmq.PUB)
	if err != nil {
		return nil, err
	}
	p := &publisher{idx: idx, instance: instance, sock: s}
	if err := s.SetLinger(0); err != nil {
		p.close()
		return nil, err
	}
	if err := s.SetSndhwm(0); err != nil {
		p.close()
		return nil, err
	}
	if err := s.Bind("tcp://127.0.0.1:*"); err != nil {
		p.close()
		return nil, err
	}
	if p.endpoint, err = s.GetLastEndpoint(); err != nil {
		p.close()
		return nil, err
	}
	return p, nil
}

// topic is the first frame of every message.
var topic = []byte("loadgen")

// send publishes one batch with the next sequence number. vLLM starts at 0.
// It sends the three frames one by one from buffers it owns rather than
// through SendMessage, which boxes its arguments and converts the topic
// on every call: those allocations made the load generator collect its
// large heap (the prepared corpus) during the timed ingest, taking CPU from
// the server on a small machine.
func (p *publisher) send(payload []byte) error {
	binary.BigEndian.PutUint64(p.seqBuf[:], p.seq)
	p.seq++
	if _, err := p.sock.SendBytes(topic, zmq.SNDMORE); err != nil {
		return err
	}
	if _, err := p.sock.SendBytes(p.seqBuf[:], zmq.SNDMORE); err != nil {
		return err
	}
	_, err := p.sock.SendBytes(payload, 0)
	return err
}

func (p *publisher) close() {
	if p.sock != nil {
		_ = p.sock.Close()
		p.sock = nil
	}
}

// probeTokens is publisher idx's probe prompt: one block of token ids above
// the corpus vocabulary, so it never shares a prefix with corpus prompts.
func probeTokens(idx, blockSize int, vocab int32) []int32 {
	t := make([]int32, blockSize)
	for i := range t {
		t[i] = vocab + int32(idx)
	}
	return t
}

// prepare hashes and encodes everything publisher p will send: its probe
// and its corpus placements in batches of at most batch blocks.
func (p *publisher) prepare(c *corpus, eng engine, prof *hashing.Profile, batch int) error {
	bs := c.cfg.BlockSize
	enc := newEncoder()
	ch := hashing.AcquireChain()
	defer hashing.ReleaseChain(ch)

	p.probeTok = probeTokens(p.idx, bs, c.cfg.Vocab)
	pk := chainKeys(ch, prof, bs, p.probeTok)
	var err error
	if p.probe, err = enc.storedPayload(eng, bs, pk, nil, p.probeTok); err != nil {
		return err
	}
	for _, pl := range c.perPub[p.idx] {
		toks := c.prompts[pl.prompt].tokens
		keys := chainKeys(ch, prof, bs, toks)
		if len(keys) != len(toks)/bs {
			return fmt.Errorf("prompt %d: %d keys for %d blocks", pl.prompt, len(keys), len(toks)/bs)
		}
		for b := pl.firstNew; b < len(keys); b += batch {
			end := min(b+batch, len(keys))
			var parent *uint64
			if b > 0 {
				parent = &keys[b-1]
			}
			msg, err := enc.storedPayload(eng, bs, keys[b:end], parent, toks[b*bs:end*bs])
			if err != nil {
				return err
			}
			p.payloads = append(p.payloads, msg)
			p.blocks += end - b
		}
	}
	return nil
}
