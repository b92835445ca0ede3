package server

import (
	"fmt"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
	"pgregory.net/rapid"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/contexts"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
	"github.com/mooncake-conductor-go/conductor/registry"
)

// refHit is this test's own reference of vLLM's hybrid hit: the largest
// length L <= m, a multiple of every cached group's block size, at which
// each spec group's rule holds, tried from m down. held(g, t) says whether
// group g holds the key of the first t tokens.
func refHit(groups []index.GroupSpec, hbs, m int, held func(g, t int) bool) int {
	type rule struct {
		spec    index.GroupSpec
		members []int
	}
	var rules []rule
	align := hbs
	lcm := func(a, b int) int {
		x, y := a, b
		for y != 0 {
			x, y = y, x%y
		}
		return a / x * b
	}
	for g, s := range groups {
		if s.Kind == index.KindUncached {
			continue
		}
		if s.Kind == index.KindChunked && s.ChunkSize == 0 {
			s.Kind = index.KindFull
		}
		align = lcm(align, s.BlockSize)
		found := false
		for i := range rules {
			if rules[i].spec == s {
				rules[i].members, found = append(rules[i].members, g), true
			}
		}
		if !found {
			rules = append(rules, rule{s, []int{g}})
		}
	}
	if len(rules) == 0 {
		return 0 // nothing vLLM prefix-caches
	}
	has := func(r rule, blockEnd int) bool {
		for _, g := range r.members {
			if !held(g, blockEnd) {
				return false
			}
		}
		return true
	}
	run := func(r rule, from, to int) bool { // blocks from..to, 1-based
		for k := from; k <= to; k++ {
			if !has(r, k*r.spec.BlockSize) {
				return false
			}
		}
		return true
	}
	for l := m - m%align; l > 0; l -= align {
		ok := true
		for _, r := range rules {
			b, nb := r.spec.BlockSize, l/r.spec.BlockSize
			switch r.spec.Kind {
			case index.KindSliding:
				need := max(1, (r.spec.SlidingWindow+b-2)/b)
				ok = run(r, max(1, nb-need+1), nb)
			case index.KindChunked:
				if b == align {
					ok = run(r, l/r.spec.ChunkSize*r.spec.ChunkSize/b+1, nb)
				} else {
					ok = run(r, 1, nb)
				}
			case index.KindMamba:
				ok = has(r, l)
			default:
				ok = run(r, 1, nb)
			}
			if !ok {
				break
			}
		}
		if ok {
			return l
		}
	}
	return 0
}

