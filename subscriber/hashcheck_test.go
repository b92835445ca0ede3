package subscriber

import (
	"bytes"
	"strconv"
	"testing"

	"github.com/rs/zerolog"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/hashing/hashcheck"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
)

// engineBlocks hashes tokens block by block as an engine with profile p
// does and returns each block's published hash: vLLM's unsigned low 64
// bits, SGLang's signed first 64.
func engineBlocks(t *testing.T, p *hashing.Profile, bs int, tokens []int32) []any {
	t.Helper()
	var h hashing.BlockHasher
	var parent *[32]byte
	var out []any
	for start := 0; start+bs <= len(tokens); start += bs {
		d, ok := h.Digest(p, parent, tokens[start:start+bs], "", "")
		if !ok {
			t.Fatal("digest")
		}
		parent = &d
		key := p.Key(&d)
		if p.Projection() == hashing.First64BE {
			out = append(out, int64(key))
		} else {
			out = append(out, key)
		}
	}
	return out
}

func mustResolve(t *testing.T, strategy, algorithm, proj string, seed *string) hashing.Profile {
	t.Helper()
	p, err := hashing.Resolve(hashing.Spec{Strategy: strategy, Algorithm: algorithm, IndexProjection: proj, PythonHashSeed: seed})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestHashCheckOverZMQ publishes BlockStored events whose hashes an engine
// computed with its own profile through a real PUB socket, to subscribers
// registered with that profile or a different one. Two events chain four
// blocks: the first starts at the root, the second names its parent by
// integer, which the checker can resolve only after verifying it. A
// registration that agrees with the engine counts matches and logs no
// warning; one that does not counts a mismatch and logs exactly one warning,
// naming the service and carrying no token ids.
func TestHashCheckOverZMQ(t *testing.T) {
	seed0, seed1 := "0", "1"
	vllm := mustResolve(t, hashing.StrategyVLLMV1, hashing.AlgorithmSHA256CBOR, "low64_be", &seed0)
	sglang := mustResolve(t, hashing.StrategySGLang, hashing.AlgorithmSHA256Raw, "first64_be", nil)
	const bs = 4
	// Token ids nothing else in a log line could spell.
	tokens := make([]int32, 4*bs)
	for i := range tokens {
		tokens[i] = int32(7_340_011 + 977*i)
	}
	for _, tc := range []struct {
		name       string
		typ        sourcetype.Type
		engine     hashing.Profile // what the publisher hashes with
		registered hashing.Profile // what the service is registered with
		want       [2]uint64       // matches, mismatches
	}{
		{"vLLM right profile", sourcetype.VLLM, vllm, vllm, [2]uint64{4, 0}},
		{"vLLM wrong seed", sourcetype.VLLM, vllm,
			mustResolve(t, hashing.StrategyVLLMV1, hashing.AlgorithmSHA256CBOR, "low64_be", &seed1), [2]uint64{0, 1}},
		{"vLLM wrong algorithm", sourcetype.VLLM, vllm,
			mustResolve(t, hashing.StrategyVLLMV1, hashing.AlgorithmSHA256, "low64_be", &seed0), [2]uint64{0, 1}},
		{"SGLang right profile", sourcetype.SGLang, sglang, sglang, [2]uint64{4, 0}},
		{"SGLang wrong strategy", sourcetype.SGLang, sglang,
			mustResolve(t, hashing.StrategySGLangBigram, hashing.AlgorithmSHA256Raw, "first64_be", nil), [2]uint64{0, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			logs := &eventtest.LogBuffer{}
			log := zerolog.New(logs)
			key := "hc-" + strconv.Itoa(int(tc.typ)) + "|default|0"
			ctx := eventtest.ContextOf(eventtest.Registration{Modelname: "test-model", BlockSize: bs})
			chk := hashcheck.NewSet(hashcheck.Options{Logger: log}).Add(key, &tc.registered, bs, "")
			pub := newPublisher(t, ipcEndpoint(t, "pub"))
			rec := &eventtest.Recorder{}
			s := mustStart(t, Config{
				Source:    SourceConfig{Key: key, Type: tc.typ, Endpoint: pub.endpoint},
				Index:     IndexConfig{Context: ctx, Profile: tc.registered, Engine: rec, Owner: eventtest.Owner},
				Verify:    VerifyConfig{HashCheck: chk},
				Report:    ReportConfig{Logger: log},
				Resources: NewResources(ResourcesOptions{Counters: NewCounters()}),
			})
			defer s.Stop()
			pub.waitSubscribed()

			hashes := engineBlocks(t, &tc.engine, bs, tokens)
			stored := func(parent any, hs []any, toks []int32) map[string]any {
				m := map[string]any{
					"type": "BlockStored", "block_hashes": hs, "parent_block_hash": parent,
					"token_ids": toks, "block_size": bs, "lora_id": nil,
				}
				if tc.typ == sourcetype.VLLM {
					m["medium"], m["lora_name"] = "GPU", nil
					m["extra_keys"] = make([]any, len(hs)) // no extra keys
				}
				return m
			}
			for i, ev := range []map[string]any{
				stored(nil, hashes[:2], tokens[:2*bs]),
				stored(hashes[1], hashes[2:], tokens[2*bs:]),
			} {
				p, err := msgpack.Marshal([]any{1789095808.5, []any{ev}, nil})
				if err != nil {
					t.Fatal(err)
				}
				pub.send(uint64(i+1), p)
			}
			waitSeq(t, s, 2)
			if n := len(rec.Take()); n != 4 {
				t.Fatalf("%d blocks stored, want 4", n)
			}
			if mt, mm := chk.Counts(); [2]uint64{mt, mm} != tc.want {
				t.Errorf("hash checks {matches, mismatches} = {%d, %d}, want %v", mt, mm, tc.want)
			}
			var warns []map[string]any
			for _, l := range logs.Lines(t) {
				if l["level"] == "warn" {
					warns = append(warns, l)
				}
			}
			if want := int(tc.want[1]); len(warns) != want {
				t.Fatalf("%d warnings, want %d:\n%s", len(warns), want, logs)
			}
			for _, w := range warns {
				if w["service"] != key {
					t.Errorf("warning does not name the service %q: %v", key, w)
				}
			}
			all := logs.String()
			for _, tok := range tokens {
				if bytes.Contains([]byte(all), []byte(strconv.Itoa(int(tok)))) {
					t.Fatalf("token id %d logged:\n%s", tok, all)
				}
			}
		})
	}
}
