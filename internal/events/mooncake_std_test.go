package events

import "testing"

// TestParseStdKey: the object keys the master reads as a u64 (decimal, or
// 0x and 1 to 16 hex digits) and the ones it does not.
func TestParseStdKey(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want uint64
		ok   bool
	}{
		{"0", 0, true}, {"007", 7, true}, {"18446744073709551615", 1<<64 - 1, true},
		{"0x0", 0, true}, {"0XfF", 255, true}, {"0xffffffffffffffff", 1<<64 - 1, true},
		{"18446744073709551616", 0, false}, {"0x1ffffffffffffffff", 0, false}, {"0x", 0, false},
		{"", 0, false}, {"+1", 0, false}, {"-1", 0, false}, {" 1", 0, false}, {"1 ", 0, false},
		{"0x+1", 0, false}, {"0x_1", 0, false}, {"1e3", 0, false}, {"dep@m@tp_rank:0@ab", 0, false},
	} {
		got, ok := parseStdKey(tc.in)
		if ok != tc.ok || (ok && got != tc.want) {
			t.Errorf("parseStdKey(%q) = %d, %v; want %d, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}
