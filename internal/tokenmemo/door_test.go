package tokenmemo_test

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"pgregory.net/rapid"

	"github.com/mooncake-conductor-go/conductor/codec"
	"github.com/mooncake-conductor-go/conductor/internal/memostore"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/querybody"
	"github.com/mooncake-conductor-go/conductor/internal/tokenmemo"
)

// memoQuery is a /query body decoded as the HTTP door decodes it: the
// codec's request, read through the door wrapper's session.
type memoQuery struct {
	codec.QueryRequest
	s tokenmemo.Session
	d tokenmemo.Door
}

// decodeMemo decodes body into q consulting m (nil: a memo turned off), as
// the HTTP door does; the memo learns the array only through remember.
func decodeMemo(m *tokenmemo.Memo, body []byte, lim codec.Limits, q *memoQuery) *codec.Error {
	q.d = tokenmemo.Door{Memo: m, Format: tokenmemo.MsgPack, Own: true}
	q.s.Begin(&q.d)
	var h codec.TokenHook
	if m != nil {
		h = &q.s
	}
	return codec.DecodeQueryHook(body, lim, &q.QueryRequest, h)
}

// remember teaches the memo the array q was just decoded from, as the HTTP
// door does once the query proved to have a context.
func remember(q *memoQuery) {
	if q.s.Teach() {
		q.DetachTokens()
	}
}

// TokensShared reports whether q.Tokens is the memo's own array.
func (q *memoQuery) TokensShared() bool { return q.s.Lent() }

// tokenBody packs an n-token /query body as codec's tests do (a 150K
// vocabulary, each id in its smallest format or all as int32).
func tokenBody(n int, int32s bool) []byte { return querybody.Pack(n, 150000, int32s) }

// checkSameQuery asserts that two decodes of one body agree: the same error,
// or the same request.
func checkSameQuery(t interface {
	Helper()
	Fatalf(string, ...any)
}, wantErr *codec.Error, want *codec.QueryRequest, gotErr *codec.Error, got *codec.QueryRequest) {
	t.Helper()
	if diff := cmp.Diff(wantErr, gotErr); diff != "" {
		t.Fatalf("error differs with the token memo (-plain +memo):\n%s", diff)
	}
	if wantErr == nil {
		if diff := cmp.Diff(*want, *got, cmpopts.EquateEmpty(), cmpopts.IgnoreUnexported(codec.QueryRequest{})); diff != "" {
			t.Fatalf("request differs with the token memo (-plain +memo):\n%s", diff)
		}
	}
}

// packElem appends v in one of the integer formats a packer may choose for
// it (format 0 is the smallest, as Python's packer writes).
func packElem(b []byte, v int32, format int) []byte {
	switch {
	case format == 1:
		return binary.BigEndian.AppendUint32(append(b, 0xd2), uint32(v))
	case format == 2:
		return binary.BigEndian.AppendUint64(append(b, 0xd3), uint64(int64(v)))
	case v >= 0 && v <= 0x7f:
		return append(b, byte(v))
	case v >= -32 && v < 0:
		return append(b, byte(int8(v)))
	case v >= 0 && v <= 0xff:
		return append(b, 0xcc, byte(v))
	case v >= 0 && v <= 0xffff:
		return binary.BigEndian.AppendUint16(append(b, 0xcd), uint16(v))
	case v >= 0:
		return binary.BigEndian.AppendUint32(append(b, 0xce), uint32(v))
	case v >= math.MinInt16:
		return binary.BigEndian.AppendUint16(append(b, 0xd1), uint16(v))
	default:
		return binary.BigEndian.AppendUint32(append(b, 0xd2), uint32(v))
	}
}

