package hashing

import (
	"errors"
	"strings"
	"testing"
)

func strp(s string) *string { return &s }

func TestResolveRejects(t *testing.T) {
	tests := []struct {
		name   string
		spec   Spec
		member string
	}{
		{"unknown strategy", Spec{"vllm", "sha256", "low64_be", strp("0"), nil}, "strategy"},
		{"empty strategy", Spec{"", "sha256", "low64_be", strp("0"), nil}, "strategy"},
		{"strategy case", Spec{"VLLM_V1", "sha256", "low64_be", strp("0"), nil}, "strategy"},
		{"vllm xxh3_64", Spec{"vllm_v1", "xxh3_64", "low64_be", strp("0"), nil}, "algorithm"},
		{"vllm xxhash case", Spec{"vllm_v1", "XXHASH", "low64_be", strp("0"), nil}, "algorithm"},
		{"vllm xxhash first64", Spec{"vllm_v1", "xxhash", "first64_be", strp("0"), nil}, "index_projection"},
		{"vllm xxhash seed missing", Spec{"vllm_v1", "xxhash_cbor", "low64_be", nil, nil}, "python_hash_seed"},
		{"vllm xxhash unset seed", Spec{"vllm_v1", "xxhash", "low64_be", strp("vllm-none-hash"), nil}, "python_hash_seed"},
		{"vllm xxhash_cbor unset seed", Spec{"vllm_v1", "xxhash_cbor", "low64_be", strp("vllm-none-hash"), nil}, "python_hash_seed"},
		{"vllm sha256_raw", Spec{"vllm_v1", "sha256_raw", "low64_be", strp("0"), nil}, "algorithm"},
		{"vllm algorithm case", Spec{"vllm_v1", "SHA256", "low64_be", strp("0"), nil}, "algorithm"},
		{"vllm first64", Spec{"vllm_v1", "sha256", "first64_be", strp("0"), nil}, "index_projection"},
		{"vllm empty projection", Spec{"vllm_v1", "sha256_cbor", "", strp("0"), nil}, "index_projection"},
		{"vllm seed missing", Spec{"vllm_v1", "sha256", "low64_be", nil, nil}, "python_hash_seed"},
		{"vllm seed empty", Spec{"vllm_v1", "sha256", "low64_be", strp(""), nil}, "python_hash_seed"},
		{"vllm seed sign", Spec{"vllm_v1", "sha256", "low64_be", strp("+42"), nil}, "python_hash_seed"},
		{"vllm seed minus zero", Spec{"vllm_v1", "sha256", "low64_be", strp("-0"), nil}, "python_hash_seed"},
		{"vllm seed space", Spec{"vllm_v1", "sha256", "low64_be", strp(" 42"), nil}, "python_hash_seed"},
		{"vllm seed trailing space", Spec{"vllm_v1", "sha256", "low64_be", strp("42 "), nil}, "python_hash_seed"},
		{"vllm seed overflow", Spec{"vllm_v1", "sha256_cbor", "low64_be", strp("4294967296"), nil}, "python_hash_seed"},
		{"vllm seed huge", Spec{"vllm_v1", "sha256_cbor", "low64_be", strp("99999999999999999999999"), nil}, "python_hash_seed"},
		{"vllm seed Random", Spec{"vllm_v1", "sha256_cbor", "low64_be", strp("Random"), nil}, "python_hash_seed"},
		{"vllm seed unset text case", Spec{"vllm_v1", "sha256_cbor", "low64_be", strp("VLLM-none-hash"), nil}, "python_hash_seed"},
		{"vllm seed unset text space", Spec{"vllm_v1", "sha256", "low64_be", strp("vllm-none-hash "), nil}, "python_hash_seed"},
		{"vllm seed hex", Spec{"vllm_v1", "sha256_cbor", "low64_be", strp("0x10"), nil}, "python_hash_seed"},
		{"vllm seed non-ascii digit", Spec{"vllm_v1", "sha256_cbor", "low64_be", strp("４２"), nil}, "python_hash_seed"},
		{"sglang sha256", Spec{"sglang", "sha256", "first64_be", nil, nil}, "algorithm"},
		{"sglang low64", Spec{"sglang", "sha256_raw", "low64_be", nil, nil}, "index_projection"},
		{"bigram cbor", Spec{"sglang_bigram", "sha256_cbor", "first64_be", nil, nil}, "algorithm"},
		{"bigram low64", Spec{"sglang_bigram", "sha256_raw", "low64_be", strp("0"), nil}, "index_projection"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Resolve(tt.spec)
			var pe *ProfileError
			if !errors.As(err, &pe) {
				t.Fatalf("Resolve = %+v, %v; want *ProfileError", p, err)
			}
			if pe.Member != tt.member {
				t.Errorf("member = %q, want %q (%v)", pe.Member, tt.member, err)
			}
			if !strings.HasPrefix(err.Error(), tt.member+": ") || pe.Msg == "" {
				t.Errorf("error text %q does not name %s", err, tt.member)
			}
			if p != (Profile{}) {
				t.Errorf("profile on error = %+v, want zero", p)
			}
		})
	}
}

