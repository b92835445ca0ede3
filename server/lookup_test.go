package server

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/mooncake-conductor-go/conductor/codec"
	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/query"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
	"github.com/mooncake-conductor-go/conductor/internal/tokenmemo"
)

var lookupCtx = index.ContextKey{Tenant: "default", Model: "m", BlockSize: 4}

// lookupFixture is a table where owner (a, 0) holds the first 3 blocks of
// tokens on device and (b, 1) the first block, and a server over it with
// the memos on or off.
func lookupFixture(t *testing.T, tokens []int32, memos bool) *Server {
	t.Helper()
	cat := eventtest.PrefixTable(t, lookupCtx, tokens)
	qo := query.Options{Contexts: cat}
	opts := Options{Contexts: cat}
	if memos {
		qo.Memo, opts.TokenMemo = hashing.NewMemo(1<<20), tokenmemo.New(1<<20)
	}
	opts.Engine = query.New(qo)
	return New(opts)
}

func lookupPrompt(n int) []int32 {
	t := make([]int32, n)
	for i := range t {
		t[i] = int32(i*31 + 7)
	}
	return t
}

func lookupCounts(dev int) index.TierCounts {
	return index.TierCounts{Device: dev, CPULocal: dev, CPUShare: dev, Disk: dev}
}

func rawBody(t *testing.T, m map[string]any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestLookupAndBodyAgree checks that the engine's decoded-tokens lookup and
// the /query body door give the same per-owner answer, with and without
// the memos, cold and warm.
func TestLookupAndBodyAgree(t *testing.T) {
	tokens := lookupPrompt(300) // long enough for the token memo to learn it
	want := []index.InstanceHits{
		{Instance: "a", Max: lookupCounts(12), Ranks: []index.RankHits{{Rank: 0, TierCounts: lookupCounts(12)}}},
		{Instance: "b", Max: lookupCounts(4), Ranks: []index.RankHits{{Rank: 1, TierCounts: lookupCounts(4)}}},
	}
	for _, memos := range []bool{false, true} {
		s := lookupFixture(t, tokens, memos)
		raw := rawBody(t, map[string]any{"model": "m", "block_size": 4, "token_ids": tokens})
		for round := range 2 {
			var res query.Result
			if _, err := s.query.Lookup(&query.Request{Context: index.ContextKey{Model: "m", BlockSize: 4}, Tokens: tokens}, &res); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, res.Instances, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("memos=%v round %d: Lookup (-want +got):\n%s", memos, round, diff)
			}
			var res2 query.Result
			if err := s.lookupBody(raw, &res2); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, res2.Instances, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("memos=%v round %d: lookupBody (-want +got):\n%s", memos, round, diff)
			}
		}
		if memos {
			if hits, _ := s.opts.TokenMemo.Stats(); hits == 0 {
				t.Error("the token memo never supplied the repeated body's tokens")
			}
		}
	}
}

// TestLookupBodyUnknownContext: a body for a context nobody registered
// answers no owners and teaches no memo.
func TestLookupBodyUnknownContext(t *testing.T) {
	tokens := lookupPrompt(300)
	s := lookupFixture(t, tokens, true)
	raw := rawBody(t, map[string]any{"model": "other", "block_size": 4, "token_ids": tokens})
	var res query.Result
	for range 2 {
		if err := s.lookupBody(raw, &res); err != nil {
			t.Fatal(err)
		}
		if len(res.Instances) != 0 {
			t.Errorf("unknown context answered %v", res.Instances)
		}
	}
	if b := s.opts.TokenMemo.Bytes(); b != 0 {
		t.Errorf("a query for an unknown context left %d bytes in the token memo", b)
	}
}

// TestLookupBodyErrors: a body the decoder refuses fails with its
// *codec.Error, the contract's reason and field.
func TestLookupBodyErrors(t *testing.T) {
	s := lookupFixture(t, lookupPrompt(16), false)
	for _, tc := range []struct {
		name   string
		body   []byte
		reason codec.Reason
		field  string
	}{
		{"body not a map", []byte{0x91, 0x01}, codec.InvalidType, ""},
		{"body unknown field", rawBody(t, map[string]any{"model": "m", "block_size": 4, "token_ids": []int{}, "x": 1}), codec.UnknownField, "x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var res query.Result
			var ce *codec.Error
			if err := s.lookupBody(tc.body, &res); !errors.As(err, &ce) {
				t.Fatalf("error %T %v, want *codec.Error", err, err)
			}
			if ce.Reason != tc.reason || ce.Field != tc.field {
				t.Errorf("reason %v field %q, want %v %q", ce.Reason, ce.Field, tc.reason, tc.field)
			}
		})
	}
}
