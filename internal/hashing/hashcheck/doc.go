// Package hashcheck tells an operator when an engine and the conductor hash
// blocks differently, the usual reason for queries that find nothing.
//
// vLLM and SGLang BlockStored events carry each stored block's token ids
// next to its published hash. When the event also says enough about the
// block's parent (it starts a chain, or names its parent by full digest,
// or names a parent this checker verified earlier), the block can be
// hashed again under the registered profile and compared: a match means
// queries will find the engine's blocks, a mismatch that they never will
// (a different PYTHONHASHSEED, hash algorithm, LoRA name, salt handling or
// block size on one side).
//
// Hashing every block would cost about as much as ingesting it, so a
// Checker samples: every block of a service's first Warmup checks, then
// about one block in Every, chosen by a counter (deterministic, no
// randomness). It counts matches and mismatches per service and, on a
// service's first mismatch, logs one warning naming the likely causes.
//
// # What an event allows
//
// The published hash and the index key relate through the profile's
// index_projection: vLLM publishes the low 64 bits of the digest (32
// bytes, or 16 under xxhash and xxhash_cbor) as an unsigned integer
// (low64_be) or, with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0, the whole
// digest as bytes; SGLang
// publishes the first 64 bits as a signed integer (first64_be). A block is
// hashed from its parent's full digest, never from the 64-bit key, so:
//
//   - a block whose parent is nil starts a chain: it is hashed from the
//     profile's root (vLLM) or the salt seed (SGLang);
//   - a parent published as a full digest of the registered algorithm's
//     size is used as it is;
//   - a parent published as an integer is usable only if this checker
//     verified that block earlier and still remembers its digest;
//   - within one event, a block's parent is the block before it, whose
//     digest is known once it was checked and matched (or published in
//     full).
//
// Everything else is skipped, never guessed, so a mismatch is always a
// real disagreement between engine and profile.
package hashcheck
