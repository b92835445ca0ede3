package events

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
)

type stdOutcome struct {
	Res Result
	Why Reason
}

type outcomeLog []stdOutcome

func (l *outcomeLog) Report(_ int, res Result, why Reason) { *l = append(*l, stdOutcome{res, why}) }

var stdH = []uint64{16863443419780771464, 12466389667045779788, 960926348267535642, 4923844688253642376}

func stdDecoder(t *testing.T, typ sourcetype.Type) (*engineDecoder, *eventtest.Recorder) {
	t.Helper()
	p, err := hashing.Resolve(hashing.Spec{Strategy: "rfc1527", Algorithm: "xxh3_64"})
	if err != nil {
		t.Fatal(err)
	}
	rec := &eventtest.Recorder{}
	d, err := New(Config{Type: typ, Profile: p, Context: index.ContextKey{Tenant: "default", Model: "m", BlockSize: 16}, Engine: rec, Owner: 1, Stats: &Stats{}})
	if err != nil {
		t.Fatal(err)
	}
	return d.(*engineDecoder), rec
}

func stdBatch(t *testing.T, d Decoder, evs ...map[string]any) []stdOutcome {
	t.Helper()
	payload, err := msgpack.Marshal([]any{1.5, evs, 0})
	if err != nil {
		t.Fatal(err)
	}
	if r := d.Decode(payload); r != ReasonNone {
		t.Fatalf("envelope rejected: %v", r)
	}
	var log outcomeLog
	applyTo(d, &log)
	d.Forget()
	return log
}

func vStoredEv(hashes []uint64, parent any, from, n int, extra any) map[string]any {
	toks := make([]int32, n)
	for i := range toks {
		toks[i] = int32(from + i)
	}
	return map[string]any{"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": toks,
		"block_size": 16, "lora_id": nil, "medium": "GPU", "lora_name": nil, "extra_keys": extra}
}

func store(k uint64) eventtest.Op {
	return eventtest.Op{Kind: "store", Owner: 1, Tier: index.Device, Key: k}
}
func remove(k uint64) eventtest.Op {
	return eventtest.Op{Kind: "remove", Owner: 1, Tier: index.Device, Key: k}
}

// TestStandardEngineKeys: stored blocks are keyed by the standard hash of
// their token ids (the spec's vectors), children by their parent's engine
// hash, removals by engine hash; unknown parents are rejected, blocks whose
// extras the standard cannot fold (and their children) are remembered but
// never stored, and the map's bytes are accounted and given back.
func TestStandardEngineKeys(t *testing.T) {
	d, rec := stdDecoder(t, sourcetype.VLLM)
	stats := d.std.stats
	applied := stdOutcome{Applied, ReasonNone}
	got := stdBatch(t, d,
		vStoredEv([]uint64{11, 12}, nil, 1, 32, []any{nil, nil}),
		vStoredEv([]uint64{13}, uint64(12), 33, 16, []any{nil}),
		vStoredEv([]uint64{14}, uint64(99), 49, 16, []any{nil}),
		vStoredEv([]uint64{21}, nil, 1, 16, nil), // no extra_keys: a salt may have entered
		vStoredEv([]uint64{22}, uint64(21), 17, 16, []any{nil}),
		vStoredEv([]uint64{31}, nil, 1, 16, []any{[]any{map[string]any{"type": "mm", "hash": "ab"}}}),
		map[string]any{"type": "BlockRemoved", "block_hashes": []uint64{12, 22, 77}, "medium": "GPU"},
	)
	want := []stdOutcome{applied, applied, {Rejected, EvUnknownParent}, applied, applied, applied, applied}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("outcomes (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]eventtest.Op{store(stdH[0]), store(stdH[1]), store(stdH[2]), remove(stdH[1])}, rec.Take()); diff != "" {
		t.Errorf("sink calls (-want +got):\n%s", diff)
	}
	// 11, 13, 21, 31 remain (12 and 22 removed; 14 never keyed).
	if got := stats.StandardMapBytes(); got != 4*stdEntryBytes {
		t.Errorf("accounted %d bytes, want %d", got, 4*stdEntryBytes)
	}
	stdBatch(t, d, map[string]any{"type": "AllBlocksCleared"})
	if got := stats.StandardMapBytes(); got != 0 {
		t.Errorf("after AllBlocksCleared: %d bytes still accounted", got)
	}
	got = stdBatch(t, d, vStoredEv([]uint64{15}, uint64(13), 49, 16, []any{nil}))
	if diff := cmp.Diff([]stdOutcome{{Rejected, EvUnknownParent}}, got); diff != "" {
		t.Errorf("a parent forgotten by the clear (-want +got):\n%s", diff)
	}
	stdBatch(t, d, vStoredEv([]uint64{11}, nil, 1, 16, []any{nil}))
	d.Retract()
	if got := stats.StandardMapBytes(); got != 0 {
		t.Errorf("after Retract: %d bytes still accounted", got)
	}
}

