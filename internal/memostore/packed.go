package memostore

import (
	"encoding/binary"
	"sort"

	"github.com/cespare/xxhash/v2"
)

// What follows serves the token memo (tokenmemo), which remembers decoded
// token arrays by their packed bytes, MessagePack arrays (/query) and
// protobuf packed varints (LookupRoute). Both encodings delimit each id,
// so equal leading bytes in one format are equal leading ids; each door
// keeps its own decoder.

const (
	// Chunk is how many ids lie between the byte offsets an entry
	// records: the granularity at which a partly shared prefix is reused.
	Chunk = 64
	// FirstSpan is the packed length of the shallowest fingerprinted
	// span; each further one covers twice as much. Shorter arrays decode
	// faster than a memo lookup.
	FirstSpan = 256
	// spanWindow is how many bytes at the end of each span its
	// fingerprint reads.
	spanWindow = 64
)

// SpanFingerprints appends the fingerprints of b's first 256, 512, …
// bytes, for spans ending within limit (at most len(b)), then, if there
// were any, the locator: a fingerprint of all of b. An entry is filed
// under the spans inside it (SpansWithin) and the locator of the query it
// was learned from (FiledUnder), so the same query finds it again even
// when every span it covers is shared by many prompts (a long system
// prompt before a short question), whose buckets keep only their newest
// entries.
//
// A fingerprint reads only the last spanWindow bytes of its span, chained
// to the fingerprint before it, so the cost is the same for an 8K array as
// for a short one. Spans differing only between windows share a
// fingerprint; that costs a wasted comparison, never a wrong id, since
// candidates are verified byte for byte (CommonPrefix).
func SpanFingerprints(b []byte, limit int, dst []uint64) []uint64 {
	limit = min(limit, len(b))
	var fp uint64
	var buf [8 + spanWindow]byte
	spans := 0
	for l := FirstSpan; l <= limit; l *= 2 {
		binary.LittleEndian.PutUint64(buf[:8], fp)
		copy(buf[8:], b[l-spanWindow:l])
		fp = xxhash.Sum64(buf[:])
		dst = append(dst, fp)
		spans++
	}
	if spans > 0 {
		binary.LittleEndian.PutUint64(buf[:8], fp)
		copy(buf[8:], b[len(b)-spanWindow:])
		dst = append(dst, xxhash.Sum64(buf[:]))
	}
	return dst
}

// SpansWithin is how many of a query's span fingerprints (nfps in all,
// locator included, as SpanFingerprints returns them) are of spans within
// its first n packed bytes: those an entry of n bytes is filed under,
// besides the locator.
func SpansWithin(n, nfps int) int {
	k := 0
	for l := FirstSpan; l <= n && k < nfps-1; l *= 2 {
		k++
	}
	return k
}

// ChunksWithin is how many leading chunks of an entry lie wholly within
// the common bytes it shares with a query; ends[j] is the offset just past
// the entry's id (j+1)·Chunk−1.
func ChunksWithin(ends []uint32, common int) int {
	return sort.Search(len(ends), func(j int) bool { return int(ends[j]) > common })
}

// Extends reports whether long begins with all of short, so an entry of
// long holds everything one of short does. Entries sharing a system prompt
// part after it: comparing the last byte first spares most of them a scan
// of the common prefix.
func Extends(long, short []byte) bool {
	n := len(short)
	return n <= len(long) && (n == 0 || long[n-1] == short[n-1]) && string(long[:n]) == string(short)
}
