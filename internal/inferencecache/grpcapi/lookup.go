package grpcapi

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"iter"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/contexts"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/inferencecache/fingerprint"
	"github.com/mooncake-conductor-go/conductor/internal/inferencecache/producer"
	pb "github.com/mooncake-conductor-go/conductor/internal/inferencecache/proto/inferencecache/v1alpha1"
	"github.com/mooncake-conductor-go/conductor/internal/query"
)

// Reason codes LookupRoute answers with.
const (
	PrefixMatch         = "PREFIX_MATCH"
	TenantHot           = "TENANT_HOT"
	AffinityHint        = "AFFINITY_HINT"
	NoHint              = "NO_HINT"
	PolicyRequiresChain = "POLICY_REQUIRES_CHAIN"
	Timeout             = "TIMEOUT"
	UnknownTenant       = "UNKNOWN_TENANT"
	UnknownModel        = "UNKNOWN_MODEL"
	UnknownHashScheme   = "UNKNOWN_HASH_SCHEME"
)

var allReasons = []string{PrefixMatch, TenantHot, AffinityHint, NoHint, PolicyRequiresChain, Timeout, UnknownTenant, UnknownModel, UnknownHashScheme}

// hotWindow and hotHitRate define TENANT_HOT: a replica that reported a
// hit rate of at least hotHitRate within hotWindow.
const (
	hotWindow  = 5 * time.Minute
	hotHitRate = 0.1
	// sloFastTTFT: requests with 0 < ttft_ms below it favour fresh replicas.
	sloFastTTFT = 200
)

// inputKind is which of the request's inputs the lookup uses (docs/grpc.md, LookupRoute: Input).
type inputKind uint8

const (
	inChain inputKind = iota + 1
	inExact
	inTokens
	inPrompt
)

// candidate is one replica's match before scoring.
type candidate struct {
	replica  string
	matched  int
	tier     pb.CacheTier
	fresh    float64
	pressure float64
}

// scored is a candidate (by index) with its score.
type scored struct {
	c     int32
	score float64
}

// lookupState is pooled per call so a warm lookup reuses its buffers.
type lookupState struct {
	res    index.QueryResult
	toks   []int32 // the request's token_ids, read as int32
	keys   []uint64
	chain  byteChain
	cands  []candidate
	scored []scored
	pop    []string
	// seedProf, when set, is the Conductor profile token_ids are hashed
	// with, for the affinity seed of a lookup that found nothing.
	seedProf *hashing.Profile
	seedBS   int
	// idsNarrow: the request's token ids are known to fit an int32.
	idsNarrow bool
}

var lookupPool = sync.Pool{New: func() any { return new(lookupState) }}

// byteChain is an index.Chain over precomputed keys; covered is covs[i],
// or fixed when covs is nil.
type byteChain struct {
	keys  []uint64
	covs  []int32
	fixed int
	i     int
}

// Ready reports every remaining key as ready: they are all computed, so
// the walk may read them in batches, one stripe lock per stripe touched
// (index.ReadyChain).
func (c *byteChain) Ready() int { return len(c.keys) - c.i }

func (c *byteChain) Next() (uint64, int, bool) {
	if c.i >= len(c.keys) {
		return 0, 0, false
	}
	k, cv := c.keys[c.i], c.fixed
	if c.covs != nil {
		cv = int(c.covs[c.i])
	}
	c.i++
	return k, cv, true
}

// conductorScheme is a parsed "conductor/<strategy>/<algorithm>/<seed>/<block_size>".
type conductorScheme struct {
	strategy, algorithm, seed string
	blockSize                 int
}

// parseConductorScheme reports whether scheme belongs to the Conductor
// family, and its parts when they parse (ok=false: it names nothing).
func parseConductorScheme(scheme string) (cs conductorScheme, family, ok bool) {
	rest, family := strings.CutPrefix(scheme, "conductor/")
	if !family {
		return cs, false, false
	}
	// Four parts, cut one by one: every lookup parses its scheme, and
	// splitting allocated.
	var p [4]string
	for i := range 3 {
		var ok bool
		if p[i], rest, ok = strings.Cut(rest, "/"); !ok || p[i] == "" {
			return cs, true, false
		}
	}
	p[3] = rest
	if strings.Contains(p[3], "/") {
		return cs, true, false
	}
	bs, err := strconv.Atoi(p[3])
	if err != nil || bs <= 0 || strconv.Itoa(bs) != p[3] {
		return cs, true, false
	}
	return conductorScheme{p[0], p[1], p[2], bs}, true, true
}

