package grpcapi

import (
	"crypto/sha256"
	"math"
	"testing"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	pb "github.com/mooncake-conductor-go/conductor/internal/inferencecache/proto/inferencecache/v1alpha1"
	"github.com/mooncake-conductor-go/conductor/internal/query"
	"github.com/mooncake-conductor-go/conductor/internal/tokenmemo"
)

// TestConductorSchemeInputs: a Conductor context answers chains of 8-byte
// keys and of 32-byte digests (reduced by the profile's projection), exact
// prefix hashes, tiers from its cumulative counts, and refuses hashes of
// other lengths.
func TestConductorSchemeInputs(t *testing.T) {
	f := newFixture(t, nil)
	prof := vllmProfile(t)
	tbl := f.cat.Ensure(index.ContextKey{Tenant: "t", Model: "m", BlockSize: 16}, prof).Table
	a := tbl.AddEngineOwner("a", 0)
	a1 := tbl.AddEngineOwner("a", 1)
	b := tbl.AddEngineOwner("b", 0)
	var digests [][]byte
	var keys []uint64
	for i := range 6 {
		d := sha256.Sum256([]byte{byte(i)})
		k, err := hashing.KeyFromBytes(hashing.Low64BE, d[:])
		if err != nil {
			t.Fatal(err)
		}
		digests, keys = append(digests, d[:]), append(keys, k)
	}
	for i, k := range keys {
		tbl.Store(a, index.Put{Key: k, Tier: index.Device})
		if i < 5 {
			tbl.Store(a1, index.Put{Key: k, Tier: index.Device}) // rank 1 shorter, on device
		}
		if i < 4 {
			tbl.Store(b, index.Put{Key: k, Tier: index.CPULocal})
		}
	}
	tbl.Remove(a, index.Put{Key: keys[5], Tier: index.Device})
	tbl.Store(a, index.Put{Key: keys[5], Tier: index.Disk}) // a's rank 0: 5 blocks on device, the 6th on disk

	scheme := "conductor/vllm_v1/sha256_cbor/0/16"
	want := &pb.LookupRouteResponse{ReasonCode: PrefixMatch, ReplicaScores: []*pb.ReplicaScore{
		score("a", 96*(1-1.0/2), 96, 1, t3), score("b", 0, 64, 1, t2),
	}}
	byDigest := &pb.LookupRouteRequest{TenantId: "t", ModelId: "m", HashScheme: scheme}
	for _, d := range digests {
		byDigest.BlockHashes = append(byDigest.BlockHashes, d)
		byDigest.BlockTokenCounts = append(byDigest.BlockTokenCounts, 16)
	}
	check(t, "32-byte digests", f.lookup(byDigest), want)
	check(t, "8-byte keys", f.lookup(&pb.LookupRouteRequest{TenantId: "t", ModelId: "m", HashScheme: scheme,
		BlockHashes: chainReq("", 16, keys...).BlockHashes, BlockTokenCounts: chainReq("", 16, keys...).BlockTokenCounts}), want)
	exact := &pb.LookupRouteRequest{TenantId: "t", ModelId: "m", HashScheme: scheme, PrefixHash: key8(keys[4]), PrefixTokenCount: 80}
	check(t, "exact", f.lookup(exact), &pb.LookupRouteResponse{ReasonCode: PrefixMatch, ReplicaScores: []*pb.ReplicaScore{score("a", 80*(1-1.0/2), 80, 1, t1)}})
	bad := &pb.LookupRouteRequest{TenantId: "t", ModelId: "m", HashScheme: scheme, BlockHashes: [][]byte{make([]byte, 7)}, BlockTokenCounts: []int32{16}}
	check(t, "7-byte hash", f.lookup(bad), &pb.LookupRouteResponse{ReasonCode: NoHint})
	// The seed is part of the scheme: another seed names nothing.
	byDigest.HashScheme = "conductor/vllm_v1/sha256_cbor/1/16"
	check(t, "other seed", f.lookup(byDigest), &pb.LookupRouteResponse{ReasonCode: UnknownHashScheme})
	if got := ConductorScheme(&prof, 16); got != scheme {
		t.Fatalf("ConductorScheme = %q", got)
	}
}

