// Package eventfixtures builds the KV-event ingest fixtures under
// testdata/events: one MessagePack payload (or frame set) per case, the
// manifest that says what ingesting each must do, and the multi-message
// scenarios. `go run ./testdata/events/gen` writes them; the test here
// checks that the committed files are exactly what the code produces, so a
// fixture can only change through this code.
//
// The payloads mirror what each publisher emits, key order included (it is
// the publishers' packing order), and the hashes they carry are recomputed
// here independently of the hashing package under test. docs/events.md
// describes the rules the expectations encode.
package eventfixtures

import (
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Files returns every generated file by its path relative to
// testdata/events.
func Files() map[string][]byte {
	checkGolden()
	files := map[string][]byte{}
	var records []any
	for _, f := range fixtures() {
		records = append(records, f.record(files))
	}
	manifest := m(
		"format", "events-fixtures/1",
		"json_notes", "Integers are exact; decode with arbitrary precision (Go: json.Decoder.UseNumber). "+
			`{"$bin": hex} is a MessagePack bin; {"$pairs": [...]} is a map given as ordered key/value pairs `+
			"(duplicate or non-string keys). Hash prefixes in expectations are decimal strings of the projected uint64.",
		"golden", m(
			"vllm_tokens", vllmTokens,
			"vllm_block_digests", []any{hexOf(vllmDig[0]), hexOf(vllmDig[1])},
			"vllm_low64", decimal(v1, v2),
			"sglang_tokens", sglTokens,
			"sglang_block_digests", digestsHex(sglDig),
			"sglang_first64_unsigned", decimal(sU...),
			"sglang_wire_signed", decimal(sS...),
		),
		"registrations", registrations,
		"fixtures", records,
	)
	files["manifest.json"] = marshalJSON(manifest)
	files["scenarios.json"] = marshalJSON(m("format", "events-scenarios/1", "scenarios", scenarios()))
	return files
}

func digestsHex(ds [][32]byte) []any {
	out := make([]any, len(ds))
	for i, d := range ds {
		out[i] = hexOf(d)
	}
	return out
}

// record renders the fixture's manifest entry and adds its payload file.
func (f F) record(files map[string][]byte) omap {
	rec := m("id", f.ID, "source_type", f.Source, "registration", f.Reg, "producer", f.Producer)
	if regs, ok := alsoRegistered[f.Reg]; ok {
		rec = rec.with("also_registered", regs)
	}
	if req, ok := requires[f.ID]; ok {
		rec = rec.with("requires", req)
	}
	if f.Frames != nil {
		hexes := make([]any, len(f.Frames))
		for i, fr := range f.Frames {
			hexes[i] = hex.EncodeToString(fr)
		}
		name := "payloads/" + f.ID + ".frames.msgpack"
		frames := make([]any, len(f.Frames))
		for i, fr := range f.Frames {
			frames[i] = fr
		}
		files[name] = packMsgpack(frames)
		rec = rec.with("frames_hex", hexes, "frames_file", name)
	} else {
		data := f.Raw
		if !f.HasRaw {
			data = packMsgpack(f.Payload)
		}
		name := "payloads/" + f.ID + ".msgpack"
		files[name] = data
		rec = rec.with("topic_hex", hex.EncodeToString(f.Topic), "seq", f.Seq,
			"seq_hex", hex.EncodeToString(seq8(f.Seq)), "payload_file", name, "payload_len", len(data))
		if len(data) <= 160 {
			rec = rec.with("payload_hex", hex.EncodeToString(data))
		}
		if f.Payload != nil {
			rec = rec.with("msgpack_json", jsonView(f.Payload))
		}
	}
	rec = rec.with("expect", f.Expect)
	if f.Note != "" {
		rec = rec.with("note", f.Note)
	}
	return rec
}

// Write replaces the generated files under dir (testdata/events): stale
// payloads of fixtures that no longer exist are removed first, so the
// directory always matches the table exactly. Hand-written files there
// (README.md) are left alone.
func Write(dir string) (int, error) {
	payloads := filepath.Join(dir, "payloads")
	if err := os.MkdirAll(payloads, 0o755); err != nil {
		return 0, fmt.Errorf("eventfixtures: %w", err)
	}
	old, err := os.ReadDir(payloads)
	if err != nil {
		return 0, fmt.Errorf("eventfixtures: %w", err)
	}
	for _, e := range old {
		if strings.HasSuffix(e.Name(), ".msgpack") {
			if err := os.Remove(filepath.Join(payloads, e.Name())); err != nil {
				return 0, fmt.Errorf("eventfixtures: %w", err)
			}
		}
	}
	files := Files()
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if err := os.WriteFile(filepath.Join(dir, filepath.FromSlash(name)), files[name], 0o644); err != nil {
			return 0, fmt.Errorf("eventfixtures: %w", err)
		}
	}
	return len(names), nil
}