// ConductorScheme is the hash_scheme naming a Conductor context's keys.
// Its seed is the first the catalogue files the context under
// (contexts.SchemeSeeds): "-" for SGLang strategies.
func ConductorScheme(p *hashing.Profile, blockSize int) string {
	seed := contexts.SchemeSeeds(p)[0]
	return "conductor/" + p.Strategy + "/" + p.Algorithm + "/" + seed + "/" + strconv.Itoa(blockSize)
}

// LookupRoute answers which replicas hold the request's prefix. It never
// returns an error status: bad or unanswerable input is an empty answer
// with a reason code, and the index is only read.
func (s *Server) LookupRoute(ctx context.Context, req *pb.LookupRouteRequest) (*pb.LookupRouteResponse, error) {
	return s.lookupRoute(ctx, req, nil), nil
}

// lookupRoute is LookupRoute; bufs, when not nil, are those the server's
// codec decoded req into: what they say of its token ids (known to fit an
// int32, so not checked again; a run the token memo may learn) holds.
func (s *Server) lookupRoute(ctx context.Context, req *pb.LookupRouteRequest, bufs *decodeBufs) *pb.LookupRouteResponse {
	start := time.Now()
	resp := s.lookup(ctx, req, start, bufs)
	el := time.Since(start)
	if req.GetTenantId() != ProbeTenant {
		resp.LookupLatencyUs = el.Microseconds()
	}
	s.m.lookup.Observe(el.Seconds())
	s.m.reason(resp.ReasonCode)
	return resp
}

// expired reports whether the caller's deadline or the server's lookup
// timeout has passed. The deadline is compared with the clock: a context's
// Err turns non-nil only once its timer has run, which for a deadline of a
// few microseconds (grpc-timeout "1u") is often after the whole lookup, so
// Err alone answered such a caller with scores.
func (s *Server) expired(ctx context.Context, start time.Time) bool {
	now := time.Now()
	if dl, ok := ctx.Deadline(); ok && !now.Before(dl) {
		return true
	}
	return ctx.Err() != nil || now.Sub(start) > s.opts.LookupTimeout
}

func (s *Server) lookup(ctx context.Context, req *pb.LookupRouteRequest, start time.Time, bufs *decodeBufs) *pb.LookupRouteResponse {
	tenant, model, scheme, adapter := req.GetTenantId(), req.GetModelId(), req.GetHashScheme(), req.GetAdapterId()
	// Answers are made only where they are returned: a warm lookup that
	// matches allocates no spare ones.
	bad := func() *pb.LookupRouteResponse { return &pb.LookupRouteResponse{ReasonCode: NoHint} }
	if tenant == ProbeTenant {
		return bad()
	}
	if s.expired(ctx, start) {
		return &pb.LookupRouteResponse{ReasonCode: Timeout}
	}
	if tenant == "" || model == "" || scheme == "" {
		return bad()
	}
	var kind inputKind
	hs, cs := req.GetBlockHashes(), req.GetBlockTokenCounts()
	switch {
	case len(hs) > 0 || len(cs) > 0:
		if len(hs) != len(cs) || len(hs) > MaxChainBlocks {
			return bad()
		}
		for i, h := range hs {
			if len(h) == 0 || cs[i] < 0 {
				return bad()
			}
		}
		kind = inChain
	case len(req.GetPrefixHash()) > 0:
		kind = inExact
	case len(req.GetTokenIds()) > 0:
		if len(req.GetTokenIds()) > MaxTokenIDs {
			return bad()
		}
		kind = inTokens
	case req.GetPromptText() != "":
		kind = inPrompt
	default:
		return bad()
	}
	if s.opts.RequireChain && kind != inChain {
		return &pb.LookupRouteResponse{ReasonCode: PolicyRequiresChain}
	}
	// echo answers the request's partition with no scores.
	echo := func() *pb.LookupRouteResponse { return &pb.LookupRouteResponse{ReasonCode: NoHint, AdapterId: adapter} }
	if kind == inPrompt {
		return echo() // no tokenizer in this project
	}

	st := lookupPool.Get().(*lookupState)
	defer func() {
		// The request's memory is not kept past the call.
		st.toks, st.chain = nil, byteChain{}
		lookupPool.Put(st)
	}()
	st.cands, st.pop, st.seedProf, st.idsNarrow = st.cands[:0], st.pop[:0], nil, bufs != nil && bufs.idsNarrow
	var m match
	conductor := false
	if csch, family, ok := parseConductorScheme(scheme); family {
		conductor = true
		m = s.matchConductor(req, kind, csch, ok, st)
	} else {
		m = s.matchProducer(req, kind, st)
	}
	lv := m.level
	if lv == producer.HasScheme && bufs != nil {
		// The request names a scope that exists: the token memo may
		// learn its ids now (as /query's learns only for a context).
		bufs.memo.Teach()
	}
	if s.expired(ctx, start) {
		return &pb.LookupRouteResponse{ReasonCode: Timeout}
	}
	if m.bad {
		return bad()
	}
	if m.short {
		return echo()
	}
	if resp := s.rank(req, st); resp != nil {
		return resp
	}
	miss := echo()
	switch {
	case lv == producer.NoTenant:
		miss.ReasonCode = UnknownTenant
	case lv == producer.NoModel:
		miss.ReasonCode = UnknownModel
	case lv == producer.NoScheme:
		miss.ReasonCode = UnknownHashScheme
	case m.hot && kind != inChain:
		miss.ReasonCode = TenantHot
	case !s.opts.NoAffinity && len(st.pop) > 0:
		var derived iter.Seq[uint64] // the token_ids path's chain
		if kind == inTokens {
			derived = slices.Values(st.keys)
			if conductor {
				derived = nil
				if st.seedProf != nil {
					derived = chainKeys(st.seedProf, st.seedBS, st.toks, adapter, s.query.Memo())
				}
			}
		}
		pick := affinityPick(req, kind, derived, len(st.pop))
		miss.ReasonCode = AffinityHint
		miss.ReplicaScores = []*pb.ReplicaScore{{ReplicaId: st.pop[pick]}}
	}
	return miss
}

