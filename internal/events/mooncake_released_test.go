package events

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
)

// unstamped makes an event of mcEventMap look like the released master's
// (docs/events.md#registration-context): no context fields, no dp_rank.
func unstamped(more ...func(m map[string]any)) func(m map[string]any) {
	return func(m map[string]any) {
		m["model_name"], m["block_size"], m["lora_name"], m["dp_rank"] = nil, nil, nil, nil
		m["backend_id"] = "pool-r"
		for _, f := range more {
			f(m)
		}
	}
}

func set(k string, v any) func(m map[string]any) { return func(m map[string]any) { m[k] = v } }

// TestMooncakeRegistrationContext covers how a stored event's context is
// decided: the registration fills what the released master leaves nil,
// what an event states is checked as before, and a publisher that stamps a
// dp_rank is held to the context it stamps.
func TestMooncakeRegistrationContext(t *testing.T) {
	k1 := "m@tp_rank:0@pcp0@dcp0@pp_rank:0@" + d1
	bare := uint64(0xfedcba9876543210)
	cases := []struct {
		name string
		mod  func(m map[string]any)
		want string
	}{
		{"released shape", unstamped(), "applied:none"},
		{"model stated, registered", unstamped(set("model_name", "test-model")), "applied:none"},
		{"model stated, other", unstamped(set("model_name", "other")), "rejected:context"},
		{"model stated empty", unstamped(set("model_name", "")), "rejected:context"},
		{"block_size stated, not registered", unstamped(set("block_size", 8)), "rejected:context"},
		{"block_size stated zero", unstamped(set("block_size", 0)), "rejected:block_size"},
		{"block_size stated, too large", unstamped(set("block_size", int64(1)<<40)), "rejected:block_size"},
		{"lora stated, not registered", unstamped(set("lora_name", "sql-adapter")), "rejected:context"},
		{"lora stated empty", unstamped(set("lora_name", "")), "applied:none"},
		{"tenant nil: the registration's", unstamped(set("tenant_id", nil)), "applied:none"},
		{"tenant empty: default", unstamped(set("tenant_id", "")), "applied:none"},
		{"tenant t1 kept", unstamped(set("tenant_id", "t1")), "applied:none"},
		{"tenant t2 kept, not registered", unstamped(set("tenant_id", "t2")), "rejected:context"},
		{"tenant wrong type", unstamped(set("tenant_id", 7)), "rejected:wrong_type"},
		{"dp_rank negative", unstamped(set("dp_rank", -1)), "rejected:dp_rank"},
		{"dp_rank string", unstamped(set("dp_rank", "0")), "rejected:dp_rank"},
		{"dp_rank missing", unstamped(func(m map[string]any) { delete(m, "dp_rank") }), "rejected:missing_key"},
		{"stamped, block_size nil", set("block_size", nil), "rejected:block_size"},
		{"stamped, model nil", set("model_name", nil), "rejected:context"},
		{"stamped, tenant nil", set("tenant_id", nil), "rejected:wrong_type"},
		{"legacy alias as int64", unstamped(set("object_key", "0xfedcba9876543210"),
			set("seq_hashes", []any{bare}), set("block_hashes", []any{int64(bare)})), "rejected:object_key"},
		{"legacy alias disagrees", unstamped(set("seq_hashes", []any{v1}), set("block_hashes", []any{int64(-1)})), "rejected:seq_hashes"},
		{"seq_hashes negative", unstamped(set("seq_hashes", []any{int64(-1)})), "rejected:seq_hashes"},
		{"seq_hashes of the key", unstamped(set("seq_hashes", []any{v1}), set("block_hashes", []any{int64(v1)})), "applied:none"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			x := direct(t, "pool-r-sub", "vllm-a", "vllm-t1")
			x.applyBatch(1, mcBatch(t, mcEventMap("stored", "cpu", k1, c.mod)))
			if diff := cmp.Diff([]string{c.want}, results(x, 1)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			bal := eventtest.SharedBalance(x.shared.Snapshot())
			want := map[[2]uint64]int{}
			if c.want == "applied:none" {
				want[[2]uint64{uint64(index.CPUShare), v1}] = 1
			}
			if diff := cmp.Diff(want, bal); diff != "" {
				t.Errorf("references (-want +got):\n%s", diff)
			}
		})
	}
}

// TestMooncakeRegistrationTenant: a nil tenant is the registration's, not
// "default".
func TestMooncakeRegistrationTenant(t *testing.T) {
	base := eventtest.LoadManifest(t)
	reg := base.Registration(t, "pool-r-sub")
	reg.TenantID = "t1"
	m := &eventtest.Manifest{Registrations: map[string]eventtest.Registration{
		"pool-r-sub": reg, "vllm-t1": base.Registration(t, "vllm-t1"),
	}}
	x := newTester(t, m, "pool-r-sub", "vllm-t1")
	k1 := "m@tp_rank:0@pcp0@dcp0@pp_rank:0@" + d1
	x.applyBatch(1, mcBatch(t,
		mcEventMap("stored", "cpu", k1, unstamped(set("tenant_id", nil))),
		mcEventMap("stored", "cpu", k1, unstamped()), // the writer's default tenant: not registered
		mcEventMap("removed", "cpu", k1, unstamped(set("tenant_id", "t1"))),
	))
	want := []string{"applied:none", "rejected:context", "applied:none"}
	if diff := cmp.Diff(want, results(x, 1)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if bal := eventtest.SharedBalance(x.shared.Snapshot()); len(bal) != 0 {
		t.Errorf("references left %v", bal)
	}
}

// TestMooncakeReleasedRemovals: the released master's one removal per
// object drops it in both tiers, after its stated fields agree with every
// binding it drops; a stamping publisher's removal stays per tier.
func TestMooncakeReleasedRemovals(t *testing.T) {
	x := direct(t, "pool-r-sub", "vllm-a")
	k1 := "m@tp_rank:0@pcp0@dcp0@pp_rank:0@" + d1
	k2 := "m@tp_rank:0@pcp0@dcp0@pp_rank:0@" + d2
	x.applyBatch(1, mcBatch(t,
		mcEventMap("stored", "cpu", k1, unstamped()),
		mcEventMap("stored", "disk", k1, unstamped()),
		mcEventMap("stored", "disk", k2, unstamped()),
		mcEventMap("removed", "cpu", k1, unstamped(set("model_name", "other"))), // assertion: nothing released
		mcEventMap("removed", "cpu", k1, unstamped(set("block_size", 8))),       // assertion
		mcEventMap("removed", "gpu", k1, unstamped()),                           // not a shared medium
		mcEventMap("removed", "cpu", k1, unstamped()),                           // both tiers
		mcEventMap("removed", "cpu", k1, unstamped()),                           // gone already
		mcEventMap("removed", "cpu", k2, set("backend_id", "pool-r")),           // stamped: cpu only, k2 is on disk
	))
	want := []string{"applied:none", "applied:none", "applied:none", "rejected:assertion", "rejected:assertion",
		"ignored:medium", "applied:none", "no-op:no_binding", "no-op:no_binding"}
	if diff := cmp.Diff(want, results(x, 1)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	bal := eventtest.SharedBalance(x.shared.Snapshot())
	if diff := cmp.Diff(map[[2]uint64]int{{uint64(index.Disk), v2}: 1}, bal); diff != "" {
		t.Errorf("references (-want +got):\n%s", diff)
	}
}
