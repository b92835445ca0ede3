package hashcheck

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/rs/zerolog"

	"github.com/mooncake-conductor-go/conductor/internal/hashing"
)

// manifest is the part of testdata/events/manifest.json these tests read:
// the registrations and each fixture's payload in JSON form.
type manifest struct {
	Registrations map[string]struct {
		Type        string `json:"type"`
		BlockSize   int    `json:"block_size"`
		LoraName    string `json:"lora_name"`
		HashProfile struct {
			Strategy        string  `json:"strategy"`
			Algorithm       string  `json:"algorithm"`
			IndexProjection string  `json:"index_projection"`
			PythonHashSeed  *string `json:"python_hash_seed"`
		} `json:"hash_profile"`
	} `json:"registrations"`
	Fixtures []struct {
		ID           string          `json:"id"`
		Registration string          `json:"registration"`
		MsgpackJSON  json.RawMessage `json:"msgpack_json"`
	} `json:"fixtures"`
}

func loadManifest(t testing.TB) *manifest {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "..", "testdata", "events", "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	return &m
}

// toEvents does what a decoder hook does with a BlockStored event: it turns
// the event's fields into an Event. vLLM's extra_keys entries are lists of
// tagged maps: "lora" (the registered name, already checked by the
// decoder), "cache_salt", and anything else a query cannot carry.
func toEvents(t *testing.T, payload json.RawMessage, proj hashing.Projection, sglang bool) []Event {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var env []any
	if err := dec.Decode(&env); err != nil {
		t.Fatal(err)
	}
	var out []Event
	for _, e := range env[1].([]any) {
		m := e.(map[string]any)
		if m["type"] != "BlockStored" {
			continue
		}
		var ev Event
		ev.BlockSize = atoi(t, m["block_size"])
		for _, h := range m["block_hashes"].([]any) {
			key, digest := hashOf(t, h, proj)
			ev.Keys = append(ev.Keys, key)
			if digest != nil {
				ev.Digests = append(ev.Digests, digest)
			}
		}
		if len(ev.Digests) == 0 {
			ev.Digests = nil
		}
		switch p := m["parent_block_hash"]; {
		case p == nil:
			ev.Parent = Root()
		default:
			key, digest := hashOf(t, p, proj)
			ev.Parent = FromKey(key)
			if digest != nil {
				ev.Parent = FromDigest(digest)
			}
		}
		for _, tok := range m["token_ids"].([]any) {
			if pair, ok := tok.([]any); ok {
				for _, w := range pair {
					ev.Tokens = append(ev.Tokens, int32(atoi(t, w)))
				}
				continue
			}
			ev.Tokens = append(ev.Tokens, int32(atoi(t, tok)))
		}
		if sglang {
			// SGLang's cache_salt is optional: absent means none.
			salt, _ := m["cache_salt"].(string)
			for range ev.Keys {
				ev.Extras = append(ev.Extras, Extras{Known: true, Salt: salt})
			}
		} else if ek, ok := m["extra_keys"].([]any); ok {
			for _, entry := range ek {
				ex := Extras{Known: true}
				items, _ := entry.([]any)
				for _, it := range items {
					tag, _ := it.(map[string]any)
					switch tag["type"] {
					case "lora":
					case "cache_salt":
						ex.Salt, _ = tag["salt"].(string)
					default:
						ex.Foreign = true
					}
				}
				ev.Extras = append(ev.Extras, ex)
			}
		}
		out = append(out, ev)
	}
	return out
}

