package hashcmd

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/hashvectors"
)

// TestGoldenVectors runs the subcommand, as an integrator would, on every
// public vector and every vector of vLLM's four algorithms and roots
// (hashvectors.AlgorithmsFile) and compares each printed block with the
// expected key, event integer and digest.
func TestGoldenVectors(t *testing.T) {
	for _, file := range []string{hashvectors.PublicFile, hashvectors.AlgorithmsFile} {
		t.Run(file, func(t *testing.T) {
			var v hashvectors.Public
			hashvectors.Load(t, file, &v)
			runVectors(t, &v)
		})
	}
}

func runVectors(t *testing.T, v *hashvectors.Public) {
	checked := 0
	for _, tc := range v.Cases {
		t.Run(tc.ID, func(t *testing.T) {
			toks, lora, salt := tc.Expand()
			if toks == nil {
				toks = []int32{}
			}
			in, _ := json.Marshal(toks)
			pr := tc.Profile
			args := []string{"--json", "--strategy", pr.Strategy, "--algorithm", pr.Algorithm,
				"--index-projection", pr.IndexProjection, "--block-size", strconv.Itoa(tc.BlockSize)}
			if pr.PythonHashSeed != nil {
				args = append(args, "--seed", *pr.PythonHashSeed)
			}
			if lora != "" {
				args = append(args, "--lora-name", lora)
			}
			if salt != "" {
				args = append(args, "--cache-salt", salt)
			}
			var out, errOut bytes.Buffer
			code := Run(args, bytes.NewReader(in), &out, &errOut)
			if pr.Strategy != "vllm_v1" && slices.ContainsFunc(toks, func(t int32) bool { return t < 0 }) {
				// The engine cannot hash these; the query path finds no
				// block, and the subcommand says why.
				if code != 2 || len(tc.Expected) != 0 || !strings.Contains(errOut.String(), "negative") {
					t.Fatalf("exit %d, stderr %q, vector blocks %d", code, errOut.String(), len(tc.Expected))
				}
				return
			}
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut.String())
			}
			var got []Block
			sc := bufio.NewScanner(&out)
			sc.Buffer(nil, 1<<20)
			for sc.Scan() {
				var b Block
				if err := json.Unmarshal(sc.Bytes(), &b); err != nil {
					t.Fatalf("line %q: %v", sc.Text(), err)
				}
				got = append(got, b)
			}
			want := make([]Block, len(tc.Expected))
			for i, e := range tc.Expected {
				want[i] = Block{Index: e.Index, Start: e.Span[0], End: e.Span[1], Covered: e.Covered,
					Key: e.Projected, KeyHex: e.ProjectedHex, Event: e.WireInt, Digest: e.Digest}
			}
			if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
				t.Fatalf("blocks (-want +got):\n%s", diff)
			}
			checked += len(got)
		})
	}
	if checked == 0 {
		t.Fatal("no block compared")
	}
}