// queryBody packs a /query body with the token array at position at among
// its three fields (0: first, 2: last), each token in format formats(i).
func queryBody(toks []int32, at int, formats func(i int) int) []byte {
	b := []byte{0x83}
	for f := range 3 {
		switch {
		case f == at:
			b = append(b, 0xa9, 't', 'o', 'k', 'e', 'n', '_', 'i', 'd', 's', 0xdd)
			b = binary.BigEndian.AppendUint32(b, uint32(len(toks)))
			for i, v := range toks {
				b = packElem(b, v, formats(i))
			}
		case f == (at+1)%3:
			b = append(b, 0xa5, 'm', 'o', 'd', 'e', 'l', 0xa1, 'm')
		default:
			b = append(b, 0xaa, 'b', 'l', 'o', 'c', 'k', '_', 's', 'i', 'z', 'e', 0x10)
		}
	}
	return b
}

// TestTokenMemoMatchesPlainDecode: bodies drawn from a few shared prompts,
// cut anywhere, diverging anywhere, in mixed integer formats, with the
// tokens first, in the middle or last, and sometimes damaged at one byte,
// decode exactly as they do without the memo: the same request or the same
// error. Every accepted body the memo was consulted for is decoded through
// it a second time, which must then copy tokens from it, so each such draw
// exercises the hit path whatever the sample size (rapid draws a fifth as
// many under -short, too few to count on two draws sharing a prompt).
func TestTokenMemoMatchesPlainDecode(t *testing.T) {
	m := tokenmemo.New(1)
	var q codec.QueryRequest
	var mq memoQuery
	rapid.Check(t, func(rt *rapid.T) {
		prompt := rapid.IntRange(0, 3).Draw(rt, "prompt")
		n := rapid.IntRange(0, 3000).Draw(rt, "n")
		r := rand.New(rand.NewPCG(uint64(prompt), 1))
		toks := make([]int32, n)
		for i := range toks {
			toks[i] = int32(r.IntN(200000)) - 100
		}
		if n > 0 && rapid.Bool().Draw(rt, "diverge") {
			toks[rapid.IntRange(0, n-1).Draw(rt, "at")] = rapid.Int32().Draw(rt, "tok")
		}
		formats := func(int) int { return 0 }
		switch rapid.IntRange(0, 3).Draw(rt, "formats") {
		case 1:
			formats = func(int) int { return 1 }
		case 2:
			formats = func(i int) int { return i * 7 % 3 }
		case 3:
			odd := rapid.IntRange(0, max(n-1, 0)).Draw(rt, "odd")
			formats = func(i int) int { return map[bool]int{true: 2}[i == odd] }
		}
		body := queryBody(toks, rapid.IntRange(0, 2).Draw(rt, "field"), formats)
		if rapid.IntRange(0, 4).Draw(rt, "damage") == 0 {
			body[rapid.IntRange(0, len(body)-1).Draw(rt, "pos")] = rapid.Byte().Draw(rt, "byte")
		}
		if rapid.IntRange(0, 6).Draw(rt, "cut") == 0 {
			body = body[:rapid.IntRange(0, len(body)).Draw(rt, "cutAt")]
		}
		e := codec.DecodeQuery(body, codec.DefaultLimits(), &q)
		me := decodeMemo(m, body, codec.DefaultLimits(), &mq)
		checkSameQuery(rt, e, &q, me, &mq.QueryRequest)
		// queryBody packs an array, which the memo is consulted for from
		// 256 tokens on.
		consulted := me == nil && len(mq.Tokens) >= 256
		remember(&mq)
		if !consulted {
			return
		}
		h0, _ := m.Stats()
		me = decodeMemo(m, body, codec.DefaultLimits(), &mq)
		checkSameQuery(rt, e, &q, me, &mq.QueryRequest)
		if h, _ := m.Stats(); h == h0 {
			rt.Errorf("a repeated %d-token body copied nothing from the memo", len(q.Tokens))
		}
		remember(&mq)
	})
}