// An engine without PYTHONHASHSEED under xxhash has a random root per
// process: the refusal says so and says what to do instead.
func TestResolveXXHashUnsetSeedExplains(t *testing.T) {
	for _, alg := range []string{"xxhash", "xxhash_cbor"} {
		_, err := Resolve(Spec{"vllm_v1", alg, "low64_be", strp("vllm-none-hash"), nil})
		var pe *ProfileError
		if !errors.As(err, &pe) || pe.Member != "python_hash_seed" {
			t.Fatalf("%s: err = %v, want a python_hash_seed ProfileError", alg, err)
		}
		for _, want := range []string{"random root per process", "set PYTHONHASHSEED", alg} {
			if !strings.Contains(pe.Msg, want) {
				t.Errorf("%s: message %q does not say %q", alg, pe.Msg, want)
			}
		}
	}
}

func TestResolveRejectedSeedIsTruncated(t *testing.T) {
	_, err := Resolve(Spec{"vllm_v1", "sha256", "low64_be", strp(strings.Repeat("x", 1<<20)), nil})
	if err == nil || len(err.Error()) > 200 {
		t.Fatalf("error for a 1 MiB seed is %d bytes long", len(err.Error()))
	}
}

func TestResolveAccepts(t *testing.T) {
	tests := []struct {
		spec     Spec
		seedOut  string
		rootHex  string
		proj     Projection
		wantKind kind
	}{
		{Spec{"vllm_v1", "sha256_cbor", "low64_be", strp("0"), nil}, "0",
			"4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e", Low64BE, kindVLLMCBOR},
		{Spec{"vllm_v1", "sha256_cbor", "low64_be", strp("00"), nil}, "00",
			"8d912e4e62b3cc377b1d1c7a14ef61dffbdaa0990237035c05401c29414c4172", Low64BE, kindVLLMCBOR},
		{Spec{"vllm_v1", "sha256_cbor", "low64_be", strp("random"), nil}, "random",
			"78d6ac7e28de859e492449dcea03e3807377d69998c5af819fed33a6df490cad", Low64BE, kindVLLMCBOR},
		{Spec{"vllm_v1", "sha256", "low64_be", strp("4294967295"), nil}, "4294967295",
			"670c2eca46f5f7e11b9dce5c3bd2ff0e9e19567fd45b50c2db5cc0c9aae470d9", Low64BE, kindVLLMPickle},
		{Spec{"vllm_v1", "sha256", "low64_be", strp("random"), nil}, "random",
			"fa1326fc0ad784c54e10f808051a77f999f7b675b12fba49cbef92b3e1a09cb7", Low64BE, kindVLLMPickle},
		{Spec{"vllm_v1", "sha256", "low64_be", strp("00000000000000000004294967295"), nil}, "00000000000000000004294967295", "", Low64BE, kindVLLMPickle},
		// docs/hashing.md#root-digest: every vLLM algorithm and the root
		// of an engine without PYTHONHASHSEED (engine-dialects.md §1).
		{Spec{"vllm_v1", "sha256", "low64_be", strp("vllm-none-hash"), nil}, "vllm-none-hash",
			"066b1e8987e027138e98701c46128929378935f9b6cd1549105ae6b4f0d71198", Low64BE, kindVLLMPickle},
		{Spec{"vllm_v1", "sha256_cbor", "low64_be", strp("vllm-none-hash"), nil}, "vllm-none-hash",
			"9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0", Low64BE, kindVLLMCBOR},
		{Spec{"vllm_v1", "xxhash", "low64_be", strp("0"), nil}, "0", "6fb31cc38bba6066183f7f2104b9c051", Low64BE, kindVLLMXXHPickle},
		{Spec{"vllm_v1", "xxhash_cbor", "low64_be", strp("0"), nil}, "0", "1ebe36576dcb573f26b99533a20aaeca", Low64BE, kindVLLMXXHCBOR},
		{Spec{"vllm_v1", "xxhash", "low64_be", strp("random"), nil}, "random", "c65c9b784048f08f9df9ee060f014076", Low64BE, kindVLLMXXHPickle},
		{Spec{"vllm_v1", "xxhash_cbor", "low64_be", strp("42"), nil}, "42", "a9d2e63407fce1a26c9dc9d7fa2d7caf", Low64BE, kindVLLMXXHCBOR},
		{Spec{"sglang", "sha256_raw", "first64_be", nil, nil}, "0", strings.Repeat("0", 64), First64BE, kindSGLang},
		{Spec{"sglang", "sha256_raw", "first64_be", strp("not even a number"), nil}, "0", strings.Repeat("0", 64), First64BE, kindSGLang},
		{Spec{"sglang_bigram", "sha256_raw", "first64_be", strp("42"), nil}, "0", strings.Repeat("0", 64), First64BE, kindSGLangBigram},
	}
	for _, tt := range tests {
		t.Run(tt.spec.Strategy+"/"+tt.spec.Algorithm+"/"+deref(tt.spec.PythonHashSeed), func(t *testing.T) {
			p, err := Resolve(tt.spec)
			if err != nil {
				t.Fatal(err)
			}
			if p.Strategy != tt.spec.Strategy || p.Algorithm != tt.spec.Algorithm || p.IndexProjection != tt.spec.IndexProjection {
				t.Errorf("selectors not echoed: %+v", p)
			}
			if p.PythonHashSeed != tt.seedOut {
				t.Errorf("python_hash_seed = %q, want %q", p.PythonHashSeed, tt.seedOut)
			}
			if tt.rootHex != "" && p.RootDigestHex() != tt.rootHex {
				t.Errorf("root = %s, want %s", p.RootDigestHex(), tt.rootHex)
			}
			if p.Projection() != tt.proj || p.kind != tt.wantKind {
				t.Errorf("projection %d kind %d, want %d %d", p.Projection(), p.kind, tt.proj, tt.wantKind)
			}
			// Resolving the same spec again gives an == Profile, which is
			// how the registry compares services of one context.
			q, _ := Resolve(tt.spec)
			if p != q {
				t.Error("resolving twice gave unequal profiles")
			}
		})
	}
}

