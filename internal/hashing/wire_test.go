package hashing

import (
	"errors"
	"math"
	"strings"
	"testing"
)

func TestKeyFromWire(t *testing.T) {
	digest := "c9d58ba695280d69b243e1e0df813136ca9196b286fb1a021e0b2e028ef071cb"
	tests := []struct {
		name string
		f    func() (uint64, error)
		want uint64
		err  string // substring; "" means success
	}{
		{"uint low64 max", func() (uint64, error) { return KeyFromUint(Low64BE, math.MaxUint64) }, math.MaxUint64, ""},
		{"uint first64 max int64", func() (uint64, error) { return KeyFromUint(First64BE, math.MaxInt64) }, math.MaxInt64, ""},
		{"uint first64 above int64", func() (uint64, error) { return KeyFromUint(First64BE, 1<<63) }, 0, "exceeds int64"},
		{"uint unknown projection", func() (uint64, error) { return KeyFromUint(0, 1) }, 0, "unknown index projection"},
		{"int low64 positive", func() (uint64, error) { return KeyFromInt(Low64BE, 42) }, 42, ""},
		{"int low64 negative", func() (uint64, error) { return KeyFromInt(Low64BE, -1) }, 0, "negative"},
		{"int first64 -1", func() (uint64, error) { return KeyFromInt(First64BE, -1) }, math.MaxUint64, ""},
		{"int first64 min", func() (uint64, error) { return KeyFromInt(First64BE, math.MinInt64) }, 1 << 63, ""},
		{"int first64 example", func() (uint64, error) { return KeyFromInt(First64BE, -685567553150498463) }, 17761176520559053153, ""},
		{"int unknown projection", func() (uint64, error) { return KeyFromInt(7, 1) }, 0, "unknown index projection"},
		{"bytes low64 8", func() (uint64, error) { return KeyFromBytes(Low64BE, []byte{1, 2, 3, 4, 5, 6, 7, 8}) }, 0x0102030405060708, ""},
		{"bytes low64 16", func() (uint64, error) {
			return KeyFromBytes(Low64BE, []byte{9, 9, 9, 9, 9, 9, 9, 9, 1, 2, 3, 4, 5, 6, 7, 8})
		}, 0x0102030405060708, ""},
		{"bytes first64 16", func() (uint64, error) {
			return KeyFromBytes(First64BE, []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 9, 9, 9, 9, 9, 9, 9})
		}, 0x0102030405060708, ""},
		{"bytes short", func() (uint64, error) { return KeyFromBytes(Low64BE, []byte{1, 2, 3, 4, 5, 6, 7}) }, 0, "shorter than 8"},
		{"bytes empty", func() (uint64, error) { return KeyFromBytes(First64BE, nil) }, 0, "shorter than 8"},
		{"bytes unknown projection", func() (uint64, error) { return KeyFromBytes(0, make([]byte, 32)) }, 0, "unknown index projection"},
		{"hex low64 digest", func() (uint64, error) { return KeyFromHex(Low64BE, digest) }, 2164874634404590027, ""},
		{"hex low64 upper 0x", func() (uint64, error) { return KeyFromHex(Low64BE, "0X"+strings.ToUpper(digest)) }, 2164874634404590027, ""},
		{"hex low64 xxhash 32", func() (uint64, error) { return KeyFromHex(Low64BE, digest[32:]) }, 2164874634404590027, ""},
		{"hex low64 16", func() (uint64, error) { return KeyFromHex(Low64BE, "1e0b2e028ef071cb") }, 2164874634404590027, ""},
		{"hex low64 15", func() (uint64, error) { return KeyFromHex(Low64BE, "e0b2e028ef071cb") }, 0, "at least 16"},
		{"hex low64 odd", func() (uint64, error) { return KeyFromHex(Low64BE, "a"+digest) }, 0, "even"},
		{"hex low64 bad digit early", func() (uint64, error) { return KeyFromHex(Low64BE, "g"+digest[1:]) }, 0, "invalid hex digit"},
		{"hex first64 digest", func() (uint64, error) { return KeyFromHex(First64BE, digest) }, 14543684119246146921, ""},
		{"hex first64 0x", func() (uint64, error) { return KeyFromHex(First64BE, "0x"+digest) }, 14543684119246146921, ""},
		{"hex first64 short", func() (uint64, error) { return KeyFromHex(First64BE, digest[:62]) }, 0, "want 64"},
		{"hex first64 bad tail digit", func() (uint64, error) { return KeyFromHex(First64BE, digest[:63]+"z") }, 0, "invalid hex digit"},
		{"hex empty", func() (uint64, error) { return KeyFromHex(Low64BE, "") }, 0, "at least 16"},
		{"hex unknown projection", func() (uint64, error) { return KeyFromHex(0, digest) }, 0, "unknown index projection"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.f()
			if tt.err == "" {
				if err != nil || got != tt.want {
					t.Fatalf("= %d, %v; want %d", got, err, tt.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Fatalf("error = %v, want it to mention %q", err, tt.err)
			}
			if got != 0 {
				t.Errorf("key on error = %d, want 0", got)
			}
		})
	}
	if _, err := KeyFromHex(0, digest); !errors.Is(err, ErrUnknownProjection) {
		t.Errorf("unknown projection error does not wrap ErrUnknownProjection: %v", err)
	}
}