// rank scores the candidates, filters and orders them (docs/grpc.md,
// LookupRoute: Score, Filters and order), and returns the PREFIX_MATCH
// answer, or nil when nobody qualifies.
func (s *Server) rank(req *pb.LookupRouteRequest, st *lookupState) (resp *pb.LookupRouteResponse) {
	total := len(st.pop)
	out := st.scored[:0]
	best := math.Inf(-1)
	for i := range st.cands {
		c := &st.cands[i]
		if c.matched <= 0 || (s.opts.MinMatchedTokens > 0 && c.matched < s.opts.MinMatchedTokens) {
			continue
		}
		dp := 1.0
		if total > 1 {
			n := 0
			for j := range st.cands {
				if st.cands[j].matched >= c.matched {
					n++
				}
			}
			dp = 0
			if n < total {
				dp = 1 - float64(n)/float64(total)
			}
		}
		slo := 1.0
		if t := req.GetSlo().GetTtftMs(); t > 0 && t < sloFastTTFT {
			slo = 1 + c.fresh
		}
		sc := float64(c.matched) * c.fresh * clamp01(1-c.pressure) * slo * dp
		out = append(out, scored{int32(i), sc})
		best = max(best, sc)
	}
	st.scored = out
	if len(out) == 0 || (s.opts.ScoreFloor > 0 && best < s.opts.ScoreFloor) {
		return nil
	}
	slices.SortFunc(out, func(a, b scored) int {
		if a.score != b.score {
			return cmp.Compare(b.score, a.score)
		}
		return cmp.Compare(st.cands[a.c].replica, st.cands[b.c].replica)
	})
	// The scores go out with the answer, after the call: with it in one
	// allocation for the usual few replicas, else one block of them.
	var block []pb.ReplicaScore
	var res []*pb.ReplicaScore
	switch n := len(out); {
	case n <= 2:
		a := new(answer2)
		resp, block, res = &a.resp, a.block[:n], a.ptrs[:n:n]
	case n <= 8:
		a := new(answer8)
		resp, block, res = &a.resp, a.block[:n], a.ptrs[:n:n]
	default:
		resp, block, res = new(pb.LookupRouteResponse), make([]pb.ReplicaScore, n), make([]*pb.ReplicaScore, n)
	}
	resp.ReplicaScores, resp.ReasonCode, resp.AdapterId = res, PrefixMatch, req.GetAdapterId()
	for i, o := range out {
		c := &st.cands[o.c]
		r := &block[i]
		r.ReplicaId, r.Score = c.replica, float32(o.score)
		r.MatchedTokens, r.EstimatedCacheHitProb, r.Tier = int32(min(c.matched, math.MaxInt32)), float32(c.fresh), c.tier
		res[i] = r
	}
	return resp
}