// Leading zeros are significant and SGLang ignores the seed entirely.
func TestResolveProfileEquality(t *testing.T) {
	a, _ := Resolve(Spec{"vllm_v1", "sha256_cbor", "low64_be", strp("0"), nil})
	b, _ := Resolve(Spec{"vllm_v1", "sha256_cbor", "low64_be", strp("00"), nil})
	c, _ := Resolve(Spec{"vllm_v1", "sha256", "low64_be", strp("0"), nil})
	if a == b || a.RootDigest == b.RootDigest {
		t.Error(`"0" and "00" resolved to the same profile`)
	}
	if a.RootDigest == c.RootDigest {
		t.Error("sha256 and sha256_cbor share a root")
	}
	s1, _ := Resolve(Spec{"sglang", "sha256_raw", "first64_be", nil, nil})
	s2, _ := Resolve(Spec{"sglang", "sha256_raw", "first64_be", strp("123"), nil})
	if s1 != s2 {
		t.Error("SGLang profiles differ by an ignored seed")
	}
	s3, _ := Resolve(Spec{"sglang_bigram", "sha256_raw", "first64_be", nil, nil})
	if s1 == s3 {
		t.Error("sglang and sglang_bigram profiles compare equal")
	}
	var zero Profile
	if zero.Projection() != 0 {
		t.Error("zero profile has a projection")
	}
}

// FuzzResolveSeed checks seed validation against strconv-free reasoning:
// accepted iff "random", "vllm-none-hash" or all ASCII digits with value ≤ 2^32−1, and the
// text is echoed unchanged.
func FuzzResolveSeed(f *testing.F) {
	for _, s := range []string{"0", "00", "random", "", "+1", "-0", "4294967295", "4294967296", "0004294967295", " 1", "1e3", "٣", "vllm-none-hash"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, seed string) {
		want := seed == "random" || seed == "vllm-none-hash"
		if !want && seed != "" {
			digits := strings.TrimLeft(seed, "0123456789") == ""
			sig := strings.TrimLeft(seed, "0")
			want = digits && (len(sig) < 10 || (len(sig) == 10 && sig <= "4294967295"))
		}
		p, err := Resolve(Spec{"vllm_v1", "sha256_cbor", "low64_be", &seed, nil})
		if (err == nil) != want {
			t.Fatalf("Resolve(%q) err = %v, want accepted=%v", seed, err, want)
		}
		if err == nil && p.PythonHashSeed != seed {
			t.Fatalf("seed echoed as %q", p.PythonHashSeed)
		}
	})
}