// TestTokenMemoReusesPrefix: the next turn of a conversation copies the
// previous turn and decodes only what is new; the same tokens packed in
// another format share no bytes and are decoded; an identical body is
// copied whole and teaches the memo nothing.
func TestTokenMemoReusesPrefix(t *testing.T) {
	m := tokenmemo.New(8 << 20)
	turn1 := make([]int32, 2000)
	for i := range turn1 {
		turn1[i] = int32(i * 7919 % 150000)
	}
	turn2 := append(append([]int32(nil), turn1...), turn1[:500]...)
	compact := func(int) int { return 0 }
	var q memoQuery
	step := func(toks []int32, formats func(int) int, wantHits, wantMisses uint64) {
		t.Helper()
		h0, m0 := m.Stats()
		if e := decodeMemo(m, queryBody(toks, 1, formats), codec.DefaultLimits(), &q); e != nil {
			t.Fatal(e)
		}
		remember(&q)
		if !cmp.Equal(q.Tokens, toks) {
			t.Fatal("tokens differ")
		}
		if h, ms := m.Stats(); h-h0 != wantHits || ms-m0 != wantMisses {
			t.Errorf("%d hits, %d misses; want %d, %d", h-h0, ms-m0, wantHits, wantMisses)
		}
	}
	step(turn1, compact, 0, 2000)
	step(turn2, compact, 2000, 500)
	step(turn2, compact, 2500, 0)
	bytesBefore := m.Bytes()
	step(turn2, compact, 2500, 0)
	if m.Bytes() != bytesBefore {
		t.Error("an identical body was remembered again")
	}
	step(turn2, func(int) int { return 1 }, 0, 2500)
	// A body that shares only the first 1000 tokens reuses whole chunks.
	other := append(append([]int32(nil), turn1[:1000]...), 42, 43)
	step(append(other, turn2[1002:]...), compact, 960, 2500-960)

	m.Reset()
	if m.Bytes() != 0 {
		t.Errorf("%d bytes after Reset", m.Bytes())
	}
	step(turn2, compact, 0, 2500)
}

// FuzzDoorDecodeQuery: a /query body read through the door wrapper (the
// token memo shared across inputs, so that it learns from the corpus, and
// taught every accepted body) decodes exactly as it does without it, the
// first time and again once the memo may hold it: the same request or the
// same error.
func FuzzDoorDecodeQuery(f *testing.F) {
	// Seeds just over the memo's threshold, mostly one byte an id: the
	// fuzzer minimizes each input it finds interesting, which for bodies
	// of kilobytes took longer than a whole fuzzing run.
	toks := make([]int32, 2*tokenmemo.MemoMinTokens)
	for i := range toks {
		toks[i] = int32(i*37%160 - 32)
	}
	n := tokenmemo.MemoMinTokens + 8
	for at := range 3 {
		f.Add(queryBody(toks[:n], at, func(int) int { return 0 }))
	}
	f.Add(queryBody(toks[:n+tokenmemo.Chunk], 1, func(i int) int { return map[bool]int{true: 1}[i == 7] }))
	f.Add(queryBody(toks[:n-1], 2, func(int) int { return 0 }))
	m := tokenmemo.New(4 << 20)
	var mq memoQuery
	f.Fuzz(func(t *testing.T, body []byte) {
		var q codec.QueryRequest
		e := codec.DecodeQuery(body, codec.DefaultLimits(), &q)
		for range 2 {
			checkSameQuery(t, e, &q, decodeMemo(m, body, codec.DefaultLimits(), &mq), &mq.QueryRequest)
			remember(&mq)
		}
	})
}

// TestTokenMemoEntriesStayIntact: a request answered with a remembered
// array, or whose buffer the memo took, must not write into it when the
// same QueryRequest decodes the next body.
func TestTokenMemoEntriesStayIntact(t *testing.T) {
	m := tokenmemo.New(8 << 20)
	a, b := make([]int32, 1000), make([]int32, 1000)
	for i := range a {
		a[i], b[i] = int32(i), int32(5000+i)
	}
	var q memoQuery
	for _, toks := range [][]int32{a, a, b, a, b} {
		if e := decodeMemo(m, queryBody(toks, 2, func(int) int { return 0 }), codec.DefaultLimits(), &q); e != nil {
			t.Fatal(e)
		}
		remember(&q)
		if !cmp.Equal(q.Tokens, toks) {
			t.Fatal("tokens differ: a remembered array was overwritten")
		}
		if !q.TokensShared() {
			t.Error("a remembered array is not reported as shared")
		}
	}
	// Without the memo, and for short arrays, the tokens are the
	// request's own.
	for _, n := range []int{1000, tokenmemo.MemoMinTokens - 1} {
		var mm *tokenmemo.Memo
		if n < tokenmemo.MemoMinTokens {
			mm = m
		}
		if e := decodeMemo(mm, queryBody(a[:n], 2, func(int) int { return 0 }), codec.DefaultLimits(), &q); e != nil {
			t.Fatal(e)
		}
		if q.TokensShared() {
			t.Errorf("%d tokens decoded into the request's buffer are reported as shared", n)
		}
	}
}