// answer2 and answer8 are a matching answer with room for its scores, in
// one allocation.
type (
	answer2 struct {
		resp  pb.LookupRouteResponse
		ptrs  [2]*pb.ReplicaScore
		block [2]pb.ReplicaScore
	}
	answer8 struct {
		resp  pb.LookupRouteResponse
		ptrs  [8]*pb.ReplicaScore
		block [8]pb.ReplicaScore
	}
)

func clamp01(f float64) float64 { return min(1, max(0, f)) }

// tierOf is the coldest tier needed to serve a run of run tokens, from
// cumulative tier counts: T1 if engine memory covers it, T2 if host memory
// (local or shared) does, else T3.
func tierOf(c index.TierCounts, run int) pb.CacheTier {
	switch {
	case c.Device >= run:
		return pb.CacheTier_CACHE_TIER_T1
	case c.CPUShare >= run:
		return pb.CacheTier_CACHE_TIER_T2
	}
	return pb.CacheTier_CACHE_TIER_T3
}

// bestRun is an instance's longest run over its ranks and the warmest tier
// serving a run that long.
func bestRun(ih *index.InstanceHits) (int, pb.CacheTier) {
	run, tier := 0, pb.CacheTier_CACHE_TIER_UNSPECIFIED
	for _, r := range ih.Ranks {
		n := r.Disk
		if n == 0 {
			continue
		}
		t := tierOf(r.TierCounts, n)
		if n > run || (n == run && t < tier) {
			run, tier = n, t
		}
	}
	return run, tier
}

// match is what matching a lookup against the contexts or the producer
// scope its scheme names found, in one shape for both families: how much of
// the scope path exists (the reason code of a miss), and whether the lookup
// ends before ranking.
type match struct {
	level producer.Level
	bad   bool // the request cannot be answered: NO_HINT
	short bool // fewer tokens than one block: the partition echoed, no scores
	hot   bool // a producer scope whose replicas hit often lately (TENANT_HOT)
}

// matchConductor matches the request against the Conductor context the
// scheme names, fills st.cands and st.pop, and says how much of the scope
// path exists.
func (s *Server) matchConductor(req *pb.LookupRouteRequest, kind inputKind, cs conductorScheme, parsed bool, st *lookupState) match {
	var lv producer.Level
	tenant, model, adapter := req.GetTenantId(), req.GetModelId(), req.GetAdapterId()
	var found *contexts.Entry
	cat := s.opts.Contexts
	// The scheme's contexts in one map read (one per LoRA name). They come
	// in no order; the affinity seed's profile is that of the greatest
	// context, so the pick does not depend on the order.
	var seedCtx index.ContextKey
	if parsed {
		sk := contexts.SchemeKey{Tenant: tenant, Model: model, Strategy: cs.strategy, Algorithm: cs.algorithm, Seed: cs.seed, BlockSize: cs.blockSize}
		for _, e := range cat.ByScheme(sk) {
			t := e.Table
			if t.OwnerCount() == 0 {
				continue
			}
			c := t.Context()
			lv = producer.HasScheme
			st.pop = t.AppendInstances(st.pop)
			if st.seedProf == nil || c.Compare(seedCtx) > 0 {
				st.seedProf, st.seedBS, seedCtx = &e.Profile, c.BlockSize, c
			}
			if c.Lora == adapter {
				found = e
			}
		}
	}
	// Without the scheme, how much of the path exists: the model, or only
	// the tenant (the reason code says which).
	switch {
	case lv == producer.HasScheme:
	case anyOwned(cat.ByModel(tenant, model)):
		lv = producer.NoScheme
	case anyOwned(cat.ByTenant(tenant)):
		lv = producer.NoModel
	}
	if lv < producer.NoScheme {
		lv = max(lv, s.opts.Producer.Holds(tenant, model, "\x00"))
	}
	slices.Sort(st.pop)
	st.pop = slices.Compact(st.pop)
	var proj hashing.Projection
	if found != nil {
		proj = found.Profile.Projection()
	} else if cs.strategy == hashing.StrategyVLLMV1 {
		proj = hashing.Low64BE
	} else {
		proj = hashing.First64BE
	}
	// A full digest is the scheme's algorithm's: 32 bytes, or 16 for
	// vLLM's xxhash and xxhash_cbor (docs/grpc.md#hash-schemes).
	digestLen := hashing.AlgorithmDigestLen(cs.algorithm)
	keyOf := func(b []byte) (uint64, bool) {
		switch len(b) {
		case 8:
			return binary.BigEndian.Uint64(b), true
		case digestLen:
			k, err := hashing.KeyFromBytes(proj, b)
			return k, err == nil
		}
		return 0, false
	}
	var chain index.Chain
	switch kind {
	case inChain:
		st.keys = st.keys[:0]
		for _, h := range req.GetBlockHashes() {
			k, ok := keyOf(h)
			if !ok {
				return match{level: lv, bad: true}
			}
			st.keys = append(st.keys, k)
		}
		st.chain = byteChain{keys: st.keys, covs: req.GetBlockTokenCounts()}
		chain = &st.chain
	case inExact:
		k, ok := keyOf(req.GetPrefixHash())
		if !ok {
			return match{level: lv, bad: true}
		}
		n := int(req.GetPrefixTokenCount())
		if n <= 0 {
			n = cs.blockSize
		}
		st.keys = append(st.keys[:0], k)
		st.chain = byteChain{keys: st.keys, fixed: n}
		chain = &st.chain
	case inTokens:
		ids := req.GetTokenIds()
		if !st.idsNarrow && !fitInt32(ids) {
			return match{level: lv, bad: true}
		}
		// Every id fits in int32, so the same memory read as int32 is the
		// token array /query would hash; the chain only reads it.
		st.toks = unsafe.Slice((*int32)(unsafe.Pointer(unsafe.SliceData(ids))), len(ids))
		if parsed && len(ids) < cs.blockSize {
			return match{level: lv, short: true}
		}
		if found == nil {
			return match{level: lv}
		}
		// The query engine hashes and walks exactly as /query does (same
		// prefix memo), so both doors give one answer for one prompt.
		if err := s.query.LookupFound(found, &query.Request{Context: found.Table.Context(), Tokens: st.toks}, &st.res); err != nil {
			return match{level: lv, bad: true}
		}
	}
	if found == nil {
		return match{level: lv}
	}
	if chain != nil {
		found.Table.Query(chain, "", &st.res)
	}
	for i := range st.res.Instances {
		ih := &st.res.Instances[i]
		if run, tier := bestRun(ih); run > 0 {
			st.cands = append(st.cands, candidate{replica: ih.Instance, matched: run, tier: tier, fresh: 1})
		}
	}
	return match{level: lv}
}

