package events

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
)

// checkFixture compares what one fixture payload did with its manifest
// expectation. prior are the ops its requires recorded, got the ops it
// recorded itself.
func checkFixture(t *testing.T, f *eventtest.Fixture, x *tester, seq uint64, envBefore, batchBefore int, prior, got []eventtest.Op) {
	t.Helper()
	outcomes := x.outcomes[seq]
	switch {
	case f.Expect.Envelope == "reject":
		if x.envRejected != envBefore+1 {
			t.Errorf("envelope rejections = %d, want %d", x.envRejected, envBefore+1)
		}
		if len(outcomes) != 0 || len(got) != 0 {
			t.Errorf("rejected envelope produced outcomes %v / ops %v", outcomes, got)
		}
	case f.Expect.Batch == "reject":
		// The batch's dp_rank is not the registration's: the subscriber
		// rejects it (and makes the source stale) before anything applies.
		if x.batchRejected != batchBefore+1 {
			t.Errorf("batch rejections = %d, want %d", x.batchRejected, batchBefore+1)
		}
		if len(outcomes) != 0 || len(got) != 0 {
			t.Errorf("rejected batch produced outcomes %v / ops %v", outcomes, got)
		}
	default:
		if x.envRejected != envBefore || x.batchRejected != batchBefore {
			t.Errorf("batch rejected (envelope %d, dp_rank %d), want applied: %v", x.envRejected-envBefore, x.batchRejected-batchBefore, x.lastEnvReason)
		}
		var results []string
		for _, o := range outcomes {
			results = append(results, o.Result.String())
		}
		eventtest.CheckApplied(t, f, results, outcomes, prior, got)
	}
}

// checkBindings verifies the shared owners named by Mooncake effects exist
// (store) or are gone (remove) in the source's binding table.
func checkBindings(t *testing.T, f *eventtest.Fixture, d *mooncakeDecoder) {
	t.Helper()
	for _, ef := range f.Expect.Effects {
		if !strings.HasPrefix(ef.Owner, "shared ") {
			continue
		}
		var backend, identity string
		tenant := "default"
		rest := strings.TrimPrefix(ef.Owner, "shared backend=")
		backend, rest, _ = strings.Cut(rest, " ")
		if after, ok := strings.CutPrefix(rest, "tenant="); ok {
			tenant, rest, _ = strings.Cut(after, " ")
		}
		if _, after, ok := strings.Cut(rest, ") object="); ok {
			identity = after
		} else if _, after, ok := strings.Cut(rest, ") logical="); ok {
			identity = after
		} else {
			t.Fatalf("cannot parse owner %q", ef.Owner)
		}
		k := bindingKey{backend: backend, tenant: tenant, identity: identity, tier: eventtest.TierNames[ef.Tier]}
		b, ok := d.bindings[k]
		switch ef.Op {
		case "store":
			if !ok {
				t.Errorf("no binding %+v after store", k)
			} else if b.prefix != eventtest.ParseU64(t, ef.Prefixes[0]) {
				t.Errorf("binding %+v prefix %d, want %s", k, b.prefix, ef.Prefixes[0])
			}
		case "remove":
			if ok {
				t.Errorf("binding %+v still present after remove", k)
			}
		}
	}
}

// TestFixturesDirect feeds every payload fixture (after its requires) to
// its registration's decoder and checks events, index ops and the Mooncake
// binding table exactly.
func TestFixturesDirect(t *testing.T) {
	m := eventtest.LoadManifest(t)
	n := 0
	for i := range m.Fixtures {
		f := &m.Fixtures[i]
		if f.PayloadFile == "" {
			continue
		}
		n++
		t.Run(f.ID, func(t *testing.T) {
			x := newTester(t, m, f.Registration, f.AlsoRegistered...)
			seq := uint64(0)
			for _, r := range f.Requires {
				seq++
				x.applyBatch(seq, eventtest.Payload(t, m.Fixture(t, r)))
			}
			prior := append(x.engine.Take(), x.shared.Take()...)
			envBefore, batchBefore := x.envRejected, x.batchRejected
			seq++
			x.applyBatch(seq, eventtest.Payload(t, f))
			got := append(x.engine.Take(), x.shared.Take()...)
			checkFixture(t, f, x, seq, envBefore, batchBefore, prior, got)
			checkHashChecks(t, f, x)
			if d, ok := x.dec.(*mooncakeDecoder); ok && f.Expect.Envelope != "reject" {
				checkBindings(t, f, d)
			}
			// retraction leaves nothing behind
			x.retract()
			all := append(append(prior, got...), x.engine.Take()...)
			all = append(all, x.shared.Take()...)
			if bal := eventtest.SharedBalance(all); len(bal) != 0 {
				t.Errorf("shared references left after retract: %v", bal)
			}
		})
	}
	if n < 90 {
		t.Errorf("only %d payload fixtures found", n)
	}
}

