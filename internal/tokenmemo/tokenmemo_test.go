package tokenmemo

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/vmihailenco/msgpack/v5"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/mooncake-conductor-go/conductor/internal/memostore"
)

// pythonPacked is ids as a MessagePack array's elements the way Python's
// packer (and vmihailenco's with compact ints) writes them: each in its
// smallest integer format.
func pythonPacked(t testing.TB, ids []int32) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.UseCompactInts(true)
	for _, v := range ids {
		if err := enc.EncodeInt(int64(v)); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

// varintPacked is ids as protobuf packs a repeated uint32.
func varintPacked(ids []int32) []byte {
	var b []byte
	for _, v := range ids {
		b = protowire.AppendVarint(b, uint64(uint32(v)))
	}
	return b
}

// chunkEnds is the offset just past every Chunk-th id of ids packed by
// pack, found by packing each chunk on its own.
func chunkEnds(ids []int32, pack func([]int32) []byte) []uint32 {
	var ends []uint32
	at := 0
	for i := Chunk; i <= len(ids); i += Chunk {
		at += len(pack(ids[i-Chunk : i]))
		ends = append(ends, uint32(at))
	}
	return ends
}

// learn files ids as door f would after decoding them from raw.
func learn(t testing.TB, m *Memo, f Format, ids []int32, raw []byte, pack func([]int32) []byte) {
	t.Helper()
	fps := Fingerprints(f, raw, len(raw), nil)
	m.Remember(f, raw, ids, chunkEnds(ids, pack), fps, false)
}

// lookup is what door f finds for raw: the ids it copies, in all (k) and
// their packed length.
func lookup(m *Memo, f Format, raw []byte, n int) (ids []int32, off int) {
	fps := Fingerprints(f, raw, len(raw), nil)
	e, k, off := m.Match(f, raw, n, fps)
	if e == nil {
		return nil, 0
	}
	return e.Tokens()[:k], off
}

func randomIDs(r *rand.Rand, n int) []int32 {
	ids := make([]int32, n)
	for i := range ids {
		ids[i] = int32(r.IntN(200000))
	}
	return ids
}

// TestEncodeIsCanonical: the forms the memo derives are the bytes the
// formats' canonical packers write, with their chunk ends, for ids at
// every size boundary; a negative id has no varint form.
func TestEncodeIsCanonical(t *testing.T) {
	edges := []int32{0, 1, 0x7f, 0x80, 0xff, 0x100, 0x3fff, 0x4000, 0xffff, 0x10000, 0x1fffff, 0x200000, math.MaxInt32}
	negs := []int32{-1, -32, -33, -128, -129, math.MinInt16, math.MinInt16 - 1, math.MinInt32}
	r := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct {
		name string
		ids  []int32
	}{
		{"edges", edges},
		{"negatives", append(append([]int32(nil), edges...), negs...)},
		{"random 1000", randomIDs(r, 1000)},
		{"empty", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mp, ok := encode(MsgPack, tc.ids)
			if !ok {
				t.Fatal("msgpack refused")
			}
			wantMP := pythonPacked(t, tc.ids)
			if diff := cmp.Diff(wantMP, mp.raw, cmpBytes); diff != "" {
				t.Errorf("msgpack form (-python +memo):\n%s", diff)
			}
			if diff := cmp.Diff(chunkEnds(tc.ids, func(ids []int32) []byte { return pythonPacked(t, ids) }), mp.ends, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("msgpack ends:\n%s", diff)
			}
			vf, ok := encode(Varint, tc.ids)
			if neg := tc.name == "negatives"; ok == neg {
				t.Fatalf("varint form made: %v, want %v", ok, !neg)
			}
			if !ok {
				return
			}
			if diff := cmp.Diff(varintPacked(tc.ids), vf.raw, cmpBytes); diff != "" {
				t.Errorf("varint form (-protobuf +memo):\n%s", diff)
			}
			if diff := cmp.Diff(chunkEnds(tc.ids, varintPacked), vf.ends, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("varint ends:\n%s", diff)
			}
		})
	}
}