func atoi(t *testing.T, v any) int {
	t.Helper()
	n, err := strconv.Atoi(string(v.(json.Number)))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// hashOf projects a published hash as the decoders do.
func hashOf(t *testing.T, v any, proj hashing.Projection) (uint64, []byte) {
	t.Helper()
	switch h := v.(type) {
	case json.Number:
		if s, err := strconv.ParseInt(string(h), 10, 64); err == nil {
			k, err := hashing.KeyFromInt(proj, s)
			if err != nil {
				t.Fatal(err)
			}
			return k, nil
		}
		u, err := strconv.ParseUint(string(h), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return u, nil
	case map[string]any:
		b, err := hex.DecodeString(h["$bin"].(string))
		if err != nil {
			t.Fatal(err)
		}
		k, err := hashing.KeyFromBytes(proj, b)
		if err != nil {
			t.Fatal(err)
		}
		return k, b
	}
	t.Fatalf("hash %v of type %T", v, v)
	return 0, nil
}

// TestEventFixtures runs the repository's event fixtures through a checker
// of their registration. Several fixtures pair a salt, a LoRA name or bigram
// tokens with the plain chain's hash (they test decoding, not hashing), and
// those are exactly the mismatches an operator should hear about.
func TestEventFixtures(t *testing.T) {
	m := loadManifest(t)
	type want struct{ matches, mismatches int }
	for _, tc := range []struct {
		id         string
		want       want
		reproduced string // what the one warning names, if anything
	}{
		{"vllm_stored_gpu_2blocks", want{2, 0}, ""},
		{"vllm_stored_gpu_chained", want{2, 0}, ""}, // the second event's integer parent was verified by the first
		{"vllm_stored_bin_hashes", want{2, 0}, ""},
		{"vllm_stored_mla", want{1, 0}, ""},
		{"vllm_stored_ascend_connector_cpu", want{0, 0}, ""}, // no extra_keys: a chain start may be salted
		{"vllm_stored_newest_fields", want{0, 1}, "no cache salt"},
		{"vllm_lora_stored", want{0, 1}, "no LoRA name"},
		{"sglang_stored_gpu", want{1, 0}, ""},
		{"sglang_stored_disk", want{3, 0}, ""},
		{"sglang_stored_salt_session_dp0", want{0, 1}, "no cache salt"},
		// Pairs on the wire mean the engine hashes bigrams; the plain
		// sglang registration does not, which is the point of checking.
		{"sglang_stored_bigram_tokens", want{0, 1}, ""},
		{"sglang_stored_partial_page", want{0, 1}, ""},
	} {
		t.Run(tc.id, func(t *testing.T) {
			var fx *json.RawMessage
			var regName string
			for i := range m.Fixtures {
				if m.Fixtures[i].ID == tc.id {
					fx, regName = &m.Fixtures[i].MsgpackJSON, m.Fixtures[i].Registration
				}
			}
			if fx == nil {
				t.Fatalf("no fixture %s", tc.id)
			}
			reg := m.Registrations[regName]
			hp := reg.HashProfile
			p, err := hashing.Resolve(hashing.Spec{Strategy: hp.Strategy, Algorithm: hp.Algorithm,
				IndexProjection: hp.IndexProjection, PythonHashSeed: hp.PythonHashSeed})
			if err != nil {
				t.Fatal(err)
			}
			var logs bytes.Buffer
			set := NewSet(Options{Logger: zerolog.New(&logs)})
			c := set.Add(regName+"|default|0", &p, reg.BlockSize, reg.LoraName)
			var got want
			for _, ev := range toEvents(t, *fx, p.Projection(), reg.Type == "SGLang") {
				mt, mm := c.CheckEvent(&ev, c.Sample(len(ev.Keys)))
				got.matches += mt
				got.mismatches += mm
			}
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
			if mt, mm := c.Counts(); int(mt) != got.matches || int(mm) != got.mismatches {
				t.Errorf("counts %d/%d, results %+v", mt, mm, got)
			}
			// The WARN of a first mismatch; an INFO about skipped blocks
			// is TestSkipCountsAndNote's.
			var warns [][]byte
			for _, l := range bytes.Split(bytes.TrimSpace(logs.Bytes()), []byte("\n")) {
				if bytes.Contains(l, []byte(`"level":"warn"`)) {
					warns = append(warns, l)
				}
			}
			lines := len(warns)
			if wantLines := min(tc.want.mismatches, 1); lines != wantLines {
				t.Fatalf("%d warnings, want %d: %s", lines, wantLines, logs.String())
			}
			if tc.want == (want{}) {
				var skipped uint64
				for _, n := range c.Skips() {
					skipped += n
				}
				if skipped == 0 {
					t.Errorf("nothing checked and nothing counted as skipped")
				}
			}
			if lines == 1 {
				var line map[string]any
				if err := json.Unmarshal(warns[0], &line); err != nil {
					t.Fatal(err)
				}
				got, _ := line["reproduced_with"].(string)
				if diff := cmp.Diff(tc.reproduced, got); diff != "" {
					t.Errorf("reproduced_with (-want +got): %s\n%s", diff, logs.String())
				}
				if line["service"] != regName+"|default|0" || line["level"] != "warn" {
					t.Errorf("warning %v", line)
				}
			}
		})
	}
}