// TestTokenIdsPastInt32: ids past 2^31−1 cannot be hashed under a Conductor
// profile (NO_HINT), whether the ids were decoded in full, served by the
// token memo (a repeat), or partly served and partly decoded; the same
// prompts with small ids are answered.
func TestTokenIdsPastInt32(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.TokenMemo = tokenmemo.New(1 << 20); o.MinMatchedTokens = -1 })
	prof := vllmProfile(t)
	tbl := f.cat.Ensure(index.ContextKey{Tenant: "t", Model: "m", BlockSize: 16}, prof).Table
	a := tbl.AddEngineOwner("a", 0)
	small := make([]int32, 640)
	for i := range small {
		small[i] = int32(100 + 3*i)
	}
	for k := range chainKeys(&prof, 16, small, "", nil) {
		tbl.Store(a, index.Put{Key: k, Tier: index.Device})
	}
	ids := func(big map[int]uint32) []uint32 {
		out := make([]uint32, len(small))
		for i, v := range small {
			out[i] = uint32(v)
		}
		for i, v := range big {
			out[i] = v
		}
		return out
	}
	scheme := "conductor/vllm_v1/sha256_cbor/0/16"
	for _, c := range []struct {
		name string
		ids  []uint32
		want string
	}{
		{"small", ids(nil), PrefixMatch},
		{"small again (memo)", ids(nil), PrefixMatch},
		{"big last", ids(map[int]uint32{639: 1 << 31}), NoHint},
		{"big last again (memo)", ids(map[int]uint32{639: 1 << 31}), NoHint},
		{"big in the middle, small prefix from the memo", ids(map[int]uint32{400: math.MaxUint32}), NoHint},
		{"big first", ids(map[int]uint32{0: 1 << 31}), NoHint},
		{"big first again (memo)", ids(map[int]uint32{0: 1 << 31}), NoHint},
		{"four-byte id below 2^31", ids(map[int]uint32{639: 1 << 25}), PrefixMatch},
	} {
		resp := f.lookup(&pb.LookupRouteRequest{TenantId: "t", ModelId: "m", HashScheme: scheme, TokenIds: c.ids})
		if resp.ReasonCode != c.want {
			t.Errorf("%s: %v, want %s", c.name, resp, c.want)
		}
	}
}

// vllmProfile is vLLM's default block-hash profile (sha256_cbor, seed 0),
// which the Conductor-scheme tests, benchmarks and fuzz target index with.
func vllmProfile(tb testing.TB) hashing.Profile {
	tb.Helper()
	seed := "0"
	prof, err := hashing.Resolve(hashing.Spec{Strategy: "vllm_v1", Algorithm: "sha256_cbor", IndexProjection: "low64_be", PythonHashSeed: &seed})
	if err != nil {
		tb.Fatal(err)
	}
	return prof
}

// TestTokenMemoLearnsOnlyForAContext: token_ids lookups naming no known
// scope (tenant, model or scheme) leave the token memo empty, as /query's
// does for queries without a context; one for a known context fills it.
func TestTokenMemoLearnsOnlyForAContext(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.TokenMemo = tokenmemo.New(1 << 20) })
	tbl := f.cat.Ensure(index.ContextKey{Tenant: "t", Model: "m", BlockSize: 16}, vllmProfile(t)).Table
	tbl.AddEngineOwner("a", 0)
	ids := make([]uint32, 1000)
	for i := range ids {
		ids[i] = uint32(i*7919)%150000 + 1
	}
	scheme := "conductor/vllm_v1/sha256_cbor/0/16"
	for _, c := range []struct{ tenant, model, scheme, want string }{
		{"u", "m", scheme, UnknownTenant},
		{"t", "x", scheme, UnknownModel},
		{"t", "m", "conductor/vllm_v1/sha256_cbor/0/32", UnknownHashScheme},
		{"u", "m", "vllm", UnknownTenant},
	} {
		resp := f.lookup(&pb.LookupRouteRequest{TenantId: c.tenant, ModelId: c.model, HashScheme: c.scheme, TokenIds: ids})
		if resp.ReasonCode != c.want {
			t.Fatalf("%s/%s/%s: %v, want %s", c.tenant, c.model, c.scheme, resp, c.want)
		}
		if n := f.srv.opts.TokenMemo.Bytes(); n != 0 {
			t.Fatalf("a lookup for %s/%s/%s left %d bytes in the token memo", c.tenant, c.model, c.scheme, n)
		}
	}
	f.lookup(&pb.LookupRouteRequest{TenantId: "t", ModelId: "m", HashScheme: scheme, TokenIds: ids})
	if f.srv.opts.TokenMemo.Bytes() == 0 {
		t.Fatal("a lookup for a known context taught the token memo nothing")
	}
}