// cmpBytes treats nil and empty alike.
var cmpBytes = cmp.Comparer(func(a, b []byte) bool { return bytes.Equal(a, b) })

// TestOneDoorTeachesTheOther: ids one door learned are found, whole, by
// the other door from its own wire bytes, once both doors use the memo;
// a door that does not use it gets no form, so finds nothing.
func TestOneDoorTeachesTheOther(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	ids := randomIDs(r, 1000)
	mp := func(ids []int32) []byte { return pythonPacked(t, ids) }
	for _, tc := range []struct {
		name     string
		from, to Format
		both     bool
	}{
		{"msgpack to varint", MsgPack, Varint, true},
		{"varint to msgpack", Varint, MsgPack, true},
		{"varint door not in use", MsgPack, Varint, false},
		{"msgpack door not in use", Varint, MsgPack, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := New(1 << 20)
			m.Use(tc.from)
			if tc.both {
				m.Use(tc.to)
			}
			pack := map[Format]func([]int32) []byte{MsgPack: mp, Varint: varintPacked}
			learn(t, m, tc.from, ids, pack[tc.from](ids), pack[tc.from])
			raw := pack[tc.to](ids)
			got, off := lookup(m, tc.to, raw, len(ids))
			if !tc.both {
				if got != nil {
					t.Fatalf("found %d ids with no form in %v", len(got), tc.to)
				}
				return
			}
			if off != len(raw) || !cmp.Equal(got, ids) {
				t.Fatalf("found %d ids over %d of %d bytes; equal: %v", len(got), off, len(raw), cmp.Equal(got, ids))
			}
			// A next turn (same opening, another ending) reuses the
			// shared chunks through the other format's chunk ends.
			next := append(append([]int32(nil), ids[:700]...), randomIDs(r, 300)...)
			got, off = lookup(m, tc.to, pack[tc.to](next), len(next))
			if len(got) != 640 || !cmp.Equal(got, ids[:640]) || off != len(pack[tc.to](ids[:640])) {
				t.Fatalf("next turn: %d ids over %d bytes, want 640", len(got), off)
			}
		})
	}
}

// TestFormatsNeverShareAForm: bytes that are a valid array in both formats
// but mean other ids in the other one are never taken for them: a lookup
// finds only the form of its own format, compared byte for byte. Bytes
// that happen to mean the same ids in both (every id below 128) are found
// through the other format's form, which holds those very ids.
func TestFormatsNeverShareAForm(t *testing.T) {
	// 200 packs as cc c8 in MessagePack; read as varints, cc c8 05 is one
	// id (0x4c | 0x48<<7 | 5<<14).
	var ids []int32
	for i := range 400 {
		ids = append(ids, 200, int32(5+i%100))
	}
	raw := pythonPacked(t, ids)
	var asVarints []int32
	for b := raw; len(b) > 0; {
		v, n := protowire.ConsumeVarint(b)
		if n < 0 {
			t.Fatal("the MessagePack bytes are no varint run")
		}
		asVarints = append(asVarints, int32(v))
		b = b[n:]
	}
	if cmp.Equal(asVarints, ids) {
		t.Fatal("the test needs bytes that mean other ids as varints")
	}
	for _, tc := range []struct {
		name string
		from Format
		ids  []int32
		ask  Format
	}{
		{"learned as msgpack, asked as varints", MsgPack, ids, Varint},
		{"learned as varints, asked as msgpack", Varint, asVarints, MsgPack},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := New(1 << 20)
			m.Use(MsgPack)
			m.Use(Varint)
			pack := map[Format]func([]int32) []byte{MsgPack: func(ids []int32) []byte { return pythonPacked(t, ids) }, Varint: varintPacked}
			learn(t, m, tc.from, tc.ids, raw, pack[tc.from])
			if got, _ := lookup(m, tc.from, raw, len(tc.ids)); !cmp.Equal(got, tc.ids) {
				t.Fatalf("the learning door misses its own bytes (%d ids)", len(got))
			}
			if got, _ := lookup(m, tc.ask, raw, math.MaxInt); got != nil {
				t.Fatalf("the other format took %d ids from the same bytes", len(got))
			}
		})
	}
	// Ids below 128 are the same bytes in both formats, and the same ids.
	small := make([]int32, 512)
	for i := range small {
		small[i] = int32(i % 128)
	}
	m := New(1 << 20)
	m.Use(MsgPack)
	m.Use(Varint)
	learn(t, m, MsgPack, small, varintPacked(small), varintPacked)
	if got, _ := lookup(m, Varint, varintPacked(small), math.MaxInt); !cmp.Equal(got, small) {
		t.Fatalf("small ids: found %d", len(got))
	}
}