func TestTokenMemoHitAllocations(t *testing.T) {
	m := tokenmemo.New(8 << 20)
	body := tokenBody(8192, false)
	var q memoQuery
	if e := decodeMemo(m, body, codec.DefaultLimits(), &q); e != nil {
		t.Fatal(e)
	}
	remember(&q)
	allocs := testing.AllocsPerRun(100, func() {
		if e := decodeMemo(m, body, codec.DefaultLimits(), &q); e != nil {
			t.Fatal(e)
		}
		remember(&q)
	})
	if allocs != 0 {
		t.Errorf("a remembered body allocates %.1f times per request, want 0", allocs)
	}
	if hits, _ := m.Stats(); hits != 101*8192 {
		t.Errorf("%d tokens copied, want %d", hits, 101*8192)
	}
}

// TestTokenMemoBudget: many distinct prompts keep the memo within its
// budget (memostore.MinBytes at least) plus the entry being inserted; a
// prompt far longer than a 64th of the budget is still remembered.
func TestTokenMemoBudget(t *testing.T) {
	m := tokenmemo.New(1)
	var q memoQuery
	toks := make([]int32, 1000)
	for p := range 500 {
		for i := range toks {
			toks[i] = int32(p*1000 + i)
		}
		if e := decodeMemo(m, queryBody(toks, 0, func(int) int { return 0 }), codec.DefaultLimits(), &q); e != nil {
			t.Fatal(e)
		}
		remember(&q)
	}
	if got, limit := m.Bytes(), memostore.MinBytes+160+9*1000+8*16; got > limit || got == 0 {
		t.Errorf("memo holds %d bytes, limit %d", got, limit)
	}
	long := make([]int32, 200_000) // about 1.6 MB remembered
	for i := range long {
		long[i] = int32(i * 7919 % 150000)
	}
	body := queryBody(long, 0, func(int) int { return 0 })
	for range 2 {
		if e := decodeMemo(m, body, codec.DefaultLimits(), &q); e != nil {
			t.Fatal(e)
		}
		remember(&q)
	}
	if hits, _ := m.Stats(); hits < uint64(len(long)) {
		t.Errorf("a 200K-token prompt was not remembered (%d tokens copied in all)", hits)
	}
}

// BenchmarkDecodeQuery8KMemo is BenchmarkDecodeQuery8K for a body the token
// memo has seen before.
func BenchmarkDecodeQuery8KMemo(b *testing.B) {
	for _, enc := range []string{"compact", "int32"} {
		b.Run("enc="+enc, func(b *testing.B) {
			body := tokenBody(8192, enc == "int32")
			m := tokenmemo.New(64 << 20)
			var q memoQuery
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if e := decodeMemo(m, body, codec.DefaultLimits(), &q); e != nil {
					b.Fatal(e)
				}
				remember(&q)
			}
		})
	}
}

