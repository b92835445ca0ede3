package memostore

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestSpanFingerprints: one fingerprint per 256·2^j-byte span within the
// limit, then the locator; runs sharing a span share its fingerprint and
// all before it, and the locator tells whole runs apart.
func TestSpanFingerprints(t *testing.T) {
	run := make([]byte, 3000)
	for i := range run {
		run[i] = byte(i * 7)
	}
	for _, c := range []struct{ n, limit, want int }{
		{255, 255, 0}, {256, 256, 2}, {3000, 3000, 5}, {3000, 600, 3}, {3000, 100, 0}, {600, 5000, 3},
	} {
		if got := len(SpanFingerprints(run[:c.n], c.limit, nil)); got != c.want {
			t.Errorf("%d bytes, limit %d: %d fingerprints, want %d", c.n, c.limit, got, c.want)
		}
	}
	a := SpanFingerprints(run, len(run), nil)
	other := append([]byte(nil), run...)
	other[2000] ^= 1 // inside the 2048-byte span's window (its last 64 bytes)
	b := SpanFingerprints(other, len(other), nil)
	if !cmp.Equal(a[:3], b[:3]) || a[3] == b[3] || a[4] == b[4] {
		t.Errorf("spans to 1024 bytes should agree, the 2048-byte one and the locator differ:\n%x\n%x", a, b)
	}
	if c := SpanFingerprints(run[:2999], 2999, nil); !cmp.Equal(a[:4], c[:4]) || a[4] == c[4] {
		t.Errorf("a shorter run shares the spans, not the locator:\n%x\n%x", a, c)
	}
}

// TestSpansWithinAndChunks: the spans an entry of n bytes lies over, and
// the chunks inside a common prefix.
func TestSpansWithinAndChunks(t *testing.T) {
	for _, c := range []struct{ n, nfps, want int }{
		{255, 5, 0}, {256, 5, 1}, {511, 5, 1}, {1024, 5, 3}, {1 << 20, 5, 4}, {1 << 20, 1, 0},
	} {
		if got := SpansWithin(c.n, c.nfps); got != c.want {
			t.Errorf("SpansWithin(%d, %d) = %d, want %d", c.n, c.nfps, got, c.want)
		}
	}
	ends := []uint32{100, 200, 300}
	for _, c := range []struct{ common, want int }{{0, 0}, {99, 0}, {100, 1}, {299, 2}, {300, 3}, {1000, 3}} {
		if got := ChunksWithin(ends, c.common); got != c.want {
			t.Errorf("ChunksWithin(%v, %d) = %d, want %d", ends, c.common, got, c.want)
		}
	}
}

// TestExtends: long extends short exactly when short is its prefix.
func TestExtends(t *testing.T) {
	for _, c := range []struct {
		long, short string
		want        bool
	}{
		{"abc", "", true}, {"abc", "ab", true}, {"abc", "abc", true}, {"abc", "abcd", false},
		{"abc", "xb", false}, {"abc", "ac", false}, {"", "", true},
	} {
		if got := Extends([]byte(c.long), []byte(c.short)); got != c.want {
			t.Errorf("Extends(%q, %q) = %v, want %v", c.long, c.short, got, c.want)
		}
	}
}