// TestWholeEntrySupersedesItsPrefix: an entry holding an older one's
// whole array, in every format the older has, retires it; an entry lacking
// one of the older's forms does not. The accounting covers both forms.
func TestWholeEntrySupersedesItsPrefix(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	ids := randomIDs(r, 2048)
	half := pythonPacked(t, ids[:1024])
	find := func(m *Memo) *Entry {
		e, _, _ := m.Match(MsgPack, half, 1024, Fingerprints(MsgPack, half, len(half), nil))
		return e
	}
	m := New(1 << 20)
	m.Use(MsgPack)
	m.Use(Varint)
	learn(t, m, Varint, ids[:1024], varintPacked(ids[:1024]), varintPacked)
	want := entryOverhead + 4*1024 + len(varintPacked(ids[:1024])) + len(half) + 4*2*16
	if got := m.Bytes(); got < want {
		t.Fatalf("entry accounts %d bytes, its slices alone %d", got, want)
	}
	old := find(m)
	if old == nil {
		t.Fatal("the derived form is not found")
	}
	learn(t, m, Varint, ids, varintPacked(ids), varintPacked)
	if !old.Dead() {
		t.Error("the older entry was not retired")
	}
	if e := find(m); e == nil || len(e.Tokens()) != 2048 {
		t.Fatal("the prefix is not served by the whole entry")
	}
	// A memo whose MessagePack door came in use later: the new entry has a
	// form the old lacks as well as all of its, so the old is retired.
	m2 := New(1 << 20)
	m2.Use(Varint)
	learn(t, m2, Varint, ids[:1024], varintPacked(ids[:1024]), varintPacked)
	m2.Use(MsgPack)
	learn(t, m2, MsgPack, ids, pythonPacked(t, ids), func(ids []int32) []byte { return pythonPacked(t, ids) })
	if e := find(m2); e == nil || len(e.Tokens()) != 2048 {
		t.Fatal("m2: the whole entry is not found")
	}
	// The reverse: a longer array with a negative id has no varint form,
	// so the older entry, which the gRPC door still finds, stays.
	m3 := New(1 << 20)
	m3.Use(MsgPack)
	m3.Use(Varint)
	mp := func(ids []int32) []byte { return pythonPacked(t, ids) }
	learn(t, m3, MsgPack, ids[:1024], half, mp)
	old3 := find(m3)
	neg := append(append([]int32(nil), ids[:1024]...), -5)
	neg = append(neg, ids[1025:]...)
	learn(t, m3, MsgPack, neg, pythonPacked(t, neg), mp)
	if old3 == nil || old3.Dead() {
		t.Error("an entry with a form the newer lacks was retired")
	}
	if got, _ := lookup(m3, Varint, varintPacked(ids[:1024]), 1024); len(got) != 1024 {
		t.Errorf("the gRPC door finds %d ids, want 1024", len(got))
	}
	// A body packed otherwise (every id as a MessagePack int32, as Go's
	// packer writes by default) keeps its entry when a Python-packed body
	// of more ids is learned: that one's bytes would not serve it.
	int32Packed := func(ids []int32) []byte {
		var b []byte
		for _, v := range ids {
			b = binary.BigEndian.AppendUint32(append(b, 0xd2), uint32(v))
		}
		return b
	}
	m4 := New(1 << 20)
	m4.Use(MsgPack)
	learn(t, m4, MsgPack, ids[:1024], int32Packed(ids[:1024]), int32Packed)
	wide, _, _ := m4.Match(MsgPack, int32Packed(ids[:1024]), 1024, Fingerprints(MsgPack, int32Packed(ids[:1024]), math.MaxInt, nil))
	learn(t, m4, MsgPack, ids, pythonPacked(t, ids), mp)
	if wide == nil || wide.Dead() {
		t.Error("the int32-packed entry was retired by a Python-packed one")
	}
	if got, _ := lookup(m4, MsgPack, int32Packed(ids[:1024]), 1024); len(got) != 1024 {
		t.Errorf("the int32-packed body finds %d ids, want 1024", len(got))
	}
	m.Reset()
	if m.Bytes() != 0 {
		t.Errorf("%d bytes after Reset", m.Bytes())
	}
}