// TestTokenMemoStopsAtArrayEnd: a malformed body whose token array is
// followed by bytes that continue a remembered array (stray integers where
// a key belongs) gets the error it gets without the memo; the memo must
// not read past the array's own length.
func TestTokenMemoStopsAtArrayEnd(t *testing.T) {
	toks := make([]int32, 1000)
	for i := range toks {
		toks[i] = int32(i % 100)
	}
	for _, tc := range []struct{ n, present int }{{500, 512}, {500, 1000}, {999, 1000}, {512, 576}} {
		m := tokenmemo.New(8 << 20)
		var q codec.QueryRequest
		var mq memoQuery
		if e := decodeMemo(m, queryBody(toks, 0, func(int) int { return 0 }), codec.DefaultLimits(), &mq); e != nil {
			t.Fatal(e)
		}
		remember(&mq)
		// {"token_ids": [toks[:n]] toks[n:present], "model": …,
		// "block_size": …}: stray integers stand where a key belongs. Read
		// past them, the rest of the body would be a valid request.
		body := queryBody(toks[:tc.present], 0, func(int) int { return 0 })
		binary.BigEndian.PutUint32(body[12:], uint32(tc.n))
		e := codec.DecodeQuery(body, codec.DefaultLimits(), &q)
		if e == nil {
			t.Fatal("the malformed body was accepted without the memo")
		}
		checkSameQuery(t, e, &q, decodeMemo(m, body, codec.DefaultLimits(), &mq), &mq.QueryRequest)
	}
}

// BenchmarkDecodeQuery8KColdMemo decodes 8K-token bodies the token memo
// has not seen (512 distinct ones cycled through the smallest budget), the
// memo's overhead on a cold query: looking up, missing, and remembering;
// with both doors using the memo (memo=cold-both-doors), remembering also
// packs the ids as varints for the gRPC door.
func BenchmarkDecodeQuery8KColdMemo(b *testing.B) {
	for _, mode := range []string{"memo=none", "memo=cold", "memo=cold-both-doors"} {
		memo := mode != "memo=none"
		b.Run(mode, func(b *testing.B) {
			const prompts = 512
			bodies := make([][]byte, prompts)
			for p := range bodies {
				toks := make([]int32, 8192)
				for i := range toks {
					toks[i] = int32((i*7919+p*104729)%150000 + 1)
				}
				bodies[p] = queryBody(toks, 2, func(int) int { return 0 })
			}
			var m *tokenmemo.Memo
			if memo {
				m = tokenmemo.New(1)
				m.Use(tokenmemo.MsgPack)
			}
			if mode == "memo=cold-both-doors" {
				m.Use(tokenmemo.Varint)
			}
			var q memoQuery
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if e := decodeMemo(m, bodies[i%prompts], codec.DefaultLimits(), &q); e != nil {
					b.Fatal(e)
				}
				remember(&q)
				i++
			}
			hits, _ := m.Stats()
			b.ReportMetric(float64(hits)/float64(b.N), "hit-tokens/op")
		})
	}
}

// TestTokenMemoConcurrent shares one memo between goroutines under -race,
// one of them resetting it now and then: every decode stays exact while
// others copy from, learn into and give buffers to the same entries.
func TestTokenMemoConcurrent(t *testing.T) {
	m := tokenmemo.New(1)
	prompts := make([][]int32, 4)
	for p := range prompts {
		prompts[p] = make([]int32, 1500)
		for i := range prompts[p] {
			prompts[p][i] = int32((i*7919 + p*104729) % 150000)
		}
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			var q memoQuery
			r := rand.New(rand.NewPCG(uint64(g), 3))
			for i := range 300 {
				if g == 0 && i%50 == 0 {
					m.Reset()
				}
				toks := prompts[r.IntN(len(prompts))][:256+r.IntN(1244)]
				if e := decodeMemo(m, queryBody(toks, r.IntN(3), func(int) int { return 0 }), codec.DefaultLimits(), &q); e != nil {
					t.Error(e)
					return
				}
				remember(&q)
				if !slices.Equal(q.Tokens, toks) {
					t.Error("tokens differ under concurrent use")
					return
				}
			}
		})
	}
	wg.Wait()
	if hits, _ := m.Stats(); hits == 0 {
		t.Error("the memo was never used")
	}
}

