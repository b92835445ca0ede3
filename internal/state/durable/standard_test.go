package durable

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/google/go-cmp/cmp"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/events"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/state/snapshot"
	"github.com/mooncake-conductor-go/conductor/internal/streampos"
	"github.com/mooncake-conductor-go/conductor/registry"
)

// stdService is a vLLM engine registered with the standard hash.
func stdService(t *testing.T) registry.Service {
	t.Helper()
	p, err := hashing.Resolve(hashing.Spec{Strategy: "rfc1527", Algorithm: "xxh3_64"})
	if err != nil {
		t.Fatal(err)
	}
	a := service(t, "a", 0, "tcp://h:1")
	a.Profile = p
	return a
}

// stdWorld has a standard-hash engine that stored keys 1-3 (its
// standard hashes) at seq 5, with its engine-hash map, and was stopped.
func stdWorld(t *testing.T, dir string) (registry.Service, []events.StdEntry) {
	t.Helper()
	a := stdService(t)
	w := mustOpen(t, dir)
	if _, err := w.reg.Register(a); err != nil {
		t.Fatal(err)
	}
	w.apply(a.Key(), 5, 1, 2, 3)
	m := []events.StdEntry{{Key: 101, H: 1, Reachable: true}, {Key: 102, H: 2, Reachable: true}, {Key: 103, H: 3, Reachable: true}, {Key: 104}}
	f := w.sources[a.Key()]
	f.mu.Lock()
	f.pos.StdMap, f.pos.HasStdMap = m, true
	f.mu.Unlock()
	w.close()
	return a, m
}

// TestStandardEngineRestored: an engine registered with the standard hash
// keeps its entries, its position and its engine-hash → standard-hash map
// across a restart, so the restored blocks stay removable
// (docs/state.md#what-survives-a-restart).
func TestStandardEngineRestored(t *testing.T) {
	dir := t.TempDir()
	a, m := stdWorld(t, dir)

	w2 := mustOpen(t, dir)
	defer w2.close()
	if diff := cmp.Diff(&streampos.Resume{Seq: 5, StdMap: m}, w2.sources[a.Key()].resume); diff != "" {
		t.Errorf("resume (-want +got):\n%s", diff)
	}
	var res index.QueryResult
	w2.tables[a.Key()].Query(&chain{keys: []uint64{1, 2, 3}}, "a", &res)
	if len(res.Instances) != 1 || res.Instances[0].Max.Device != 48 {
		t.Errorf("restored answer %+v, want the 3 blocks", res.Instances)
	}
	if strings.Contains(w2.log.String(), "no longer registered") {
		t.Errorf("the log says a registered source is gone:\n%s", w2.log.String())
	}
}

// TestStandardEngineFromOlderSnapshotStartsCold: a snapshot written before
// the map was kept (format version 2) restores the registration but not
// the engine's entries, and the log says why, not that it is unregistered.
func TestStandardEngineFromOlderSnapshotStartsCold(t *testing.T) {
	dir := t.TempDir()
	a, _ := stdWorld(t, dir)
	// Rewrite the snapshot as the previous release wrote it.
	name := filepath.Join(dir, snapshot.FileName)
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	snap, err := snapshot.Read(data)
	if err != nil {
		t.Fatal(err)
	}
	for i := range snap.Sources {
		snap.Sources[i].StdMap, snap.Sources[i].HasStdMap = nil, false
	}
	var buf bytes.Buffer
	if err := snapshot.Write(&buf, snap); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	binary.LittleEndian.PutUint32(b[8:], 2)
	binary.LittleEndian.PutUint64(b[24:], xxhash.Sum64(b[:24]))
	if err := os.WriteFile(name, b, 0o600); err != nil {
		t.Fatal(err)
	}

	w2 := mustOpen(t, dir)
	defer w2.close()
	if svcs := w2.reg.Services(); len(svcs) != 1 || svcs[0].Profile != a.Profile {
		t.Fatalf("services after restart: %+v", svcs)
	}
	if r := w2.sources[a.Key()].resume; r != nil {
		t.Errorf("resume position %+v, want none (cold)", r)
	}
	var res index.QueryResult
	w2.tables[a.Key()].Query(&chain{keys: []uint64{1, 2, 3}}, "a", &res)
	if len(res.Instances) != 1 || res.Instances[0].Max.Device != 0 {
		t.Errorf("restored answer %+v, want nothing restored", res.Instances)
	}
	log := w2.log.String()
	if strings.Contains(log, "no longer registered") || !strings.Contains(log, "engine-hash map the snapshot lacks") {
		t.Errorf("log does not say why the source starts fresh:\n%s", log)
	}
}