// TestHybridQueryAgainstReference: random layouts (1–4 groups of every
// kind, windows, chunks, block sizes), random stores and removals per
// group, random prompts; /query through the handler answers what the
// reference computes, and a dense owner beside answers its plain prefix.
func TestHybridQueryAgainstReference(t *testing.T) {
	const hbs = 4
	prof := eventtest.VLLMProfile(t)
	base := make([]int32, 24*hbs)
	for i := range base {
		base[i] = int32(100 + i)
	}
	keys := eventtest.ChainKeys(&prof, hbs, base)
	rapid.Check(t, func(rt *rapid.T) {
		ix := index.New(index.Options{Stripes: 4})
		cat := contexts.New(ix)
		reg := registry.New(registry.Options{Contexts: cat})
		for i, inst := range []string{"hybrid", "dense"} {
			svc := registry.Service{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", 30000+i), Type: sourcetype.VLLM, ModelName: "m", TenantID: "default",
				InstanceID: inst, BlockSize: hbs, Profile: prof}
			if _, err := reg.Register(svc); err != nil {
				rt.Fatal(err)
			}
		}
		tbl := ix.Table(index.ContextKey{Tenant: "default", Model: "m", BlockSize: hbs})
		hyb, dense := tbl.AddEngineOwner("hybrid", 0), tbl.AddEngineOwner("dense", 0)
		var groups []index.GroupSpec
		for range rapid.IntRange(1, 4).Draw(rt, "groups") {
			b := hbs * rapid.SampledFrom([]int{1, 1, 2, 3}).Draw(rt, "mult")
			s := index.GroupSpec{BlockSize: b}
			switch rapid.IntRange(0, 4).Draw(rt, "kind") {
			case 0:
				s.Kind = index.KindFull
			case 1:
				s.Kind, s.SlidingWindow = index.KindSliding, rapid.IntRange(1, 30).Draw(rt, "window")
			case 2:
				s.Kind, s.ChunkSize = index.KindChunked, b*rapid.IntRange(1, 5).Draw(rt, "chunk")
			case 3:
				s.Kind = index.KindMamba
			case 4:
				s.Kind = index.KindUncached
			}
			groups = append(groups, s)
		}
		tbl.SetLayout(hyb, groups)
		held := map[[2]int]bool{} // (group, key index)
		denseHeld := map[int]bool{}
		for range rapid.IntRange(0, 80).Draw(rt, "ops") {
			g := rapid.IntRange(0, len(groups)-1).Draw(rt, "group")
			j := rapid.IntRange(0, len(keys)-1).Draw(rt, "key")
			if rapid.IntRange(0, 3).Draw(rt, "op") > 0 {
				for k := j; k < min(len(keys), j+rapid.IntRange(1, 10).Draw(rt, "run")); k++ {
					tbl.Store(hyb, index.Put{Key: keys[k], Tier: index.Device, Group: g})
					held[[2]int{g, k}] = true
					tbl.Store(dense, index.Put{Key: keys[k], Tier: index.Device})
					denseHeld[k] = true
				}
			} else {
				tbl.Remove(hyb, index.Put{Key: keys[j], Tier: index.Device, Group: g})
				delete(held, [2]int{g, j})
				tbl.Remove(dense, index.Put{Key: keys[j], Tier: index.Device})
				delete(denseHeld, j)
			}
		}
		s := New(Options{Registry: reg, Contexts: cat})
		for range 3 {
			n := rapid.IntRange(0, len(base)).Draw(rt, "tokens")
			agree := rapid.IntRange(0, n).Draw(rt, "agree")
			q := append([]int32{}, base[:n]...)
			for i := agree; i < n; i++ {
				q[i] += 1 << 20
			}
			body, err := msgpack.Marshal(map[string]any{"model": "m", "block_size": hbs, "token_ids": q})
			if err != nil {
				rt.Fatal(err)
			}
			ctx := queryCtx(body)
			s.Handle(ctx)
			var got struct {
				Instances map[string]struct {
					Device int `msgpack:"device"`
				} `msgpack:"instances"`
			}
			if ctx.Response.StatusCode() != 200 || msgpack.Unmarshal(ctx.Response.Body(), &got) != nil {
				rt.Fatalf("status %d: %q", ctx.Response.StatusCode(), ctx.Response.Body())
			}
			m := n - n%hbs
			want := refHit(groups, hbs, m, func(g, t int) bool { return t/hbs <= agree/hbs && held[[2]int{g, t/hbs - 1}] })
			wantDense := 0
			for wantDense < agree/hbs && denseHeld[wantDense] {
				wantDense++
			}
			if g := got.Instances["hybrid"].Device; g != want {
				rt.Fatalf("layout %+v, prompt %d tokens (%d agree): hybrid device %d, reference %d", groups, n, agree, g, want)
			}
			if g := got.Instances["dense"].Device; g != wantDense*hbs {
				rt.Fatalf("dense device %d, want %d", g, wantDense*hbs)
			}
			// /query_by_hash with the prompt's keys: the same answer, hybrid
			// rules included (docs/api.md#post-query_by_hash).
			hk := append([]uint64{}, eventtest.ChainKeys(&prof, hbs, q)...)
			hbody, err := msgpack.Marshal(map[string]any{"model": "m", "block_size": hbs, "seq_hashes": hk})
			if err != nil {
				rt.Fatal(err)
			}
			hctx := queryCtx(hbody)
			hctx.Request.SetRequestURI("/query_by_hash")
			s.Handle(hctx)
			if string(hctx.Response.Body()) != string(ctx.Response.Body()) {
				rt.Fatalf("layout %+v: /query_by_hash %q, /query %q", groups, hctx.Response.Body(), ctx.Response.Body())
			}
		}
	})
}
