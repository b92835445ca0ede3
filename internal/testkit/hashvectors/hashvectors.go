// Package hashvectors loads the golden hash vectors (testdata/hashing at
// the module root, docs/hashing.md#golden-vectors) for the tests that
// replay them: the chain and block hasher (internal/hashing), the ingest
// hash check (hashcheck) and the `conductor hash` command (hashcmd). It is
// test support, imported only from _test.go files, and imports nothing of
// hashing, so hashing's own tests can use it.
package hashvectors

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// PublicFile is the public vector file's name under Dir.
const PublicFile = "hash_vectors_public.json"

// AlgorithmsFile holds every vLLM algorithm (sha256, sha256_cbor, xxhash,
// xxhash_cbor) and root, in Public's format, as CPython's pickle, cbor2
// and the xxhash module compute them; scripts/hashvectors/gen.py writes it.
const AlgorithmsFile = "vllm_algorithms.json"

// Dir is testdata/hashing at the module root, found by walking up from
// the working directory (a package directory under go test) to go.mod.
func Dir(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, "testdata", "hashing")
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("hash vectors: no go.mod above the working directory")
		}
		dir = parent
	}
}

// Load decodes the vector file name (relative to Dir) into v.
func Load(t testing.TB, name string, v any) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(Dir(t), name))
	if err != nil {
		t.Fatalf("read vectors: %v", err)
	}
	if err := json.Unmarshal(raw, v); err != nil {
		t.Fatalf("decode %s: %v", name, err)
	}
}

// LoadPublic is the public vector file.
func LoadPublic(t testing.TB) *Public {
	t.Helper()
	var v Public
	Load(t, PublicFile, &v)
	return &v
}

// Public is the public vector file: seed roots, wire examples and cases.
type Public struct {
	Format       string        `json:"format"`
	CaseCount    int           `json:"case_count"`
	SeedRoots    []SeedRoot    `json:"seed_roots"`
	WireExamples []WireExample `json:"wire_examples"`
	Cases        []Case        `json:"cases"`
}

// SeedRoot is a profile's root digest (and, for vLLM, its hashed input).
type SeedRoot struct {
	Strategy       string  `json:"strategy"`
	Algorithm      string  `json:"algorithm"`
	PythonHashSeed *string `json:"python_hash_seed"`
	RootInputHex   *string `json:"root_input_hex"`
	RootDigest     string  `json:"root_digest"`
}

// WireExample is one event encoding of a block hash and the key it gives.
type WireExample struct {
	IndexProjection string `json:"index_projection"`
	WireType        string `json:"wire_type"`
	WireValue       string `json:"wire_value"`
	Key             string `json:"key"`
	KeyHex          string `json:"key_hex"`
}

// Profile is a case's hash profile, as the /register fields name it.
type Profile struct {
	Strategy        string  `json:"strategy"`
	Algorithm       string  `json:"algorithm"`
	IndexProjection string  `json:"index_projection"`
	PythonHashSeed  *string `json:"python_hash_seed"`
}

// Case is one prompt under one profile and the blocks it hashes to.
type Case struct {
	ID         string  `json:"id"`
	Profile    Profile `json:"profile"`
	RootDigest string  `json:"root_digest"`
	TokenCount int     `json:"token_count"`
	Query
	Expected []Block `json:"expected"`
}

// Block is one expected block of a case.
type Block struct {
	Index        int    `json:"index"`
	Span         [2]int `json:"span"`
	TokenSpan    []int  `json:"token_span"`
	Covered      int    `json:"covered"`
	InputHex     string `json:"input_hex"`
	InputLen     int    `json:"input_len"`
	InputHeadHex string `json:"input_head_hex"`
	InputTailHex string `json:"input_tail_hex"`
	Digest       string `json:"digest"`
	Projected    string `json:"projected"`
	ProjectedHex string `json:"projected_hex"`
	WireInt      string `json:"wire_int"`
}

// Repeat is a value repeated Count times, for long inputs kept short.
type Repeat[T any] struct {
	Value T   `json:"value"`
	Count int `json:"count"`
}

// Query is the prompt of a case, in every vector format: token ids, LoRA
// name and cache salt, each given outright or as a repeat.
type Query struct {
	BlockSize       int             `json:"block_size"`
	LoraName        *string         `json:"lora_name"`
	LoraNameRepeat  *Repeat[string] `json:"lora_name_repeat"`
	CacheSalt       *string         `json:"cache_salt"`
	CacheSaltRepeat *Repeat[string] `json:"cache_salt_repeat"`
	TokenIDs        []int32         `json:"token_ids"`
	TokenIDsRepeat  *Repeat[int32]  `json:"token_ids_repeat"`
}

// Expand is the query's token ids, LoRA name and cache salt with the
// repeats written out.
func (q Query) Expand() (toks []int32, lora, salt string) {
	toks = q.TokenIDs
	if r := q.TokenIDsRepeat; r != nil {
		toks = make([]int32, r.Count)
		for i := range toks {
			toks[i] = r.Value
		}
	}
	return toks, text(q.LoraName, q.LoraNameRepeat), text(q.CacheSalt, q.CacheSaltRepeat)
}

func text(s *string, r *Repeat[string]) string {
	if r != nil {
		return strings.Repeat(r.Value, r.Count)
	}
	if s != nil {
		return *s
	}
	return ""
}
