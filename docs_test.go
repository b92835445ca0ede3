package main

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestEnginesDocWireExamples: every wire example in docs/engines.md (a
// "<!-- fixture: ID -->" marker, then a hex block and a JSON block) is the
// fixture ID byte for byte and value for value, so the page cannot drift
// from what the decoders are tested against.
func TestEnginesDocWireExamples(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("docs", "engines.md"))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join("testdata", "events", "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var manifest struct {
		Fixtures []struct {
			ID          string          `json:"id"`
			PayloadFile string          `json:"payload_file"`
			MsgpackJSON json.RawMessage `json:"msgpack_json"`
		} `json:"fixtures"`
	}
	if err := json.Unmarshal(raw, &manifest); err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile("(?s)<!-- fixture: ([a-z0-9_]+) -->\\s*```hex\\n(.*?)```\\s*```json\\n(.*?)```")
	examples := re.FindAllSubmatch(doc, -1)
	seen := map[string]bool{}
	for _, ex := range examples {
		id, hexText, jsonText := string(ex[1]), string(ex[2]), ex[3]
		seen[id] = true
		t.Run(id, func(t *testing.T) {
			var found bool
			for _, f := range manifest.Fixtures {
				if f.ID != id {
					continue
				}
				found = true
				payload, err := os.ReadFile(filepath.Join("testdata", "events", f.PayloadFile))
				if err != nil {
					t.Fatal(err)
				}
				got, err := hex.DecodeString(strings.Join(strings.Fields(hexText), ""))
				if err != nil {
					t.Fatalf("hex block: %v", err)
				}
				if !bytes.Equal(got, payload) {
					t.Errorf("hex block differs from %s:\n doc     %x\n fixture %x", f.PayloadFile, got, payload)
				}
				if diff := cmp.Diff(decodeNumbers(t, f.MsgpackJSON), decodeNumbers(t, jsonText)); diff != "" {
					t.Errorf("JSON block differs from the manifest's msgpack_json (-fixture +doc):\n%s", diff)
				}
			}
			if !found {
				t.Fatalf("no fixture %s in the manifest", id)
			}
		})
	}
	for _, want := range []string{"vllm_stored_gpu_2blocks", "sglang_stored_gpu", "mooncake_released_stored_cpu_disk", "vllm_array_layout_27577", "sglang_array_layout_30827"} {
		if !seen[want] {
			t.Errorf("docs/engines.md has no wire example of %s", want)
		}
	}
}

// decodeNumbers decodes JSON keeping integers exact.
func decodeNumbers(t *testing.T, b []byte) any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("%v in %s", err, b)
	}
	return v
}
