package membudget

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestSplit(t *testing.T) {
	for _, tc := range []struct {
		name      string
		total     int64
		overrides map[Part]int64
		want      map[Part]int64
	}{{
		name:  "256 MiB limit: index first, caches by share",
		total: 256*MiB - Headroom(256*MiB), // 192 MiB
		want:  map[Part]int64{Index: 48 * MiB, Links: 24 * MiB, HashMemo: 6 * MiB, TokenMemo: 6 * MiB, Receive: 24 * MiB},
	}, {
		name:  "large: the caches stop at their unbounded sizes, the index takes the rest",
		total: 48 << 30,
		want:  map[Part]int64{Index: 12 << 30, Links: 128 * MiB, HashMemo: 64 * MiB, TokenMemo: 64 * MiB, Receive: 64 * MiB},
	}, {
		name: "unbounded",
		want: map[Part]int64{Index: 0, Links: 128 * MiB, HashMemo: 64 * MiB, TokenMemo: 64 * MiB, Receive: 0},
	}, {
		name:      "overrides replace their part only",
		total:     192 * MiB,
		overrides: map[Part]int64{Index: 100 * MiB, HashMemo: 0},
		want:      map[Part]int64{Index: 100 * MiB, Links: 24 * MiB, HashMemo: 0, TokenMemo: 6 * MiB, Receive: 24 * MiB},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			b := Split(tc.total, 0, "test", tc.overrides)
			if diff := cmp.Diff(tc.want, b.Size); diff != "" {
				t.Fatalf("parts (-want +got):\n%s", diff)
			}
			var sum int64
			for _, p := range Parts {
				if p == Index {
					sum += IndexResidentFactor * b.Size[p]
				} else {
					sum += b.Size[p]
				}
			}
			if tc.total > 0 && tc.overrides == nil && sum > tc.total {
				t.Fatalf("parts take %d bytes resident of a %d budget", sum, tc.total)
			}
		})
	}
}

// TestGoLimit: the runtime's soft limit leaves out the half of the
// receive part libzmq holds in the C heap.
func TestGoLimit(t *testing.T) {
	if got := Split(192*MiB, 256*MiB, "test", nil).GoLimit(); got != 180*MiB {
		t.Errorf("192 MiB budget: Go limit %d MiB, want 180", got/MiB)
	}
	if got := Split(0, 0, "", nil).GoLimit(); got != 0 {
		t.Errorf("unbounded: Go limit %d, want 0", got)
	}
}

func TestFromLimit(t *testing.T) {
	for _, tc := range []struct {
		limit, want int64
		err         bool
	}{
		{limit: 128 * MiB, want: 88 * MiB}, // the minimum headroom
		{limit: 256 * MiB, want: 192 * MiB},
		{limit: 64 * MiB, want: 24 * MiB},
		{limit: 63 * MiB, err: true},
	} {
		got, err := FromLimit(tc.limit, "test")
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("FromLimit(%d MiB) = %d MiB, %v; want %d MiB, error %v", tc.limit/MiB, got/MiB, err, tc.want/MiB, tc.err)
		}
	}
}

func TestDescribe(t *testing.T) {
	b := Split(192*MiB, 256*MiB, "GOMEMLIMIT", map[Part]int64{HashMemo: 0})
	got := b.Describe()
	for _, want := range []string{"memory budget 192 MiB: the 256 MiB limit of GOMEMLIMIT less 64 MiB of headroom", "index 48 MiB accounted", "links 24 MiB", "hash_memo 0 MiB (override)"} {
		if !strings.Contains(got, want) {
			t.Errorf("%q lacks %q", got, want)
		}
	}
	if got := Split(0, 0, "", nil).Describe(); !strings.HasPrefix(got, "memory unbounded") || !strings.Contains(got, "index unbounded") {
		t.Errorf("unbounded: %q", got)
	}
}
