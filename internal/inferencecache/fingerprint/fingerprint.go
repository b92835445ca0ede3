// Package fingerprint derives the block-key chain that InferenceCache's
// vLLM and SGLang event sidecars report for a prompt's token ids, so a
// gateway can send token ids and be matched against chains producers
// reported under the producer schemes "vllm" and "sglang".
//
// Each full block of BlockSize ids gets a content hash, XXH3-64 with seed
// 1337 over the ids as little-endian uint32; the key of block 0 is its
// content hash (or, given a parent key, chained like any later block), and
// the key of block i is XXH3-64 with seed 1337 over the previous key and the
// content hash, both little-endian uint64. A trailing partial block has no
// key. Keys travel as 8 bytes big-endian.
package fingerprint

import (
	"encoding/binary"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// Seed is the XXH3 seed of every hash in the scheme.
const Seed = 1337

// DefaultBlockSize is the block size the sidecars use unless configured.
const DefaultBlockSize = 16

// littleEndian reports whether uint32 slices are already laid out as the
// scheme's little-endian bytes, so they can be hashed in place.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// Chain appends to dst the prefix key of every full block of tokens and
// returns it. With parent non-nil, block 0 chains from *parent instead of
// starting the chain. blockSize must be positive.
func Chain(dst []uint64, tokens []uint32, blockSize int, parent *uint64) []uint64 {
	if blockSize <= 0 {
		return dst
	}
	n := len(tokens) / blockSize
	var scratch []byte
	if !littleEndian {
		scratch = make([]byte, 4*blockSize)
	}
	var prev uint64
	have := parent != nil
	if have {
		prev = *parent
	}
	for i := range n {
		c := Content(tokens[i*blockSize:(i+1)*blockSize], scratch)
		if have {
			prev = Link(prev, c)
		} else {
			prev, have = c, true
		}
		dst = append(dst, prev)
	}
	return dst
}

// Content is one block's content hash. scratch, used only on big-endian
// machines, must hold 4*len(block) bytes there.
func Content(block []uint32, scratch []byte) uint64 {
	if len(block) == 0 {
		return xxh3.HashSeed(nil, Seed)
	}
	if littleEndian {
		return xxh3.HashSeed(unsafe.Slice((*byte)(unsafe.Pointer(&block[0])), 4*len(block)), Seed)
	}
	for i, t := range block {
		binary.LittleEndian.PutUint32(scratch[4*i:], t)
	}
	return xxh3.HashSeed(scratch[:4*len(block)], Seed)
}

// Link chains a block's content hash onto the previous block's prefix key.
func Link(prev, content uint64) uint64 {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], prev)
	binary.LittleEndian.PutUint64(b[8:], content)
	return xxh3.HashSeed(b[:], Seed)
}

// Wire is a key as the contract carries it: 8 bytes big-endian.
func Wire(key uint64) []byte { return binary.BigEndian.AppendUint64(nil, key) }