// fitInt32 reports whether every id is at most MaxInt32. It ORs the ids
// two to a 64-bit word, four words a step, and tests the two sign bits
// once: an id at a time this check cost a tenth of a warm 8K-token lookup.
func fitInt32(ids []uint32) bool {
	var or uint64
	// The words must be aligned (the race detector's pointer checks
	// insist); a leading odd id is taken alone.
	if len(ids) > 0 && uintptr(unsafe.Pointer(&ids[0]))%8 != 0 {
		or, ids = uint64(ids[0]), ids[1:]
	}
	if n := len(ids) / 8 * 8; n > 0 {
		w := unsafe.Slice((*uint64)(unsafe.Pointer(&ids[0])), n/2)
		for ; len(w) >= 4; w = w[4:] {
			or |= w[0] | w[1] | w[2] | w[3]
		}
		ids = ids[n:]
	}
	for _, id := range ids {
		or |= uint64(id)
	}
	return or&0x8000_0000_8000_0000 == 0
}

// chainKeys yields the key of every block of ids under p, as the query
// engine hashes them. memo (nil: none) is the server's prefix memo: a
// prompt opening with a system prompt seen before reuses its digests
// instead of hashing every block with SHA-256, and the keys are the same.
// The memo learns the chain once it is hashed, as a query's.
func chainKeys(p *hashing.Profile, bs int, ids []int32, adapter string, memo *hashing.Memo) iter.Seq[uint64] {
	return func(yield func(uint64) bool) {
		ch := hashing.AcquireChain()
		defer hashing.ReleaseChain(ch)
		ch.Reset(p, bs, ids, adapter, "")
		ch.UseMemo(memo)
		for k, _, ok := ch.Next(); ok; k, _, ok = ch.Next() {
			if !yield(k) {
				return
			}
		}
	}
}

