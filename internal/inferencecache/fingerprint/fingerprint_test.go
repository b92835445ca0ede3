package fingerprint

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"os"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/zeebo/xxh3"
)

type goldenKey struct {
	Dec   string `json:"dec"`
	HexBE string `json:"hex_be"`
	B64BE string `json:"b64be"`
}

type golden struct {
	Vectors []struct {
		Name          string      `json:"name"`
		Tokens        []uint32    `json:"tokens"`
		BlockSize     int         `json:"block_size"`
		ParentPrefix  *goldenKey  `json:"parent_prefix"`
		ContentHashes []goldenKey `json:"content_hashes"`
		PrefixHashes  []goldenKey `json:"prefix_hashes"`
	} `json:"vectors"`
}

// decode checks that the three spellings of a golden key agree and returns it.
func decode(t *testing.T, k goldenKey) uint64 {
	t.Helper()
	u, err := strconv.ParseUint(k.Dec, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if got := hex.EncodeToString(Wire(u)); got != k.HexBE {
		t.Fatalf("golden key %s: hex %s, want %s", k.Dec, k.HexBE, got)
	}
	if got := base64.StdEncoding.EncodeToString(Wire(u)); got != k.B64BE {
		t.Fatalf("golden key %s: base64 %s, want %s", k.Dec, k.B64BE, got)
	}
	return u
}

// TestGoldenVectors checks every vector of testdata/ic_fingerprint_vectors.json:
// prefix keys, content hashes and the wire form.
func TestGoldenVectors(t *testing.T) {
	raw, err := os.ReadFile("testdata/ic_fingerprint_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var g golden
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Vectors) < 10 {
		t.Fatalf("only %d vectors read", len(g.Vectors))
	}
	for _, v := range g.Vectors {
		t.Run(v.Name, func(t *testing.T) {
			var parent *uint64
			if v.ParentPrefix != nil {
				p := decode(t, *v.ParentPrefix)
				parent = &p
			}
			want := []uint64{}
			for _, k := range v.PrefixHashes {
				want = append(want, decode(t, k))
			}
			got := Chain([]uint64{}, v.Tokens, v.BlockSize, parent)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("prefix keys (-want +got):\n%s", diff)
			}
			for i, k := range v.ContentHashes {
				block := v.Tokens[i*v.BlockSize : (i+1)*v.BlockSize]
				if got, want := Content(block, make([]byte, 4*len(block))), decode(t, k); got != want {
					t.Errorf("content hash %d = %x, want %x", i, got, want)
				}
			}
		})
	}
}

// reference is the scheme written out literally, byte by byte.
func reference(tokens []uint32, bs int, parent *uint64) []uint64 {
	out := []uint64{}
	var prev uint64
	for i := 0; (i+1)*bs <= len(tokens); i++ {
		var buf []byte
		for _, t := range tokens[i*bs : (i+1)*bs] {
			buf = binary.LittleEndian.AppendUint32(buf, t)
		}
		c := xxh3.HashSeed(buf, 1337)
		switch {
		case i == 0 && parent == nil:
			prev = c
		default:
			p := prev
			if i == 0 {
				p = *parent
			}
			link := binary.LittleEndian.AppendUint64(nil, p)
			link = binary.LittleEndian.AppendUint64(link, c)
			prev = xxh3.HashSeed(link, 1337)
		}
		out = append(out, prev)
	}
	return out
}

// FuzzChainMatchesReference compares Chain with the literal reference on
// arbitrary ids, block sizes and parents.
func FuzzChainMatchesReference(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8}, uint8(2), false, uint64(0))
	f.Add(make([]byte, 4*33), uint8(16), true, uint64(0xdeadbeef))
	f.Fuzz(func(t *testing.T, raw []byte, bs uint8, hasParent bool, parent uint64) {
		tokens := make([]uint32, len(raw)/4)
		for i := range tokens {
			tokens[i] = binary.LittleEndian.Uint32(raw[4*i:])
		}
		var p *uint64
		if hasParent {
			p = &parent
		}
		if bs == 0 {
			if got := Chain(nil, tokens, 0, p); len(got) != 0 {
				t.Fatalf("block size 0 gave %d keys", len(got))
			}
			return
		}
		if diff := cmp.Diff(reference(tokens, int(bs), p), Chain([]uint64{}, tokens, int(bs), p)); diff != "" {
			t.Fatalf("(-reference +Chain):\n%s", diff)
		}
	})
}

func BenchmarkChain8K(b *testing.B) {
	tokens := make([]uint32, 8192)
	for i := range tokens {
		tokens[i] = uint32(i * 7919)
	}
	dst := make([]uint64, 0, 512)
	b.SetBytes(4 * 8192)
	for b.Loop() {
		dst = Chain(dst[:0], tokens, DefaultBlockSize, nil)
	}
}
