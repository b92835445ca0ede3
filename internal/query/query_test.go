package query

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/mooncake-conductor-go/conductor/codec"
	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
)

var testCtx = index.ContextKey{Tenant: "default", Model: "m", BlockSize: 4}

// fixture is a table where owner (a, 0) holds the first 3 blocks of tokens
// on device and (b, 1) the first block, plus an engine with the memos on.
func fixture(t *testing.T, tokens []int32, memos bool) (*Engine, *index.Index) {
	t.Helper()
	seed := "0"
	p, err := hashing.Resolve(hashing.Spec{Strategy: "vllm_v1", Algorithm: "sha256_cbor", IndexProjection: "low64_be", PythonHashSeed: &seed})
	if err != nil {
		t.Fatal(err)
	}
	ix := index.New(index.Options{})
	tbl := ix.EnsureTable(testCtx, p)
	a, b := tbl.AddEngineOwner("a", 0), tbl.AddEngineOwner("b", 1)
	ch := hashing.AcquireChain()
	defer hashing.ReleaseChain(ch)
	ch.Reset(tbl.Profile(), testCtx.BlockSize, tokens, "", "")
	for i := 0; i < 3; i++ {
		k, _, ok := ch.Next()
		if !ok {
			t.Fatal("prompt too short")
		}
		tbl.Store(a, index.Device, k)
		if i == 0 {
			tbl.Store(b, index.Device, k)
		}
	}
	opts := Options{Index: ix}
	if memos {
		opts.Memo, opts.TokenMemo = hashing.NewMemo(1<<20), codec.NewTokenMemo(1<<20)
	}
	return New(opts), ix
}

func prompt(n int) []int32 {
	t := make([]int32, n)
	for i := range t {
		t[i] = int32(i*31 + 7)
	}
	return t
}

func body(t *testing.T, m map[string]any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func counts(dev int) index.TierCounts {
	return index.TierCounts{Device: dev, CPULocal: dev, CPUShare: dev, Disk: dev}
}

// TestLookupAndBodyAgree checks that the decoded-tokens door and the body
// door give the same per-owner answer, with and without the memos, cold
// and warm.
func TestLookupAndBodyAgree(t *testing.T) {
	tokens := prompt(300) // long enough for the token memo to learn it
	want := []index.InstanceHits{
		{Instance: "a", Max: counts(12), Ranks: []index.RankHits{{Rank: 0, TierCounts: counts(12)}}},
		{Instance: "b", Max: counts(4), Ranks: []index.RankHits{{Rank: 1, TierCounts: counts(4)}}},
	}
	for _, memos := range []bool{false, true} {
		e, _ := fixture(t, tokens, memos)
		raw := body(t, map[string]any{"model": "m", "block_size": 4, "token_ids": tokens})
		for round := range 2 {
			var res Result
			if err := e.Lookup(&Request{Context: index.ContextKey{Model: "m", BlockSize: 4}, Tokens: tokens}, &res); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, res.Instances, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("memos=%v round %d: Lookup (-want +got):\n%s", memos, round, diff)
			}
			var res2 Result
			if err := e.LookupBody(raw, &res2); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, res2.Instances, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("memos=%v round %d: LookupBody (-want +got):\n%s", memos, round, diff)
			}
		}
		if memos {
			if hits, _ := e.opts.TokenMemo.Stats(); hits == 0 {
				t.Error("the token memo never supplied the repeated body's tokens")
			}
		}
	}
}

// TestLookupFilterAndUnknownContext: an instance filter narrows the answer;
// a context nobody registered answers no owners and teaches no memo.
func TestLookupFilterAndUnknownContext(t *testing.T) {
	tokens := prompt(300)
	e, _ := fixture(t, tokens, true)
	var res Result
	if err := e.Lookup(&Request{Context: testCtx, Instance: "b", Tokens: tokens}, &res); err != nil {
		t.Fatal(err)
	}
	want := []index.InstanceHits{{Instance: "b", Max: counts(4), Ranks: []index.RankHits{{Rank: 1, TierCounts: counts(4)}}}}
	if diff := cmp.Diff(want, res.Instances); diff != "" {
		t.Errorf("filtered (-want +got):\n%s", diff)
	}
	raw := body(t, map[string]any{"model": "other", "block_size": 4, "token_ids": tokens})
	for range 2 {
		if err := e.LookupBody(raw, &res); err != nil {
			t.Fatal(err)
		}
		if len(res.Instances) != 0 {
			t.Errorf("unknown context answered %v", res.Instances)
		}
	}
	if b := e.opts.TokenMemo.Bytes(); b != 0 {
		t.Errorf("a query for an unknown context left %d bytes in the token memo", b)
	}
}

// TestLookupErrors: invalid requests fail with an *Error of kind
// InvalidRequest carrying the contract's reason and field.
func TestLookupErrors(t *testing.T) {
	e, _ := fixture(t, prompt(16), false)
	e.opts.Limits.MaxTokens = 8
	type key struct {
		Kind   Kind
		Reason codec.Reason
		Field  string
	}
	for _, tc := range []struct {
		name string
		run  func(*Result) error
		want key
	}{
		{"no model", func(r *Result) error { return e.Lookup(&Request{Context: index.ContextKey{BlockSize: 4}}, r) }, key{InvalidRequest, codec.Missing, "model"}},
		{"zero block size", func(r *Result) error { return e.Lookup(&Request{Context: index.ContextKey{Model: "m"}}, r) }, key{InvalidRequest, codec.InvalidValue, "block_size"}},
		{"too many tokens", func(r *Result) error { return e.Lookup(&Request{Context: testCtx, Tokens: prompt(9)}, r) }, key{InvalidRequest, codec.OutOfRange, "token_ids"}},
		{"body not a map", func(r *Result) error { return e.LookupBody([]byte{0x91, 0x01}, r) }, key{InvalidRequest, codec.InvalidType, ""}},
		{"body unknown field", func(r *Result) error {
			return e.LookupBody(body(t, map[string]any{"model": "m", "block_size": 4, "token_ids": []int{}, "x": 1}), r)
		}, key{InvalidRequest, codec.UnknownField, "x"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var res Result
			err := tc.run(&res)
			var qe *Error
			if !errors.As(err, &qe) {
				t.Fatalf("error %T %v, want *Error", err, err)
			}
			if diff := cmp.Diff(tc.want, key{qe.Kind, qe.Detail.Reason, qe.Detail.Field}); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
