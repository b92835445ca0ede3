package query

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/contexts"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
)

var testCtx = index.ContextKey{Tenant: "default", Model: "m", BlockSize: 4}

// fixture is a table where owner (a, 0) holds the first 3 blocks of tokens
// on device and (b, 1) the first block, plus an engine with the memos on.
func fixture(t *testing.T, tokens []int32, memos bool) (*Engine, *contexts.Catalogue) {
	t.Helper()
	cat := eventtest.PrefixTable(t, testCtx, tokens)
	opts := Options{Contexts: cat}
	if memos {
		opts.Memo = hashing.NewMemo(1 << 20)
	}
	return New(opts), cat
}

func prompt(n int) []int32 {
	t := make([]int32, n)
	for i := range t {
		t[i] = int32(i*31 + 7)
	}
	return t
}

func counts(dev int) index.TierCounts {
	return index.TierCounts{Device: dev, CPULocal: dev, CPUShare: dev, Disk: dev}
}

// TestLookupFilterAndUnknownContext: an instance filter narrows the answer;
// a context nobody registered answers no owners, and Lookup says which
// (the default tenant standing for an empty one).
func TestLookupFilterAndUnknownContext(t *testing.T) {
	tokens := prompt(300)
	e, _ := fixture(t, tokens, true)
	var res Result
	known, err := e.Lookup(&Request{Context: testCtx, Instance: "b", Tokens: tokens}, &res)
	if err != nil || !known {
		t.Fatalf("Lookup: known %v, %v", known, err)
	}
	want := []index.InstanceHits{{Instance: "b", Max: counts(4), Ranks: []index.RankHits{{Rank: 1, TierCounts: counts(4)}}}}
	if diff := cmp.Diff(want, res.Instances); diff != "" {
		t.Errorf("filtered (-want +got):\n%s", diff)
	}
	other := index.ContextKey{Model: "other", BlockSize: 4}
	if known, err := e.Lookup(&Request{Context: other, Tokens: tokens}, &res); err != nil || known || len(res.Instances) != 0 {
		t.Errorf("unknown context: known %v, %v, answered %v", known, err, res.Instances)
	}
	for _, tc := range []struct {
		ctx  index.ContextKey
		want bool
	}{{other, false}, {index.ContextKey{Model: "m", BlockSize: 4}, true}, {index.ContextKey{Tenant: index.DefaultTenant, Model: "m", BlockSize: 4}, true}} {
		if known, err := e.Lookup(&Request{Context: tc.ctx, Tokens: tokens}, &res); err != nil || known != tc.want || (len(res.Instances) == 2) != tc.want {
			t.Errorf("Lookup(%+v) = %v, %v, answered %v; want known and both owners %v", tc.ctx, known, err, res.Instances, tc.want)
		}
	}
}

// TestLookupErrors: invalid requests fail with an *Error carrying the
// contract's reason and field.
func TestLookupErrors(t *testing.T) {
	e, _ := fixture(t, prompt(16), false)
	e.opts.MaxTokens = 8
	type key struct {
		Reason Reason
		Field  string
	}
	for _, tc := range []struct {
		name string
		req  Request
		want key
	}{
		{"no model", Request{Context: index.ContextKey{BlockSize: 4}}, key{Missing, "model"}},
		{"zero block size", Request{Context: index.ContextKey{Model: "m"}}, key{InvalidValue, "block_size"}},
		{"too many tokens", Request{Context: testCtx, Tokens: prompt(9)}, key{OutOfRange, "token_ids"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for name, run := range map[string]func() error{
				"Lookup":      func() error { var res Result; _, err := e.Lookup(&tc.req, &res); return err },
				"LookupFound": func() error { var res Result; return e.LookupFound(nil, &tc.req, &res) },
				"Explain":     func() error { _, err := e.Explain(&tc.req); return err },
			} {
				var qe *Error
				if err := run(); !errors.As(err, &qe) {
					t.Fatalf("%s: error %T %v, want *Error", name, err, err)
				}
				if diff := cmp.Diff(tc.want, key{qe.Reason, qe.Field}); diff != "" {
					t.Errorf("%s (-want +got):\n%s", name, diff)
				}
			}
		})
	}
}

// TestForget: Forget empties the engine's caches only once no context is
// left for them to answer about.
func TestForget(t *testing.T) {
	tokens := prompt(600)
	e, cat := fixture(t, tokens, true)
	var res Result
	if _, err := e.Lookup(&Request{Context: testCtx, Tokens: tokens}, &res); err != nil {
		t.Fatal(err)
	}
	if e.Memo().Bytes() == 0 {
		t.Fatal("the lookup left nothing in the prefix memo")
	}
	e.Forget()
	if e.Memo().Bytes() == 0 {
		t.Fatal("Forget emptied the prefix memo while a context is left")
	}
	cat.Drop(testCtx)
	e.Forget()
	if n := e.Memo().Bytes(); n != 0 {
		t.Fatalf("after the last context the prefix memo holds %d bytes", n)
	}
}
