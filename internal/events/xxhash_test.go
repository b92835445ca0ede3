package events

import (
	"testing"

	"github.com/rs/zerolog"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/hashing/hashcheck"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
)

// TestVLLMDigestForms: a vLLM engine under each algorithm publishes its
// blocks as integers (low64_be) or as raw digests (32 bytes, 16 under
// xxhash and xxhash_cbor), its parent likewise; every form is stored
// under the key a query computes, verified into links and matched by
// the hash check (engine-dialects.md §1).
func TestVLLMDigestForms(t *testing.T) {
	m := eventtest.LoadManifest(t)
	reg := m.Registration(t, "vllm-a")
	bs := reg.BlockSize
	for _, alg := range []string{"sha256", "sha256_cbor", "xxhash", "xxhash_cbor"} {
		for _, asBin := range []bool{false, true} {
			name := alg + "/int"
			if asBin {
				name = alg + "/bin"
			}
			t.Run(name, func(t *testing.T) {
				seed := "0"
				if alg == "sha256" {
					seed = hashing.SeedVLLMNoneHash
				}
				prof, err := hashing.Resolve(hashing.Spec{Strategy: "vllm_v1", Algorithm: alg, IndexProjection: "low64_be", PythonHashSeed: &seed})
				if err != nil {
					t.Fatal(err)
				}
				links := hashing.NewLinks(8 << 20)
				checks := hashcheck.NewSet(hashcheck.Options{Warmup: 1000})
				check := checks.Add("svc", &prof, bs, "")
				rec := &eventtest.Recorder{}
				d := newEngine(&vllmRules, Config{Type: sourcetype.VLLM, Profile: prof, Context: eventtest.ContextOf(reg),
					Engine: rec, Owner: eventtest.Owner, Logger: zerolog.Nop(), Links: links, Check: check})
				toks := make([]int32, 6*bs)
				for i := range toks {
					toks[i] = int32(i*7 + 3)
				}
				// The chain's digests, as the engine publishes them.
				c := hashing.AcquireChain()
				c.Reset(&prof, bs, toks, "", "")
				var keys []uint64
				var digests [][]byte
				for {
					k, _, ok := c.Next()
					if !ok {
						break
					}
					dg := c.Digest()
					keys = append(keys, k)
					digests = append(digests, append([]byte(nil), prof.DigestBytes(&dg)...))
				}
				hashing.ReleaseChain(c)
				if len(keys) != 6 || len(digests[0]) != prof.DigestLen() {
					t.Fatalf("%d blocks, digest of %d bytes", len(keys), len(digests[0]))
				}
				wire := func(i int) any {
					if asBin {
						return digests[i]
					}
					return keys[i]
				}
				for from := 0; from < 6; from += 3 {
					var parent any
					if from > 0 {
						parent = wire(from - 1)
					}
					hashes := []any{wire(from), wire(from + 1), wire(from + 2)}
					p, err := msgpack.Marshal([]any{1.5, []any{map[string]any{"type": "BlockStored", "block_hashes": hashes,
						"parent_block_hash": parent, "token_ids": toks[from*bs : (from+3)*bs], "block_size": bs,
						"lora_id": nil, "medium": "GPU", "lora_name": nil, "extra_keys": []any{nil, nil, nil}}}, 0})
					if err != nil {
						t.Fatal(err)
					}
					if why := d.Decode(p); why != ReasonNone {
						t.Fatalf("envelope rejected: %v", why)
					}
					rep := &countReporter{}
					applyTo(d, rep)
					d.Forget()
					if rep.applied != 1 {
						t.Fatalf("event at block %d not applied", from)
					}
				}
				var stored []uint64
				for _, op := range rec.Take() {
					if op.Kind == "store" {
						stored = append(stored, op.Key)
					}
				}
				if len(stored) != len(keys) {
					t.Fatalf("stored %d keys, want %d", len(stored), len(keys))
				}
				for i := range keys {
					if stored[i] != keys[i] {
						t.Errorf("block %d stored under %d, the query's key is %d", i, stored[i], keys[i])
					}
				}
				if links.Len() != len(keys) {
					t.Errorf("%d blocks verified into links, want %d", links.Len(), len(keys))
				}
				if m, mm := check.Counts(); m != uint64(len(keys)) || mm != 0 {
					t.Errorf("hash check: %d matches, %d mismatches; want %d, 0 (skips %v)", m, mm, len(keys), check.Skips())
				}
				// A query takes the verified digests and gets the same keys.
				q := hashing.AcquireChain()
				q.Reset(&prof, bs, toks, "", "")
				q.UseLinks(links)
				for i := range keys {
					if k, _, ok := q.Next(); !ok || k != keys[i] {
						t.Fatalf("linked query block %d = %d, %v; want %d", i, k, ok, keys[i])
					}
				}
				hashing.ReleaseChain(q) // counts its link hits
				if hits, _, _ := links.Stats(); hits != uint64(len(keys)) {
					t.Errorf("the query took %d verified links, want %d", hits, len(keys))
				}
			})
		}
	}
}
