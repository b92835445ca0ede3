package main

import (
	"runtime/debug"
	"testing"
)

// TestGCPercentDefault: the service runs at defaultGCPercent unless the
// operator set GOGC, whose value the runtime then already applied.
func TestGCPercentDefault(t *testing.T) {
	orig := debug.SetGCPercent(100)
	defer debug.SetGCPercent(orig)
	for _, tc := range []struct {
		gogc string
		want int
	}{
		{"", defaultGCPercent},
		{"200", 100}, // left as the runtime set it (100 here)
		{"off", 100},
	} {
		debug.SetGCPercent(100)
		setGCPercent(func(k string) string {
			if k == "GOGC" {
				return tc.gogc
			}
			return ""
		})
		if got := debug.SetGCPercent(100); got != tc.want {
			t.Errorf("GOGC=%q: GC percent %d, want %d", tc.gogc, got, tc.want)
		}
	}
}