// TestTextOutput pins the default, human-readable form: one line per block.
func TestTextOutput(t *testing.T) {
	var out, errOut bytes.Buffer
	code := Run([]string{"--strategy", "vllm_v1", "--algorithm", "sha256_cbor", "--seed", "0", "--block-size", "4"},
		strings.NewReader("[1, 2, 3, 4, 5, 6, 7, 8, 9]"), &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	want := "block 0  positions [0,4)  key 2164874634404590027 (0x1e0b2e028ef071cb)  event 2164874634404590027  digest c9d58ba695280d69b243e1e0df813136ca9196b286fb1a021e0b2e028ef071cb\n" +
		"block 1  positions [4,8)  key 17270480062156288726 (0xefad121d154ab2d6)  event 17270480062156288726  digest 24125b23e68883b5c2141db2959d48433fe6bde2f26bd914efad121d154ab2d6\n"
	if diff := cmp.Diff(want, out.String()); diff != "" {
		t.Errorf("output (-want +got):\n%s", diff)
	}
	if errOut.Len() != 0 {
		t.Errorf("stderr %q", errOut.String())
	}
}

// TestSGLangEventIsSigned checks that the event column is the signed
// integer SGLang publishes, not the key.
func TestSGLangEventIsSigned(t *testing.T) {
	var out, errOut bytes.Buffer
	code := Run([]string{"--strategy", "sglang", "--block-size", "4", "--json"},
		strings.NewReader("[11,12,13,14]"), &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	var b Block
	if err := json.Unmarshal(out.Bytes(), &b); err != nil {
		t.Fatal(err)
	}
	if b.Event != "-685567553150498463" || b.Key != "17761176520559053153" {
		t.Errorf("event %s key %s", b.Event, b.Key)
	}
}

// TestVLLMDefaults: an engine at vLLM's defaults (sha256, PYTHONHASHSEED
// unset) is hashed with --seed vllm-none-hash; an xxhash digest prints in
// its 32 hex digits.
func TestVLLMDefaults(t *testing.T) {
	for _, tc := range []struct {
		args   []string
		key    string
		digest string
	}{
		{[]string{"--algorithm", "sha256", "--seed", "vllm-none-hash"}, "1403909460543360175",
			"7b255da405e1d722823892e4fef187b4d8ac78215d7f0dd2137bb037547f4caf"},
		{[]string{"--algorithm", "xxhash", "--seed", "0"}, "11844795890135418255", "6ba7d7fc1608e5f0a4612b1b0c87458f"},
	} {
		var out, errOut bytes.Buffer
		args := append([]string{"--strategy", "vllm_v1", "--block-size", "16", "--json"}, tc.args...)
		code := Run(args, strings.NewReader("[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]"), &out, &errOut)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", tc.args, code, errOut.String())
		}
		var b Block
		if err := json.Unmarshal(out.Bytes(), &b); err != nil {
			t.Fatal(err)
		}
		if b.Key != tc.key || b.Event != tc.key || b.Digest != tc.digest {
			t.Errorf("%v: key %s event %s digest %s; want %s, %s", tc.args, b.Key, b.Event, b.Digest, tc.key, tc.digest)
		}
	}
}

func TestFileInput(t *testing.T) {
	p := filepath.Join(t.TempDir(), "toks.json")
	if err := os.WriteFile(p, []byte("[1,2,3,4]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	code := Run([]string{"--strategy", "vllm_v1", "--algorithm", "sha256_cbor", "--seed", "0", "--block-size", "4", "--file", p, "--json"},
		strings.NewReader("not read"), &out, &errOut)
	if code != 0 || !strings.Contains(out.String(), `"key":"2164874634404590027"`) {
		t.Fatalf("exit %d, out %q, err %q", code, out.String(), errOut.String())
	}
}

// TestUsageErrors: every bad flag or input exits 2 with a message naming
// what was wrong, and prints no block.
func TestUsageErrors(t *testing.T) {
	vllm := []string{"--strategy", "vllm_v1", "--algorithm", "sha256_cbor", "--seed", "0", "--block-size", "4"}
	for _, tc := range []struct {
		name  string
		args  []string
		stdin string
		msg   string
	}{
		{"unknown flag", []string{"--bogus"}, "[]", "flag provided but not defined"},
		{"no strategy", []string{"--block-size", "4"}, "[]", "--strategy is required"},
		{"bad strategy", []string{"--strategy", "vllm", "--block-size", "4"}, "[]", "--strategy: unsupported strategy"},
		{"vllm without algorithm", []string{"--strategy", "vllm_v1", "--seed", "0", "--block-size", "4"}, "[]", "--algorithm: unsupported algorithm"},
		{"vllm without seed", []string{"--strategy", "vllm_v1", "--algorithm", "sha256", "--block-size", "4"}, "[]", "--seed: required"},
		{"bad seed", []string{"--strategy", "vllm_v1", "--algorithm", "sha256", "--seed", "-1", "--block-size", "4"}, "[]", "--seed: invalid seed"},
		{"xxhash unset seed", []string{"--strategy", "vllm_v1", "--algorithm", "xxhash", "--seed", "vllm-none-hash", "--block-size", "4"}, "[]", "--seed: \"vllm-none-hash\" is not a root of algorithm xxhash: vLLM started without PYTHONHASHSEED draws a random root per process"},
		{"xxhash_cbor unset seed", []string{"--strategy", "vllm_v1", "--algorithm", "xxhash_cbor", "--seed", "vllm-none-hash", "--block-size", "4"}, "[]", "set PYTHONHASHSEED"},
		{"bad projection", []string{"--strategy", "sglang", "--index-projection", "low64_be", "--block-size", "4"}, "[]", "--index-projection"},
		{"no block size", []string{"--strategy", "sglang"}, "[]", "--block-size must be"},
		{"negative block size", []string{"--strategy", "sglang", "--block-size", "-4"}, "[]", "--block-size must be"},
		{"stray argument", append(vllm, "extra"), "[]", "unexpected arguments"},
		{"not json", vllm, "1,2,3", "want a JSON array"},
		{"object", vllm, `{"token_ids": [1]}`, "want a JSON array"},
		{"null", vllm, "null", "got null"},
		{"float", vllm, "[1.5]", "element 0 (1.5)"},
		{"string element", vllm, `[1, "2"]`, "element 1 is not a number"},
		{"beyond int32", vllm, "[1, 2147483648]", "element 1 (2147483648)"},
		{"trailing data", vllm, "[1] [2]", "unexpected data"},
		{"missing file", append(vllm, "--file", "/nonexistent/toks.json"), "", "no such file"},
		{"sglang negative id", []string{"--strategy", "sglang", "--block-size", "2"}, "[1, -2]", "negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := Run(tc.args, strings.NewReader(tc.stdin), &out, &errOut)
			if code != 2 {
				t.Errorf("exit %d, want 2", code)
			}
			if !strings.Contains(errOut.String(), tc.msg) {
				t.Errorf("stderr %q does not contain %q", errOut.String(), tc.msg)
			}
			if out.Len() != 0 {
				t.Errorf("stdout %q", out.String())
			}
		})
	}
}

func TestHelpExitsZero(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := Run([]string{"--help"}, strings.NewReader(""), &out, &errOut); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if !strings.Contains(errOut.String(), "-strategy") {
		t.Errorf("help %q lacks the flags", errOut.String())
	}
}

// TestShortInput: fewer tokens than a block is not an error, but says so.
func TestShortInput(t *testing.T) {
	var out, errOut bytes.Buffer
	code := Run([]string{"--strategy", "vllm_v1", "--algorithm", "sha256", "--seed", "0", "--block-size", "4"},
		strings.NewReader("[1,2,3]"), &out, &errOut)
	if code != 0 || out.Len() != 0 || !strings.Contains(errOut.String(), "make no block") {
		t.Fatalf("exit %d, out %q, err %q", code, out.String(), errOut.String())
	}
}

// TestStandardVectors runs the subcommand on the standard hash's vectors
// (docs/hashing.md#standard-hash-rfc1527): default seed 1337 and seed 0.
func TestStandardVectors(t *testing.T) {
	ids := func(n int) []byte {
		toks := make([]int32, n)
		for i := range toks {
			toks[i] = int32(i + 1)
		}
		b, _ := json.Marshal(toks)
		return b
	}
	for _, tc := range []struct {
		args []string
		in   []byte
		want []string
	}{
		{[]string{"--strategy", "rfc1527", "--block-size", "16"}, ids(32), []string{"16863443419780771464", "12466389667045779788"}},
		{[]string{"--strategy", "rfc1527", "--algorithm", "xxh3_64", "--seed", "1337", "--block-size", "16"}, ids(64),
			[]string{"16863443419780771464", "12466389667045779788", "960926348267535642", "4923844688253642376"}},
		{[]string{"--strategy", "rfc1527", "--seed", "0", "--block-size", "16"}, ids(32), []string{"15195734001507359261", "18166693838618995723"}},
	} {
		var out, errOut bytes.Buffer
		if code := Run(append([]string{"--json"}, tc.args...), bytes.NewReader(tc.in), &out, &errOut); code != 0 {
			t.Fatalf("%v: exit %d: %s", tc.args, code, errOut.String())
		}
		var got []string
		dec := json.NewDecoder(&out)
		for dec.More() {
			var b Block
			if err := dec.Decode(&b); err != nil {
				t.Fatal(err)
			}
			if b.Event != b.Key || len(b.Digest) != 16 || b.Digest != b.KeyHex {
				t.Errorf("%v: block %+v: the key is the event value and the whole hash", tc.args, b)
			}
			got = append(got, b.Key)
		}
		if d := cmp.Diff(tc.want, got); d != "" {
			t.Errorf("%v (-want +got):\n%s", tc.args, d)
		}
	}
	for _, bad := range [][]string{
		{"--strategy", "rfc1527", "--seed", "-1", "--block-size", "16"},
		{"--strategy", "rfc1527", "--algorithm", "sha256", "--block-size", "16"},
		{"--strategy", "rfc1527", "--index-projection", "low64_be", "--block-size", "16"},
		{"--strategy", "rfc1527", "--cache-salt", "x", "--block-size", "16"},
	} {
		var out, errOut bytes.Buffer
		if code := Run(bad, bytes.NewReader(ids(32)), &out, &errOut); code != 2 || errOut.Len() == 0 {
			t.Errorf("%v: exit %d, stderr %q; want a usage error", bad, code, errOut.String())
		}
	}
}
