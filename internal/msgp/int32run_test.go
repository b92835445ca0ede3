package msgp

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
)

// int32RunReference is the value-by-value definition of ScanInt32Run: consume
// up to max consecutive integers, report how many and whether all fit in
// int32.
func int32RunReference(buf []byte, max int) (n, consumed int, inRange bool) {
	p := 0
	inRange = true
	for n < max && p < len(buf) {
		v, neg, size := IntAt(buf, p)
		if size == 0 {
			break
		}
		if (neg && int64(v) < math.MinInt32) || (!neg && v > math.MaxInt32) {
			inRange = false
		}
		p += size
		n++
	}
	return n, p, inRange
}

// appendTokens encodes ids as Python's msgpack does (smallest format).
func appendTokens(b []byte, ids []uint32) []byte {
	for _, v := range ids {
		switch {
		case v < 0x80:
			b = append(b, byte(v))
		case v < 0x100:
			b = append(b, 0xcc, byte(v))
		case v < 0x10000:
			b = append(b, 0xcd, byte(v>>8), byte(v))
		default:
			b = append(b, 0xce)
			b = binary.BigEndian.AppendUint32(b, v)
		}
	}
	return b
}

// TestInt32RunMatchesReference compares int32Run with the reference on
// random mixes of every integer format, other type bytes and truncated
// tails.
func TestInt32RunMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	heads := []byte{0x00, 0x05, 0x7f, 0xcc, 0xcd, 0xce, 0xcf, 0xd0, 0xd1, 0xd2, 0xd3, 0xe0, 0xff, 0xc0, 0x90, 0xa3}
	for iter := range 20000 {
		var b []byte
		for range rng.IntN(24) {
			h := heads[rng.IntN(len(heads))]
			b = append(b, h)
			for range rng.IntN(10) {
				b = append(b, byte(rng.Uint32()>>rng.IntN(32)))
			}
		}
		if iter%3 == 0 {
			b = appendTokens(b, []uint32{rng.Uint32(), rng.Uint32N(151936), rng.Uint32N(300)})
		}
		if len(b) > 0 && iter%5 == 0 {
			b = b[:rng.IntN(len(b))]
		}
		max := 1 + rng.IntN(30)
		var r Reader
		r.Reset(b)
		n, ok := r.Int32Run(max)
		wn, wp, wok := int32RunReference(b, max)
		if n != wn || ok != wok || r.Pos() != wp {
			t.Fatalf("% x (max %d): n=%d inRange=%v pos=%d, reference %d %v %d", b, max, n, ok, r.Pos(), wn, wok, wp)
		}
	}
}

// BenchmarkTokenRun scans the token ids of 16-block events as a Qwen-sized
// vocabulary (151,936) encodes them, a random mix of uint16 and uint32
// formats, and as a 32,000-id vocabulary does (uint16 only). It cycles
// through 64 different payloads so that the branch predictor cannot learn
// one.
func BenchmarkTokenRun(b *testing.B) {
	b.Run("vocab=151936", func(b *testing.B) { benchTokenRun(b, 151936) })
	// all uint16, as in BenchmarkIngestVLLM's payload: perfectly predictable
	b.Run("vocab=32000", func(b *testing.B) { benchTokenRun(b, 32000) })
}

func benchTokenRun(b *testing.B, vocab uint32) {
	rng := rand.New(rand.NewPCG(3, 4))
	const tokens = 256
	bufs := make([][]byte, 64)
	size := 0
	for i := range bufs {
		ids := make([]uint32, tokens)
		for j := range ids {
			ids[j] = 256 + rng.Uint32N(vocab-256)
		}
		bufs[i] = append(appendTokens(nil, ids), 0xc0) // the next key, as in a payload
		size += len(bufs[i])
	}
	var r Reader
	b.SetBytes(int64(size / len(bufs)))
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		r.Reset(bufs[i%len(bufs)])
		i++
		if n, ok := r.Int32Run(tokens); n != tokens || !ok {
			b.Fatal(n, ok)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*tokens), "ns/token")
}

// TestInt32Run checks the in-place integer scanner on every integer
// encoding, at the int32 boundaries, and that it stops before other types.
func TestInt32Run(t *testing.T) {
	cases := []struct {
		name    string
		b       []byte
		n       int
		inRange bool
	}{
		{"fixint uint8 uint16", []byte{0x05, 0xcc, 0xff, 0xcd, 0xff, 0xff}, 3, true},
		{"uint32 max int32", []byte{0xce, 0x7f, 0xff, 0xff, 0xff}, 1, true},
		{"uint32 above int32", []byte{0xce, 0x80, 0, 0, 0}, 1, false},
		{"uint64 small", []byte{0xcf, 0, 0, 0, 0, 0, 0, 0, 1}, 1, true},
		{"uint64 big", []byte{0xcf, 0, 0, 0, 1, 0, 0, 0, 0}, 1, false},
		{"negative fixint int8 int16", []byte{0xff, 0xd0, 0x80, 0xd1, 0x80, 0}, 3, true},
		{"int32 min", []byte{0xd2, 0x80, 0, 0, 0}, 1, true},
		{"int64 below int32", []byte{0xd3, 0xff, 0xff, 0xff, 0xff, 0x7f, 0xff, 0xff, 0xff}, 1, false},
		{"stops at nil", []byte{0x01, 0xc0, 0x02}, 1, true},
		{"stops at truncated", []byte{0x01, 0xcd, 0x01}, 1, true},
	}
	for _, c := range cases {
		var r Reader
		r.Reset(c.b)
		n, ok := r.Int32Run(10)
		if n != c.n || ok != c.inRange {
			t.Errorf("%s: n=%d inRange=%v, want %d %v", c.name, n, ok, c.n, c.inRange)
		}
	}
	var r Reader
	r.Reset([]byte{1, 2, 3})
	if n, _ := r.Int32Run(2); n != 2 || r.Remaining() != 1 {
		t.Errorf("max not honoured: n=%d remaining=%d", n, r.Remaining())
	}
}