// TestStandardEngineBound: past the map's bound a stored event is refused
// (standard_map_full) rather than stored where no removal could find it.
func TestStandardEngineBound(t *testing.T) {
	d, rec := stdDecoder(t, sourcetype.VLLM)
	d.std.max = 2
	got := stdBatch(t, d, vStoredEv([]uint64{11, 12}, nil, 1, 32, []any{nil, nil}), vStoredEv([]uint64{13}, uint64(12), 33, 16, []any{nil}))
	if diff := cmp.Diff([]stdOutcome{{Applied, ReasonNone}, {Rejected, EvStdMapFull}}, got); diff != "" {
		t.Errorf("outcomes (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]eventtest.Op{store(stdH[0]), store(stdH[1])}, rec.Take()); diff != "" {
		t.Errorf("sink calls (-want +got):\n%s", diff)
	}
	d.Retract()
}

// TestStandardSGLang: signed engine hashes, a partial page unreachable.
func TestStandardSGLang(t *testing.T) {
	d, rec := stdDecoder(t, sourcetype.SGLang)
	toks := func(from, n int) []int32 {
		out := make([]int32, n)
		for i := range out {
			out[i] = int32(from + i)
		}
		return out
	}
	stdBatch(t, d,
		map[string]any{"type": "BlockStored", "block_hashes": []int64{-5, -6}, "parent_block_hash": nil, "token_ids": toks(1, 32), "block_size": 16, "lora_id": nil, "medium": "GPU"},
		map[string]any{"type": "BlockStored", "block_hashes": []int64{-7}, "parent_block_hash": int64(-6), "token_ids": toks(33, 10), "block_size": 16, "lora_id": nil, "medium": "GPU"},
		map[string]any{"type": "BlockRemoved", "block_hashes": []int64{-6, -7}, "medium": "GPU"},
	)
	if diff := cmp.Diff([]eventtest.Op{store(stdH[0]), store(stdH[1]), remove(stdH[1])}, rec.Take()); diff != "" {
		t.Errorf("sink calls (-want +got):\n%s", diff)
	}
	d.Retract()
}

// TestStandardMapAcrossRestart: the engine-hash map exported from one
// decoder and imported into a fresh one (a restart restoring the snapshot)
// keeps the restored blocks removable and their children keyable, and its
// bytes accounted; a decoder not under the standard hash exports nothing
// and refuses entries; past the bound nothing is imported.
func TestStandardMapAcrossRestart(t *testing.T) {
	d, _ := stdDecoder(t, sourcetype.VLLM)
	stdBatch(t, d, vStoredEv([]uint64{11, 12}, nil, 1, 32, []any{nil, nil}), vStoredEv([]uint64{21}, nil, 1, 16, nil))
	es, ok := d.ExportStdMap()
	if !ok || len(es) != 3 {
		t.Fatalf("exported %v %v", es, ok)
	}
	d2, rec := stdDecoder(t, sourcetype.VLLM)
	if !d2.ImportStdMap(es) {
		t.Fatal("import refused")
	}
	if got := d2.std.stats.StandardMapBytes(); got != 3*stdEntryBytes {
		t.Errorf("accounted %d bytes after the import", got)
	}
	got := stdBatch(t, d2,
		vStoredEv([]uint64{13}, uint64(12), 33, 16, []any{nil}),
		map[string]any{"type": "BlockRemoved", "block_hashes": []uint64{11, 21}, "medium": "GPU"},
	)
	if diff := cmp.Diff([]stdOutcome{{Applied, ReasonNone}, {Applied, ReasonNone}}, got); diff != "" {
		t.Errorf("outcomes (-want +got):\n%s", diff)
	}
	// 13 keyed from its restored parent; 11 removed by its engine hash;
	// 21 was unreachable, so nothing of it is in the index to remove.
	if diff := cmp.Diff([]eventtest.Op{store(stdH[2]), remove(stdH[0])}, rec.Take()); diff != "" {
		t.Errorf("sink calls (-want +got):\n%s", diff)
	}
	d3, _ := stdDecoder(t, sourcetype.VLLM)
	d3.std.max = 2
	if d3.ImportStdMap(es) || len(d3.std.m) != 0 {
		t.Error("imported past the bound")
	}
	plain, _ := New(Config{Type: sourcetype.VLLM, Profile: profileV(t), Context: index.ContextKey{Tenant: "default", Model: "m", BlockSize: 16}, Engine: &eventtest.Recorder{}, Owner: 1, Stats: &Stats{}})
	m := plain.(StandardMap)
	if _, ok := m.ExportStdMap(); ok || m.ImportStdMap(es) || !m.ImportStdMap(nil) {
		t.Error("a decoder not under the standard hash takes or gives a map")
	}
	d.Retract()
	d2.Retract()
}

func profileV(t *testing.T) hashing.Profile {
	seed := "0"
	p, err := hashing.Resolve(hashing.Spec{Strategy: "vllm_v1", Algorithm: "sha256_cbor", IndexProjection: "low64_be", PythonHashSeed: &seed})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// BenchmarkStdMapExport: copying a full engine-hash map for a snapshot,
// which a cut does under the gate (ingest of every source waits for it).
func BenchmarkStdMapExport(b *testing.B) {
	p, err := hashing.Resolve(hashing.Spec{Strategy: "rfc1527", Algorithm: "xxh3_64"})
	if err != nil {
		b.Fatal(err)
	}
	dec, err := New(Config{Type: sourcetype.VLLM, Profile: p, Context: index.ContextKey{Tenant: "default", Model: "m", BlockSize: 16}, Engine: &eventtest.Recorder{}, Owner: 1, Stats: &Stats{}})
	if err != nil {
		b.Fatal(err)
	}
	d := dec.(*engineDecoder)
	es := make([]StdEntry, DefaultStdMapEntries)
	for i := range es {
		es[i] = StdEntry{Key: uint64(i) * 0x9e3779b97f4a7c15, H: uint64(i) + 1, Reachable: true}
	}
	if !d.ImportStdMap(es) {
		b.Fatal("import refused")
	}
	b.ResetTimer()
	for b.Loop() {
		if out, _ := d.ExportStdMap(); len(out) != len(es) {
			b.Fatal(len(out))
		}
	}
}
