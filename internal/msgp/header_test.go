package msgp

import "testing"

// TestScalarSizeMatchesHeader pins Skip's size table to Header, the
// general decoder: for every first byte the table knows, the header's size
// plus payload must be the table's size.
func TestScalarSizeMatchesHeader(t *testing.T) {
	for c := 0; c < 256; c++ {
		s := int(ScalarSize[c])
		if s == 0 {
			continue
		}
		b := make([]byte, 32)
		b[0] = byte(c)
		k, n, hdr, err := Header(b, 0)
		if err != nil || k == Array || k == Map || k == Str || k == Bin {
			t.Fatalf("%#x: table says scalar of %d bytes, header says %v %v", c, s, k, err)
		}
		if got := hdr + int(n); got != s {
			t.Errorf("%#x: table size %d, header size %d", c, s, got)
		}
	}
}
