package subscriber

import (
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
)

// linkedStores returns n BlockStored batches of per blocks each, one chain
// of real sha256_cbor digests published as bytes and chained by digest,
// with the number of blocks.
func linkedStores(t *testing.T, p *hashing.Profile, bs, n, per int) ([][]byte, int) {
	t.Helper()
	toks := make([]int32, n*per*bs)
	for i := range toks {
		toks[i] = int32(i*31 + 7)
	}
	c := hashing.AcquireChain()
	defer hashing.ReleaseChain(c)
	c.Reset(p, bs, toks, "", "")
	var digs [][]byte
	for {
		if _, _, ok := c.Next(); !ok {
			break
		}
		d := c.Digest()
		digs = append(digs, d[:])
	}
	var out [][]byte
	for from := 0; from < len(digs); from += per {
		var parent any
		if from > 0 {
			parent = digs[from-1]
		}
		ev := map[string]any{"type": "BlockStored", "block_hashes": digs[from : from+per], "parent_block_hash": parent,
			"token_ids": toks[from*bs : (from+per)*bs], "block_size": bs, "lora_id": nil, "medium": "GPU", "lora_name": nil}
		b, err := msgpack.Marshal([]any{1.5, []any{ev}, 0})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	return out, len(digs)
}

// TestLinksVerifiedWhenIdle: with verification waiting (the default), the
// stored blocks reach the index as each batch is applied and every one is
// verified once the publisher goes quiet; the waiting count returns to 0.
// With a bound too small for any event, each is shed and counted, and
// nothing is recorded. The subscriber leaves no goroutine either way
// (goleak in TestMain).
func TestLinksVerifiedWhenIdle(t *testing.T) {
	for _, tc := range []struct {
		name     string
		defer_   int
		wantShed bool
	}{
		{name: "default bound"},
		{name: "inline", defer_: -1},
		{name: "bound too small", defer_: 64, wantShed: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := eventtest.LoadManifest(t)
			pub := newPublisher(t, "tcp://127.0.0.1:*")
			e := newEnv(t, m, "vllm-a", nil, pub.endpoint, "")
			links := hashing.NewLinks(8 << 20)
			e.cfg.Verify.Links, e.cfg.Verify.LinkDefer = links, tc.defer_
			payloads, blocks := linkedStores(t, &e.cfg.Index.Profile, e.cfg.Index.Context.BlockSize, 40, 8)
			s := mustStart(t, e.cfg)
			defer s.Stop()
			pub.waitSubscribed()
			for i, p := range payloads {
				pub.send(uint64(i+1), p)
			}
			waitSeq(t, s, uint64(len(payloads)))
			if got := len(e.engine.Snapshot()); got != blocks {
				t.Fatalf("%d index operations after the last batch was applied, want %d stores", got, blocks)
			}
			eventtest.WaitFor(t, "waiting verification done", 10*time.Second, func() bool {
				return links.Pending() == 0 && (links.Len() == blocks || links.Shed() > 0)
			})
			if tc.wantShed {
				if links.Shed() != uint64(blocks) || links.Len() != 0 {
					t.Fatalf("shed %d blocks and recorded %d, want %d shed and none recorded", links.Shed(), links.Len(), blocks)
				}
				return
			}
			if links.Len() != blocks || links.Shed() != 0 {
				t.Fatalf("recorded %d links, shed %d; want all %d recorded", links.Len(), links.Shed(), blocks)
			}
		})
	}
}

// TestLinksPendingDroppedOnStop: a subscriber stopped with verification
// still waiting forgets it, and the waiting count goes back to 0.
func TestLinksPendingDroppedOnStop(t *testing.T) {
	m := eventtest.LoadManifest(t)
	pub := newPublisher(t, "tcp://127.0.0.1:*")
	e := newEnv(t, m, "vllm-a", nil, pub.endpoint, "")
	links := hashing.NewLinks(8 << 20)
	e.cfg.Verify.Links = links
	payloads, _ := linkedStores(t, &e.cfg.Index.Profile, e.cfg.Index.Context.BlockSize, 4, 8)
	// Applied events wait while the subscriber is busy: hold it in the
	// apply hook until all are queued, then stop it from there.
	release := make(chan struct{})
	e.cfg.test.onApply = func(seq uint64) {
		if seq == 1 {
			<-release
		}
	}
	s := mustStart(t, e.cfg)
	pub.waitSubscribed()
	for i, p := range payloads {
		pub.send(uint64(i+1), p)
	}
	close(release)
	s.Stop()
	if links.Pending() != 0 {
		t.Fatalf("%d blocks still counted as waiting after Stop", links.Pending())
	}
}
