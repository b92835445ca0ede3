package events

import (
	"testing"
	"unsafe"

	"github.com/rs/zerolog"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
)

// TestPendingEventBytes: the bound a waiting event is charged covers its
// engineEvent.
func TestPendingEventBytes(t *testing.T) {
	if s := int(unsafe.Sizeof(engineEvent{})); s > pendingEventBytes {
		t.Fatalf("an engineEvent is %d bytes, pendingEventBytes %d", s, pendingEventBytes)
	}
}

type countReporter struct{ applied int }

func (c *countReporter) Report(_ int, res Result, _ Reason) {
	if res == Applied {
		c.applied++
	}
}

// TestPendingLinksChunks: events waiting for verification, spread over
// several chunks, are verified from their copies exactly as they would
// have been in place: every block of the chain ends up a link, a chunk
// is given back once its events are verified, and the bound counts only
// the chunks in use.
func TestPendingLinksChunks(t *testing.T) {
	m := eventtest.LoadManifest(t)
	reg := m.Registration(t, "vllm-a")
	prof := eventtest.ResolveProfile(t, reg)
	links := hashing.NewLinks(8 << 20)
	d := newEngine(&vllmRules, Config{Type: sourcetype.VLLM, Profile: prof, Context: eventtest.ContextOf(reg),
		Engine: &eventtest.Recorder{}, Owner: eventtest.Owner, Logger: zerolog.Nop(), Links: links, LinkDefer: 16 << 20})
	const per, events = 4, 3 * chunkEvents / 2
	bs := reg.BlockSize
	toks := make([]int32, per*events*bs)
	for i := range toks {
		toks[i] = int32(i*13 + 1)
	}
	keys := eventtest.ChainKeys(&prof, bs, toks)
	rep := &countReporter{}
	for from := 0; from < len(keys); from += per {
		var parent any
		if from > 0 {
			parent = keys[from-1]
		}
		p, err := msgpack.Marshal([]any{1.5, []any{map[string]any{"type": "BlockStored", "block_hashes": keys[from : from+per],
			"parent_block_hash": parent, "token_ids": toks[from*bs : (from+per)*bs], "block_size": bs,
			"lora_id": nil, "medium": "GPU", "lora_name": nil}}, 0})
		if err != nil {
			t.Fatal(err)
		}
		if why := d.Decode(p); why != ReasonNone {
			t.Fatalf("envelope rejected: %v", why)
		}
		applyTo(d, rep)
		d.Forget()
	}
	if rep.applied != events || d.PendingLinks() != len(keys) || links.Len() != 0 || len(d.pend.chunks) != 2 {
		t.Fatalf("applied %d events, %d blocks waiting in %d chunks, %d links; want %d, %d in 2, 0",
			rep.applied, d.PendingLinks(), len(d.pend.chunks), links.Len(), events, len(keys))
	}
	if d.pend.held != 2*chunkBytes {
		t.Fatalf("the waiting events hold %d bytes, want two chunks' %d", d.pend.held, 2*chunkBytes)
	}
	if !d.VerifyPending(chunkEvents * per) {
		t.Fatal("nothing left waiting after the first chunk was verified")
	}
	if len(d.pend.chunks) != 1 || d.pend.held != chunkBytes || len(d.pend.free) != 1 {
		t.Fatalf("after the first chunk: %d chunks in use holding %d bytes, %d free; want 1, %d, 1",
			len(d.pend.chunks), d.pend.held, len(d.pend.free), chunkBytes)
	}
	for d.VerifyPending(1) {
	}
	if links.Len() != len(keys) || links.Pending() != 0 || links.Shed() != 0 || d.pend.held != 0 {
		t.Fatalf("%d links, %d waiting, %d shed, %d bytes held; want %d, 0, 0, 0", links.Len(), links.Pending(), links.Shed(), d.pend.held, len(keys))
	}
}

// TestPendingLinksShareOneBound: the sources' backlogs together stay
// within the links' shared bound (hashing.Links.SetBacklogLimit). A
// second source whose burst does not fit sheds it, counted; once the
// first source's backlog is verified or dropped, the bytes are free for
// the other again.
func TestPendingLinksShareOneBound(t *testing.T) {
	m := eventtest.LoadManifest(t)
	reg := m.Registration(t, "vllm-a")
	prof := eventtest.ResolveProfile(t, reg)
	links := hashing.NewLinks(8 << 20)
	links.SetBacklogLimit(chunkBytes)
	newSource := func() *engineDecoder {
		return newEngine(&vllmRules, Config{Type: sourcetype.VLLM, Profile: prof, Context: eventtest.ContextOf(reg),
			Engine: &eventtest.Recorder{}, Owner: eventtest.Owner, Logger: zerolog.Nop(), Links: links, LinkDefer: 16 << 20})
	}
	bs := reg.BlockSize
	store := func(d *engineDecoder, seed int32) int {
		toks := make([]int32, 4*bs)
		for i := range toks {
			toks[i] = seed + int32(i)
		}
		keys := eventtest.ChainKeys(&prof, bs, toks)
		p, err := msgpack.Marshal([]any{1.5, []any{map[string]any{"type": "BlockStored", "block_hashes": keys,
			"parent_block_hash": nil, "token_ids": toks, "block_size": bs, "lora_id": nil, "medium": "GPU", "lora_name": nil}}, 0})
		if err != nil {
			t.Fatal(err)
		}
		if why := d.Decode(p); why != ReasonNone {
			t.Fatalf("envelope rejected: %v", why)
		}
		applyTo(d, &countReporter{})
		d.Forget()
		return len(keys)
	}
	a, b := newSource(), newSource()
	n := store(a, 1)
	if a.PendingLinks() != n || links.BacklogBytes() != chunkBytes {
		t.Fatalf("first source: %d blocks waiting, backlog %d bytes; want %d, %d", a.PendingLinks(), links.BacklogBytes(), n, chunkBytes)
	}
	n = store(b, 1000)
	if b.PendingLinks() != 0 || links.Shed() != uint64(n) || links.BacklogBytes() != chunkBytes {
		t.Fatalf("second source over the shared bound: %d waiting, %d shed, backlog %d; want 0, %d, %d", b.PendingLinks(), links.Shed(), links.BacklogBytes(), n, chunkBytes)
	}
	for a.VerifyPending(1) {
	}
	if links.BacklogBytes() != 0 {
		t.Fatalf("backlog %d bytes after the first source's was verified, want 0", links.BacklogBytes())
	}
	n = store(b, 2000)
	if b.PendingLinks() != n || links.BacklogBytes() != chunkBytes {
		t.Fatalf("second source after the bound freed: %d waiting, backlog %d; want %d, %d", b.PendingLinks(), links.BacklogBytes(), n, chunkBytes)
	}
	b.DropPending()
	if links.BacklogBytes() != 0 || links.Pending() != 0 {
		t.Fatalf("after the second source dropped its backlog: %d bytes, %d blocks; want 0, 0", links.BacklogBytes(), links.Pending())
	}
}
