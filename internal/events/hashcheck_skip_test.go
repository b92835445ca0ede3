package events

import (
	"testing"

	"github.com/mooncake-conductor-go/conductor/internal/hashing/hashcheck"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
)

// TestHashCheckSkipReasons: an applied BlockStored whose blocks cannot be
// re-hashed counts every sampled block as skipped, with what the event
// lacked, and never as a match or a mismatch.
func TestHashCheckSkipReasons(t *testing.T) {
	m := eventtest.LoadManifest(t)
	// The keys of the golden chain [1..8], block size 4 (vllm-a's profile).
	keys := []uint64{2164874634404590027, 17270480062156288726}
	stored := func(extra map[string]any) map[string]any {
		ev := map[string]any{"type": "BlockStored", "block_hashes": keys, "parent_block_hash": nil,
			"token_ids": []int{1, 2, 3, 4, 5, 6, 7, 8}, "block_size": 4, "lora_id": nil, "medium": "GPU", "lora_name": nil}
		for k, v := range extra {
			ev[k] = v
		}
		return ev
	}
	for _, tc := range []struct {
		name    string
		event   map[string]any
		reason  hashcheck.SkipReason
		matches uint64
	}{
		{"no extra_keys", stored(nil), hashcheck.SkipNoExtraKeys, 0},
		{"extra_keys nil", stored(map[string]any{"extra_keys": nil}), hashcheck.SkipNoExtraKeys, 0},
		{"token_ids nil", stored(map[string]any{"token_ids": nil, "extra_keys": []any{nil, nil}}), hashcheck.SkipNoTokenIDs, 0},
		{"a multimodal key", stored(map[string]any{"extra_keys": []any{[]any{map[string]any{"type": "mm", "hash": "ab"}}, nil}}), hashcheck.SkipForeignExtraKeys, 0},
		{"control: extra_keys stated", stored(map[string]any{"extra_keys": []any{nil, nil}}), 0, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := newTester(t, m, "vllm-a")
			x.applyBatch(1, eventtest.Encode(t, []any{1.5, []any{tc.event}, 0}))
			if got := x.outcomes[1]; len(got) != 1 || got[0].Result != Applied {
				t.Fatalf("outcomes %v, want one applied event", got)
			}
			mt, mm := x.check.Counts()
			if mt != tc.matches || mm != 0 {
				t.Fatalf("matches %d, mismatches %d, want %d, 0", mt, mm, tc.matches)
			}
			var want [hashcheck.NumSkipReasons]uint64
			if tc.matches == 0 {
				want[tc.reason] = uint64(len(keys))
			}
			if got := x.check.Skips(); got != want {
				t.Errorf("skips %v, want %v (%s)", got, want, tc.reason)
			}
		})
	}
}