// matchProducer matches the request against a producer-fed scope.
func (s *Server) matchProducer(req *pb.LookupRouteRequest, kind inputKind, st *lookupState) match {
	tenant, model, scheme, adapter := req.GetTenantId(), req.GetModelId(), req.GetHashScheme(), req.GetAdapterId()
	ps := s.opts.Producer
	lv := ps.Holds(tenant, model, scheme)
	// A Conductor context of the tenant (and model) counts too.
	switch cat := s.opts.Contexts; {
	case lv >= producer.NoScheme:
	case anyOwned(cat.ByModel(tenant, model)):
		lv = producer.NoScheme
	case anyOwned(cat.ByTenant(tenant)):
		lv = max(lv, producer.NoModel)
	}
	st.pop = ps.AppendReplicas(st.pop, tenant, model, scheme)
	var chain index.Chain
	exactTokens := false
	switch kind {
	case inChain:
		st.keys = st.keys[:0]
		for _, h := range req.GetBlockHashes() {
			st.keys = append(st.keys, producerKey(h))
		}
		st.chain = byteChain{keys: st.keys, covs: req.GetBlockTokenCounts()}
	case inExact:
		st.keys = append(st.keys[:0], producerKey(req.GetPrefixHash()))
		st.chain = byteChain{keys: st.keys, fixed: 1}
		exactTokens = true
	case inTokens:
		if scheme != "vllm" && scheme != "sglang" {
			return match{level: lv, short: true}
		}
		bs := s.opts.FingerprintBlockSize
		ids := req.GetTokenIds()
		if len(ids) < bs {
			return match{level: lv, short: true}
		}
		st.keys = fingerprint.Chain(st.keys[:0], ids, bs, nil)
		st.chain = byteChain{keys: st.keys, fixed: bs}
	}
	chain = &st.chain
	sc, ok := ps.Scope(index.ScopeKey{Tenant: tenant, Model: model, Scheme: scheme, Adapter: adapter})
	now := s.opts.Now()
	if ok {
		sc.Table.Query(chain, "", &st.res)
		// An exact prefix_hash matches the same recorded prefix for
		// every replica: its token count is looked up once.
		exactRun := 0
		if exactTokens {
			n, _ := sc.Tokens(st.keys[0])
			exactRun = int(n)
		}
		for i := range st.res.Instances {
			ih := &st.res.Instances[i]
			run, tier := bestRun(ih)
			if run <= 0 {
				continue
			}
			if exactTokens {
				run = exactRun
			}
			c := candidate{replica: ih.Instance, matched: run, tier: tier}
			last, rs, hasStats, known := ps.Replica(producer.ReplicaKey{Tenant: tenant, Model: model, Replica: ih.Instance})
			if known {
				c.fresh = clamp01(1 - float64(now.Sub(last))/float64(ps.TTL()))
				if hasStats && now.Sub(rs.At) < ps.TTL() {
					c.pressure = float64(rs.Pressure)
				}
			}
			st.cands = append(st.cands, c)
		}
	}
	if kind != inChain && len(st.cands) == 0 && ok {
		for _, id := range sc.Table.AppendInstances(nil) {
			_, rs, hasStats, known := ps.Replica(producer.ReplicaKey{Tenant: tenant, Model: model, Replica: id})
			if known && hasStats && now.Sub(rs.At) <= hotWindow && rs.HitRate >= hotHitRate {
				return match{level: lv, hot: true}
			}
		}
	}
	return match{level: lv}
}

// affinityPick is docs/grpc.md, LookupRoute: Affinity pick — SHA-256 of the request's chain (each hash with a
// 4-byte big-endian length before it) or prefix_hash, first 8 bytes as a
// big-endian integer, modulo the number of replicas.
func affinityPick(req *pb.LookupRouteRequest, kind inputKind, derived iter.Seq[uint64], n int) int {
	h := sha256.New()
	var lenBuf [4]byte
	switch kind {
	case inChain:
		for _, b := range req.GetBlockHashes() {
			binary.BigEndian.PutUint32(lenBuf[:], uint32(len(b)))
			h.Write(lenBuf[:])
			h.Write(b)
		}
	case inExact:
		h.Write(req.GetPrefixHash())
	case inTokens:
		if derived == nil {
			break // no profile to hash the ids with: an empty chain
		}
		var kb [8]byte
		binary.BigEndian.PutUint32(lenBuf[:], 8)
		for k := range derived {
			binary.BigEndian.PutUint64(kb[:], k)
			h.Write(lenBuf[:])
			h.Write(kb[:])
		}
	}
	sum := h.Sum(nil)
	return int(binary.BigEndian.Uint64(sum[:8]) % uint64(n))
}

// anyOwned reports whether one of es has an owner: a context whose
// services all left is not a path a lookup can take.
func anyOwned(es []*contexts.Entry) bool {
	for _, e := range es {
		if e.Table.OwnerCount() > 0 {
			return true
		}
	}
	return false
}
