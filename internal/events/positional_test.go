package events

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/racebuild"
	"github.com/rs/zerolog"
)

// TestArrayFixtureReasons checks the reason of every rejected or ignored
// event of the array-encoded fixtures (ids with "_array_"): each
// expectation names it first, after "rejected: " or "ignored: ", so a
// position read as the wrong field, or a wrong type judged by another rule,
// fails here even where the outcome alone (TestFixturesDirect) would pass.
func TestArrayFixtureReasons(t *testing.T) {
	m := eventtest.LoadManifest(t)
	n := 0
	for i := range m.Fixtures {
		f := &m.Fixtures[i]
		if !strings.Contains(f.ID, "_array_") || f.PayloadFile == "" {
			continue
		}
		n++
		t.Run(f.ID, func(t *testing.T) {
			var want []string
			for _, ev := range f.Expect.Events {
				res, detail, _ := strings.Cut(ev, ": ")
				reason, _, _ := strings.Cut(detail, " ")
				if res == "applied" {
					reason = "none"
				}
				want = append(want, res+":"+reason)
			}
			x := newTester(t, m, f.Registration, f.AlsoRegistered...)
			x.applyBatch(1, eventtest.Payload(t, f))
			var got []string
			for _, o := range x.outcomes[1] {
				got = append(got, o.Result.String()+":"+o.Reason.String())
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("outcomes (-want +got):\n%s", diff)
			}
		})
	}
	if n < 16 {
		t.Errorf("only %d array fixtures found", n)
	}
}

// nopEngine is an engine sink that keeps nothing.
type nopEngine struct{}

func (nopEngine) Store(index.OwnerID, index.Put) (uint32, bool) { return 0, true }
func (nopEngine) Remove(index.OwnerID, index.Put) bool          { return true }
func (nopEngine) ClearOwner(index.OwnerID, index.TierMask)      {}

// TestDecodeArraysDoesNotAllocate: decoding and applying a batch allocates
// nothing once the decoder's buffers have grown, in both dialects and for
// both engines, rejected positions and metadata maps included.
func TestDecodeArraysDoesNotAllocate(t *testing.T) {
	if racebuild.Enabled {
		t.Skip("the race detector allocates")
	}
	m := eventtest.LoadManifest(t)
	for _, id := range []string{
		"vllm_stored_gpu_2blocks", "vllm_legacy_array_events", "vllm_array_layout_40984", "vllm_array_wrong_types",
		"sglang_stored_gpu", "sglang_legacy_array_events", "sglang_array_layout_30827", "sglang_array_wrong_types",
	} {
		t.Run(id, func(t *testing.T) {
			f := m.Fixture(t, id)
			reg := m.Registration(t, f.Registration)
			typ, _ := sourcetype.Parse(reg.Type)
			d, err := New(Config{Type: typ, Profile: eventtest.ResolveProfile(t, reg), Context: eventtest.ContextOf(reg),
				Owner: eventtest.Owner, Engine: nopEngine{}, Logger: zerolog.Nop()})
			if err != nil {
				t.Fatal(err)
			}
			payload := eventtest.Payload(t, f)
			var rep nopReporter
			run := func() {
				if rej := d.Decode(payload); rej != ReasonNone {
					t.Fatal(rej)
				}
				applyTo(d, rep)
				d.Forget()
			}
			run()
			if n := testing.AllocsPerRun(50, run); n != 0 {
				t.Errorf("%.1f allocations per batch", n)
			}
		})
	}
}