// TestConductorAffinityForTokenIDs: a Conductor token_ids lookup nobody
// matches picks by the chain the profile derives from the ids, the same
// whether its blocks were hashed or, for a system prompt seen before,
// taken from the prefix memo (which it then is).
func TestConductorAffinityForTokenIDs(t *testing.T) {
	memo := hashing.NewMemo(1 << 20)
	f := newFixture(t, func(o *Options) {
		o.Engine = query.New(query.Options{Contexts: o.Contexts, Memo: memo})
		o.MinMatchedTokens = -1
	})
	prof := vllmProfile(t)
	tbl := f.cat.Ensure(index.ContextKey{Tenant: "t", Model: "m", BlockSize: 16}, prof).Table
	for i, r := range []string{"a", "b", "c"} {
		tbl.Store(tbl.AddEngineOwner(r, 0), index.Put{Key: uint64(i + 1), Tier: index.Device})
	}
	prompt := func(tail uint32) []uint32 {
		ids := make([]uint32, 1024+48) // a 64-block system prompt, 3 blocks of its own
		for i := range ids {
			ids[i] = uint32(i*31) % 50000
		}
		for i := 1024; i < len(ids); i++ {
			ids[i] += tail
		}
		return ids
	}
	for i, ids := range [][]uint32{prompt(1), prompt(2), prompt(1)} {
		toks := make([]int32, len(ids))
		for j, v := range ids {
			toks[j] = int32(v)
		}
		var hashes [][]byte
		for k := range chainKeys(&prof, 16, toks, "", nil) {
			hashes = append(hashes, key8(k))
		}
		want := wantPick(chainSeed(hashes), []string{"a", "b", "c"})
		got := f.lookup(&pb.LookupRouteRequest{TenantId: "t", ModelId: "m", HashScheme: "conductor/vllm_v1/sha256_cbor/0/16", TokenIds: ids})
		if got.ReasonCode != AffinityHint || len(got.ReplicaScores) != 1 || got.ReplicaScores[0].ReplicaId != want {
			t.Fatalf("prompt %d: got %v, want affinity for %s", i, got, want)
		}
	}
	// The second prompt's 64 shared blocks, the third's 67, came from the
	// memo (the query engine's walk, stopped at the first block, took one
	// of each).
	if hits, _ := memo.Stats(); hits < 64+67 {
		t.Fatalf("%d blocks taken from the prefix memo, want at least %d", hits, 64+67)
	}
}

// TestStandardScheme: an rfc1527 context's scheme is
// conductor/rfc1527/xxh3_64/<seed>/<block size>; its 8-byte keys are the
// standard hashes themselves, and another seed names nothing.
func TestStandardScheme(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.MinMatchedTokens = -1 })
	prof, err := hashing.Resolve(hashing.Spec{Strategy: "rfc1527", Algorithm: "xxh3_64"})
	if err != nil {
		t.Fatal(err)
	}
	tbl := f.cat.Ensure(index.ContextKey{Tenant: "t", Model: "m", BlockSize: 16}, prof).Table
	a := tbl.AddEngineOwner("a", 0)
	keys := []uint64{16863443419780771464, 12466389667045779788}
	for _, k := range keys {
		tbl.Store(a, index.Put{Key: k, Tier: index.Device})
	}
	scheme := "conductor/rfc1527/xxh3_64/1337/16"
	if got := ConductorScheme(&prof, 16); got != scheme {
		t.Fatalf("ConductorScheme = %q, want %q", got, scheme)
	}
	req := chainReq("", 16, keys...)
	req.TenantId, req.ModelId, req.HashScheme = "t", "m", scheme
	check(t, "standard keys", f.lookup(req), &pb.LookupRouteResponse{ReasonCode: PrefixMatch, ReplicaScores: []*pb.ReplicaScore{score("a", 32, 32, 1, t1)}})
	req.HashScheme = "conductor/rfc1527/xxh3_64/0/16"
	check(t, "other seed", f.lookup(req), &pb.LookupRouteResponse{ReasonCode: UnknownHashScheme})
}