// hashChecks is what the hash check makes of each payload fixture with its
// requires, {matches, mismatches}, every block checked; fixtures not listed
// check nothing (rejected, ignored, removals, or a chain start whose extra
// keys the event does not state). The mismatches are fixtures that pair a
// salt, a LoRA name, bigram pairs or a partial page with a plain chain's
// hash: they test decoding, and are exactly what an operator must hear of.
var hashChecks = map[string][2]uint64{
	"vllm_stored_gpu_2blocks":   {2, 0},
	"vllm_stored_gpu_chained":   {2, 0}, // the second event's integer parent was verified by the first
	"vllm_removed_gpu":          {2, 0}, // its requires
	"vllm_all_cleared":          {2, 0}, // its requires
	"vllm_dp_nil":               {1, 0},
	"vllm_stored_bin_hashes":    {2, 0},
	"vllm_stored_mla":           {1, 0},
	"vllm_stored_newest_fields": {0, 1}, // a cache_salt in extra_keys, unsalted hash
	"vllm_lora_stored":          {0, 1}, // a LoRA name, hash without it
	"vllm_mixed_batch":          {3, 0}, // group 1 is checked too
	"vllm_hybrid_two_groups":    {2, 0}, // the full-attention group; sliding windows are not
	"vllm_hybrid_mamba_sparse":  {2, 0}, // likewise Mamba
	"sglang_stored_gpu":         {1, 0},
	"sglang_stored_cpu_pinned":  {2, 0},
	"sglang_stored_disk":        {3, 0},
	"sglang_stored_no_medium":   {1, 0},
	"sglang_removed_gpu":        {1, 0}, // its requires
	"sglang_removed_cpu_pinned": {2, 0}, // its requires
	"sglang_cleared":            {6, 0}, // its requires
	"sglang_epoch_topic":        {1, 0},
	// a cache_salt, unsalted hash
	"sglang_stored_salt_session_dp0": {0, 1},
	// pairs hashed as a plain page (the registration is not bigram)
	"sglang_stored_bigram_tokens": {0, 1},
	// the last page's tokens under a full page's hash
	"sglang_stored_partial_page": {0, 1},
	// array-encoded events are checked as their map twins: vLLM blocks
	// only with extra_keys (without them the check skips), SGLang salted
	// blocks (the metadata map's cache_salt) mismatch the unsalted hash
	"vllm_array_layout_33304":        {1, 0},
	"vllm_array_layout_40984":        {1, 0},
	"sglang_legacy_array_events":     {2, 1},
	"sglang_array_layout_6098":       {1, 0},
	"sglang_array_layout_18205":      {3, 0},
	"sglang_array_layout_30827":      {1, 2},
	"sglang_array_longer_than_known": {0, 1},
}

// warnKeys are the fields a mismatch warning may carry: nothing derived
// from token ids or salts.
var warnKeys = map[string]bool{
	"level": true, "service": true, "strategy": true, "algorithm": true, "block_size": true,
	"chain_start": true, "likely_causes": true, "reproduced_with": true, "message": true,
}

// checkHashChecks compares an engine tester's hash-check counts and log
// with hashChecks: one warning, naming the service, once anything
// mismatched, and none otherwise.
func checkHashChecks(t *testing.T, f *eventtest.Fixture, x *tester) {
	t.Helper()
	if x.check == nil {
		return
	}
	mt, mm := x.check.Counts()
	if got, want := [2]uint64{mt, mm}, hashChecks[f.ID]; got != want {
		t.Errorf("hash checks {matches, mismatches} = %v, want %v", got, want)
	}
	// The WARN of a first mismatch; the INFO of a first skipped block is
	// TestHashCheckSkipReasons' and hashcheck's.
	var lines [][]byte
	for _, l := range bytes.Split(bytes.TrimSpace(x.checkLog.Bytes()), []byte("\n")) {
		if bytes.Contains(l, []byte(`"level":"warn"`)) {
			lines = append(lines, l)
		}
	}
	if want := min(int(mm), 1); len(lines) != want {
		t.Fatalf("%d hash-check log lines, want %d: %s", len(lines), want, x.checkLog)
	}
	for _, l := range lines {
		var line map[string]any
		if err := json.Unmarshal(l, &line); err != nil {
			t.Fatal(err)
		}
		if line["level"] != "warn" || line["service"] != x.reg.InstanceID {
			t.Errorf("warning %v", line)
		}
		for k := range line {
			if !warnKeys[k] {
				t.Errorf("warning carries %q: %s", k, l)
			}
		}
	}
}
