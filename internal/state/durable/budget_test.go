package durable

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/events"
	"github.com/mooncake-conductor-go/conductor/internal/state/snapshot"
)

// A snapshot larger than the index's budget is refused with both sizes in
// the log and kept aside; one that fits is restored as usual.
func TestSnapshotOverBudgetRefused(t *testing.T) {
	keys := make([]uint64, 20000)
	for i := range keys {
		keys[i] = uint64(i + 1)
	}
	need := index.EstimateBytes(int64(len(keys)), int64(len(keys)))
	for _, tc := range []struct {
		name    string
		limit   int64
		restore bool
	}{
		{"unbounded", 0, true},
		{"fits", 4 * need, true},
		{"over", need / 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			w := mustOpen(t, dir)
			a := service(t, "a", 0, "tcp://h:1")
			if _, err := w.reg.Register(a); err != nil {
				t.Fatal(err)
			}
			w.apply(a.Key(), 7, keys...)
			w.close()

			w2, err := openWith(t, Options{Path: dir, IndexMemoryLimit: tc.limit})
			if err != nil {
				t.Fatal(err)
			}
			var res index.QueryResult
			w2.tables[a.Key()].Query(&chain{keys: keys[:3]}, "", &res)
			restored := len(res.Instances) == 1 && res.Instances[0].Max.Device == 48
			if restored != tc.restore {
				t.Fatalf("restored %v, want %v: %+v", restored, tc.restore, res.Instances)
			}
			if tc.restore {
				return
			}
			log := w2.log.String()
			for _, want := range []string{fmt.Sprintf("(%d bytes) of index memory", need), fmt.Sprintf("(%d bytes) budget", tc.limit)} {
				if !strings.Contains(log, want) {
					t.Errorf("log does not say %q: %s", want, log)
				}
			}
			if w2.sources[a.Key()].resume != nil {
				t.Error("a refused snapshot still gave the source a resume point")
			}
			file := filepath.Join(dir, snapshot.FileName)
			if aside, _ := filepath.Glob(file + ".corrupt-*"); len(aside) != 1 {
				t.Errorf("refused snapshot not kept aside: %v", aside)
			}
		})
	}
}

// A peer's snapshot over the budget is refused like a bad one: the next
// source is tried, and the log names both sizes.
func TestPeerSnapshotOverBudgetRefused(t *testing.T) {
	peer := mustOpen(t, "")
	a := service(t, "a", 0, "tcp://h:1")
	if _, err := peer.reg.Register(a); err != nil {
		t.Fatal(err)
	}
	keys := make([]uint64, 5000)
	for i := range keys {
		keys[i] = uint64(i + 1)
	}
	peer.apply(a.Key(), 5, keys...)
	srv := peerServer(t, peer, "tok")
	limit := index.EstimateBytes(int64(len(keys)), int64(len(keys))) / 2
	w, err := openWith(t, Options{Path: "", Peers: []string{srv.URL}, PeerToken: "tok", IndexMemoryLimit: limit})
	if err != nil {
		t.Fatal(err)
	}
	log := w.log.String()
	if !strings.Contains(log, "no usable snapshot from peer") || !strings.Contains(log, fmt.Sprintf("(%d bytes) budget", limit)) {
		t.Errorf("log does not refuse the peer's snapshot naming the budget: %s", log)
	}
	if v := value(t, w.st, "conductor_restore_origin", OriginPeer); v != 0 {
		t.Errorf("restore origin peer = %v after a refused snapshot", v)
	}
}

// A snapshot's Mooncake bindings count toward its size against the budget.
func TestSnapshotNeedCountsBindings(t *testing.T) {
	snap := &snapshot.Snapshot{Contexts: []snapshot.TableSection{{Blocks: 10, Pairs: 10}}}
	bare := snapshotNeed(snap)
	b := snapshot.Binding{Backend: "pool-a", Tenant: "default", Identity: "m@tp_rank:0@pcp0@dcp0@pp_rank:0@" + strings.Repeat("ab", 32),
		Model: "test-model", BlockSize: 4, FullHash: strings.Repeat("ab", 32)}
	snap.Sources = []snapshot.StreamPosition{{Key: "s", Bindings: []snapshot.Binding{b, b}}}
	if got, want := snapshotNeed(snap)-bare, 2*events.BindingBytes(events.Binding(b)); got != want || want <= 0 {
		t.Fatalf("two bindings add %d bytes, want %d", got, want)
	}
}