// TestTokenMemoKeepsPromptsThatShareTheirOpening: many short prompts open
// with one system prompt, so every span that fits inside one of them is
// shared by all: those buckets keep only their newest BucketCap entries.
// Each prompt must still be found whole when it is sent again, rather than
// have its tail decoded and be remembered anew on every round.
func TestTokenMemoKeepsPromptsThatShareTheirOpening(t *testing.T) {
	m := tokenmemo.New(64 << 20)
	const prompts, system, tail = 64, 2048, 512
	sys := make([]int32, system)
	for i := range sys {
		sys[i] = int32(1000 + i*7%60000) // uint16: 3 bytes each, 6 KB in all
	}
	bodies := make([][]byte, prompts)
	for p := range bodies {
		toks := slices.Clone(sys)
		for i := range tail {
			toks = append(toks, int32(1000+(p*tail+i)*13%60000))
		}
		bodies[p] = queryBody(toks, 1, func(int) int { return 0 })
	}
	var q memoQuery
	send := func() {
		for _, b := range bodies {
			if e := decodeMemo(m, b, codec.DefaultLimits(), &q); e != nil {
				t.Fatal(e)
			}
			remember(&q)
		}
	}
	send()
	bytes := m.Bytes()
	_, misses := m.Stats()
	for round := range 3 {
		send()
		if _, got := m.Stats(); got != misses {
			t.Fatalf("round %d decoded %d tokens again", round+2, got-misses)
		}
		if got := m.Bytes(); got != bytes {
			t.Fatalf("round %d: memo grew from %d to %d bytes", round+2, bytes, got)
		}
	}
}

// TestSessionVarintTeach: on a varint door (the gRPC one) a run is learned
// only when taught, once per request (the first run worth it), and never
// when an id it did not check is over MaxInt32 (an int32 below zero); its
// chunk ends, found again from the bytes, let a later run sharing half of
// it copy that half.
func TestSessionVarintTeach(t *testing.T) {
	pack := func(ids []uint32) []byte {
		var b []byte
		for _, v := range ids {
			b = binary.AppendUvarint(b, uint64(v))
		}
		return b
	}
	ids := make([]uint32, 4*tokenmemo.Chunk)
	for i := range ids {
		ids[i] = uint32(1<<14 + i*7919%(1<<20))
	}
	// decode runs the gRPC door's steps on a run: look up, decode the rest
	// (here: take ids), tell the session.
	decode := func(s *tokenmemo.Session, run []byte, ids []uint32, checked bool) int {
		known, _, _ := s.KnownTokens(run, math.MaxInt)
		toks := make([]int32, len(ids))
		for i, v := range ids {
			toks[i] = int32(v)
		}
		s.Accepted(run, toks, checked)
		return len(known)
	}
	for _, tc := range []struct {
		name      string
		big       bool // one id over MaxInt32
		checked   bool
		teach     bool
		wantBytes bool
	}{
		{"taught", false, false, true, true},
		{"taught, checked", false, true, true, true},
		{"not taught", false, false, false, false},
		{"an id over MaxInt32", true, false, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := tokenmemo.New(1 << 20)
			door := tokenmemo.Door{Memo: m, Format: tokenmemo.Varint, Transient: true}
			run := slices.Clone(ids)
			if tc.big {
				run[len(run)/2+1] = 1 << 31
			}
			packed := pack(run)
			var s tokenmemo.Session
			s.Begin(&door)
			decode(&s, packed, run, tc.checked)
			// A second run of the request is not the one learned.
			decode(&s, pack(ids[:2*tokenmemo.Chunk]), ids[:2*tokenmemo.Chunk], true)
			clear(packed) // the transport reuses its buffer: the session copied the run
			if tc.teach {
				s.Teach()
			}
			s.Forget()
			if got := m.Bytes() > 0; got != tc.wantBytes {
				t.Fatalf("memo holds %d bytes, want some: %v", m.Bytes(), tc.wantBytes)
			}
			if !tc.wantBytes {
				return
			}
			half := slices.Clone(run)
			half[3*tokenmemo.Chunk] = 5
			s.Begin(&door)
			if k := decode(&s, pack(half), half, true); k != 3*tokenmemo.Chunk {
				t.Errorf("a run sharing its first three chunks copied %d ids, want %d", k, 3*tokenmemo.Chunk)
			}
			s.Forget()
		})
	}
}