// TestBudgetHoldsBothForms: distinct prompts learned with both forms stay
// within the budget (memostore.MinBytes at least) plus the entry being
// inserted.
func TestBudgetHoldsBothForms(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	m := New(1)
	m.Use(MsgPack)
	m.Use(Varint)
	var largest int
	for range 600 {
		ids := randomIDs(r, 4096)
		raw := pythonPacked(t, ids)
		before := m.Bytes()
		learn(t, m, MsgPack, ids, raw, func(ids []int32) []byte { return pythonPacked(t, ids) })
		largest = max(largest, m.Bytes()-before)
	}
	if got := m.Bytes(); got == 0 || got > memostore.MinBytes+largest {
		t.Errorf("%d bytes, budget %d", got, memostore.MinBytes)
	}
}

// TestNilMemo: a memo turned off finds nothing and counts nothing.
func TestNilMemo(t *testing.T) {
	var m *Memo
	m.Use(Varint)
	m.Reset()
	if e, k, _ := m.Match(Varint, make([]byte, 512), 512, []uint64{1}); e != nil || k != 0 || m.Bytes() != 0 {
		t.Fatal("a nil memo found something")
	}
	if h, ms := m.Stats(); h != 0 || ms != 0 {
		t.Fatal("a nil memo counted")
	}
	if New(0) != nil {
		t.Fatal("New(0) is a memo")
	}
}

// TestFingerprintDomains: the same bytes fingerprint differently in the
// two formats, span for span.
func TestFingerprintDomains(t *testing.T) {
	b := make([]byte, 4096)
	binary.LittleEndian.PutUint64(b, 42)
	a, v := Fingerprints(MsgPack, b, len(b), nil), Fingerprints(Varint, b, len(b), nil)
	if len(a) != len(v) || len(a) == 0 {
		t.Fatalf("%d and %d fingerprints", len(a), len(v))
	}
	for i := range a {
		if a[i] == v[i] {
			t.Errorf("fingerprint %d is the same in both formats", i)
		}
	}
}

// TestAppendVarintChunkEnds: the word-at-a-time chunk ends are those a byte loop
// finds, for any starting offset and count of varints already seen.
func TestAppendVarintChunkEnds(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		run := make([]byte, rng.IntN(2000))
		for i := range run {
			run[i] = byte(rng.IntN(256))
		}
		off := rng.IntN(len(run) + 1)
		seen := rng.IntN(300)
		var want []uint32
		for i, n := off, seen; i < len(run); i++ {
			if run[i] < 0x80 {
				if n++; n%Chunk == 0 {
					want = append(want, uint32(i+1))
				}
			}
		}
		if got := appendVarintChunkEnds(nil, run, off, seen); !cmp.Equal(got, want, cmpopts.EquateEmpty()) {
			t.Fatalf("len %d off %d seen %d: got %v, want %v", len(run), off, seen, got, want)
		}
	}
}
