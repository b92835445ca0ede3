package hashing

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Engines publish block hashes in several wire forms; these functions map each
// to the index key the chain computes, per docs/hashing.md#wire-forms and
// docs/events.md#block-hash-forms. Every error names the form and the reason,
// because event ingestion counts and reports them as rejections.

// ErrUnknownProjection is returned for a Projection that is neither Low64BE
// nor First64BE (for example from a zero Profile).
var ErrUnknownProjection = errors.New("hashing: unknown index projection")

// KeyFromUint maps an unsigned wire integer. vLLM publishes the low 64 bits
// as an unsigned int, so the value is the key. SGLang publishes signed int64,
// so an unsigned value above 2^63−1 cannot come from SGLang and is rejected.
func KeyFromUint(p Projection, u uint64) (uint64, error) {
	switch p {
	case Low64BE:
		return u, nil
	case Native:
		return u, nil
	case First64BE:
		if u > 1<<63-1 {
			return 0, fmt.Errorf("hashing: unsigned block hash %d exceeds int64 range of first64_be (SGLang) hashes", u)
		}
		return u, nil
	}
	return 0, fmt.Errorf("%w %d", ErrUnknownProjection, p)
}

// KeyFromInt maps a signed wire integer. SGLang publishes the first 8 digest
// bytes as a signed int64, whose two's-complement bit pattern is the key.
// Current vLLM never emits negative ints (very old releases hashed with
// Python's hash()), so a negative value is rejected for Low64BE; a
// non-negative one is decoded by value whatever its msgpack format.
func KeyFromInt(p Projection, s int64) (uint64, error) {
	switch p {
	case Low64BE:
		if s < 0 {
			return 0, fmt.Errorf("hashing: negative block hash %d is not a low64_be (vLLM) hash", s)
		}
		return uint64(s), nil
	case First64BE:
		return uint64(s), nil
	case Native:
		// A signed form of an unsigned key cannot be told from a
		// negative mistake; the standard's keys are unsigned.
		if s < 0 {
			return 0, fmt.Errorf("hashing: negative block hash %d is not an rfc1527 key", s)
		}
		return uint64(s), nil
	}
	return 0, fmt.Errorf("%w %d", ErrUnknownProjection, p)
}

// KeyFromBytes maps a binary block hash, as vLLM publishes with
// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0 (the full digest): the last 8 bytes
// big-endian for Low64BE, the first 8 for First64BE. Fewer than 8 bytes
// cannot carry a key and are rejected.
func KeyFromBytes(p Projection, b []byte) (uint64, error) {
	if p == Native {
		if len(b) != 8 {
			return 0, fmt.Errorf("hashing: binary rfc1527 key of %d bytes, want 8", len(b))
		}
		return binary.BigEndian.Uint64(b), nil
	}
	if p != Low64BE && p != First64BE {
		return 0, fmt.Errorf("%w %d", ErrUnknownProjection, p)
	}
	if len(b) < 8 {
		return 0, fmt.Errorf("hashing: binary block hash of %d bytes is shorter than 8", len(b))
	}
	if p == Low64BE {
		return binary.BigEndian.Uint64(b[len(b)-8:]), nil
	}
	return binary.BigEndian.Uint64(b[:8]), nil
}

// KeyFromHex maps the hex digest found in a Mooncake object key or a
// connector_block_hash. Hex is case-insensitive and may carry a 0x prefix.
// For Low64BE (vLLM / vLLM-Ascend keys: BlockHash.hex(), 64 or 32 digits)
// the text must have an even number ≥ 16 of digits and the key is the last
// 16. For First64BE (SGLang HiCache keys) it must be exactly 64 digits, a
// SHA-256 page hash, and the key is the first 16.
func KeyFromHex(p Projection, h string) (uint64, error) {
	s := h
	if len(s) >= 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X') {
		s = s[2:]
	}
	var digits string
	switch p {
	case Low64BE:
		if len(s) < 16 || len(s)%2 != 0 {
			return 0, fmt.Errorf("hashing: hex block hash has %d digits, want an even number of at least 16", len(s))
		}
		digits = s[len(s)-16:]
	case First64BE:
		if len(s) != 64 {
			return 0, fmt.Errorf("hashing: hex page hash has %d digits, want 64", len(s))
		}
		digits = s[:16]
	default:
		return 0, fmt.Errorf("%w %d", ErrUnknownProjection, p)
	}
	// Every digit is validated, including those that do not reach the key.
	for i := 0; i < len(s); i++ {
		if hexVal(s[i]) > 15 {
			return 0, fmt.Errorf("hashing: invalid hex digit %q at offset %d of block hash", s[i], i+len(h)-len(s))
		}
	}
	var k uint64
	for i := 0; i < 16; i++ {
		k = k<<4 | uint64(hexVal(digits[i]))
	}
	return k, nil
}

func hexVal(c byte) byte {
	switch {
	case c >= '0' && c <= '9':
		return c - '0'
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10
	}
	return 0xff
}