// TestConductorSchemeVLLMAlgorithms: contexts registered under each vLLM
// algorithm and root (engine-dialects.md §1) are named by
// conductor/vllm_v1/<algorithm>/<seed>/<block size> and answer token ids,
// 8-byte keys and full digests of their algorithm's size (16 bytes for
// xxhash and xxhash_cbor), and no digest of the other size.
func TestConductorSchemeVLLMAlgorithms(t *testing.T) {
	for _, c := range []struct{ alg, seed, scheme string }{
		{"sha256", "vllm-none-hash", "conductor/vllm_v1/sha256/vllm-none-hash/16"},
		{"sha256_cbor", "vllm-none-hash", "conductor/vllm_v1/sha256_cbor/vllm-none-hash/16"},
		{"xxhash", "0", "conductor/vllm_v1/xxhash/0/16"},
		{"xxhash_cbor", "42", "conductor/vllm_v1/xxhash_cbor/42/16"},
	} {
		t.Run(c.alg, func(t *testing.T) {
			f := newFixture(t, func(o *Options) { o.MinMatchedTokens = -1 })
			seed := c.seed
			prof, err := hashing.Resolve(hashing.Spec{Strategy: "vllm_v1", Algorithm: c.alg, IndexProjection: "low64_be", PythonHashSeed: &seed})
			if err != nil {
				t.Fatal(err)
			}
			if got := ConductorScheme(&prof, 16); got != c.scheme {
				t.Fatalf("ConductorScheme = %q, want %q", got, c.scheme)
			}
			tbl := f.cat.Ensure(index.ContextKey{Tenant: "t", Model: "m", BlockSize: 16}, prof).Table
			a := tbl.AddEngineOwner("a", 0)
			toks := make([]int32, 64)
			ids := make([]uint32, len(toks))
			for i := range toks {
				toks[i] = int32(7 + 5*i)
				ids[i] = uint32(toks[i])
			}
			ch := hashing.AcquireChain()
			ch.Reset(&prof, 16, toks, "", "")
			byDigest := &pb.LookupRouteRequest{TenantId: "t", ModelId: "m", HashScheme: c.scheme}
			wrong := &pb.LookupRouteRequest{TenantId: "t", ModelId: "m", HashScheme: c.scheme}
			for {
				k, _, ok := ch.Next()
				if !ok {
					break
				}
				tbl.Store(a, index.Put{Key: k, Tier: index.Device})
				d := ch.Digest()
				raw := append([]byte(nil), prof.DigestBytes(&d)...)
				if len(raw) != prof.DigestLen() {
					t.Fatalf("digest of %d bytes", len(raw))
				}
				byDigest.BlockHashes = append(byDigest.BlockHashes, raw)
				byDigest.BlockTokenCounts = append(byDigest.BlockTokenCounts, 16)
				other := make([]byte, 48-len(raw)) // the other algorithms' size
				copy(other[len(other)-8:], raw[len(raw)-8:])
				wrong.BlockHashes = append(wrong.BlockHashes, other)
				wrong.BlockTokenCounts = append(wrong.BlockTokenCounts, 16)
			}
			hashing.ReleaseChain(ch)
			want := &pb.LookupRouteResponse{ReasonCode: PrefixMatch, ReplicaScores: []*pb.ReplicaScore{score("a", 64, 64, 1, t1)}}
			check(t, "token ids", f.lookup(&pb.LookupRouteRequest{TenantId: "t", ModelId: "m", HashScheme: c.scheme, TokenIds: ids}), want)
			check(t, "full digests", f.lookup(byDigest), want)
			check(t, "digests of the other size", f.lookup(wrong), &pb.LookupRouteResponse{ReasonCode: NoHint})
		})
	}
}
