package durable

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/streampos"
	"github.com/mooncake-conductor-go/conductor/registry"
)

// peerServer serves w's snapshot the way the service does, behind a
// bearer token.
func peerServer(t *testing.T, w *world, token string) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.URL.Path != SnapshotPath || r.Header.Get("Authorization") != "Bearer "+token {
			rw.WriteHeader(http.StatusUnauthorized)
			return
		}
		if err := w.st.WriteSnapshot(rw); err != nil {
			t.Error(err)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// badPeer answers with body (or sleeps, when slow) instead of a snapshot.
func badPeer(t *testing.T, body func(http.ResponseWriter), done chan struct{}) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) { body(rw) }))
	t.Cleanup(func() { close(done); srv.Close() })
	return srv
}

func TestBootstrapFromPeer(t *testing.T) {
	// The peer runs two services with entries.
	peer := mustOpen(t, "")
	a, b := service(t, "a", 0, "tcp://h:1"), service(t, "b", 1, "tcp://h:2")
	for _, s := range []registry.Service{a, b} {
		if _, err := peer.reg.Register(s); err != nil {
			t.Fatal(err)
		}
	}
	peer.apply(a.Key(), 5, 1, 2, 3)
	peer.apply(b.Key(), 9, 3, 4)
	good := peerServer(t, peer, "tok")
	var full bytes.Buffer
	if err := peer.st.WriteSnapshot(&full); err != nil {
		t.Fatal(err)
	}

	// A state directory with an older snapshot: the peer's wins. (Its
	// record registers both services before the restore plan is dropped,
	// as etcd's shared set does for a replica.)
	dir := t.TempDir()
	old := mustOpen(t, dir)
	for _, s := range []registry.Service{a, b} {
		if _, err := old.reg.Register(s); err != nil {
			t.Fatal(err)
		}
	}
	old.apply(a.Key(), 2, 1)
	old.close()

	stop := make(chan struct{})
	corrupt := badPeer(t, func(rw http.ResponseWriter) {
		b := bytes.Clone(full.Bytes())
		b[len(b)-3] ^= 0xff
		rw.Write(b)
	}, make(chan struct{}))
	dying := badPeer(t, func(rw http.ResponseWriter) {
		rw.Header().Set("Content-Length", "100000000")
		rw.Write(full.Bytes()[:full.Len()/2])
		// the handler returns: the connection closes mid-body
	}, make(chan struct{}))
	slow := badPeer(t, func(rw http.ResponseWriter) {
		rw.Write(full.Bytes()[:10])
		rw.(http.Flusher).Flush()
		select {
		case <-stop:
		case <-time.After(time.Minute):
		}
	}, stop)
	wrongToken := peerServer(t, peer, "other")

	w, err := openWith(t, Options{Path: dir, PeerToken: "tok", PeerTimeout: 500 * time.Millisecond,
		Peers: []string{"http://127.0.0.1:1", wrongToken.URL, corrupt.URL, dying.URL, slow.URL, good.URL}})
	if err != nil {
		t.Fatal(err)
	}
	// A live peer vouches for its positions: they are taken as confirmed.
	for key, want := range map[registry.ServiceKey]*streampos.Resume{a.Key(): {Seq: 5, Confirmed: true}, b.Key(): {Seq: 9, Confirmed: true}} {
		if diff := cmp.Diff(want, w.sources[key].resume); diff != "" {
			t.Errorf("%s resume (-want +got):\n%s", key, diff)
		}
	}
	var res index.QueryResult
	w.tables[a.Key()].Query(&chain{keys: []uint64{1, 2, 3}}, "a", &res)
	if len(res.Instances) != 1 || res.Instances[0].Max.Device != 48 {
		t.Errorf("bootstrapped answer for a: %+v", res.Instances)
	}
	if diff := cmp.Diff(map[string]float64{OriginPeer: 1, OriginStateDir: 0, OriginNone: 0}, origins(t, w.st)); diff != "" {
		t.Errorf("conductor_restore_origin (-want +got):\n%s", diff)
	}
	// Each bad peer is named by a warning, and the snapshot by the good
	// one (a URL alone would also match the other's line).
	lines := strings.Split(w.log.String(), "\n")
	named := func(msg, peer string) bool {
		for _, l := range lines {
			if strings.Contains(l, msg) && strings.Contains(l, `"peer":"`+peer+`"`) {
				return true
			}
		}
		return false
	}
	for _, bad := range []string{"http://127.0.0.1:1", wrongToken.URL, corrupt.URL, dying.URL, slow.URL} {
		if !named("no usable snapshot from peer", bad) {
			t.Errorf("no warning naming peer %s", bad)
		}
	}
	if !named("index snapshot loaded from peer", good.URL) {
		t.Errorf("the load is not credited to %s", good.URL)
	}
}

// TestBootstrapFallsBackToStateDir: with no usable peer, the directory's
// own snapshot is loaded, whole.
func TestBootstrapFallsBackToStateDir(t *testing.T) {
	dir := t.TempDir()
	a := service(t, "a", 0, "tcp://h:1")
	old := mustOpen(t, dir)
	if _, err := old.reg.Register(a); err != nil {
		t.Fatal(err)
	}
	old.apply(a.Key(), 2, 1)
	old.close()

	w, err := openWith(t, Options{Path: dir, Peers: []string{"http://127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(&streampos.Resume{Seq: 2}, w.sources[a.Key()].resume); diff != "" {
		t.Errorf("resume (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]float64{OriginPeer: 0, OriginStateDir: 1, OriginNone: 0}, origins(t, w.st)); diff != "" {
		t.Errorf("conductor_restore_origin (-want +got):\n%s", diff)
	}
}

// origins reads conductor_restore_origin by label.
func origins(t *testing.T, st *State) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, o := range []string{OriginPeer, OriginStateDir, OriginNone} {
		out[o] = value(t, st, "conductor_restore_origin", o)
	}
	return out
}

// TestPeerPositionStillCatchingUpNotConfirmed: a position the peer itself
// restored and has not confirmed yet is not vouched for: the replica
// bootstrapping from it confirms it itself, like one read from its own
// state directory.
func TestPeerPositionStillCatchingUpNotConfirmed(t *testing.T) {
	peer := mustOpen(t, "")
	a, b := service(t, "a", 0, "tcp://h:1"), service(t, "b", 1, "tcp://h:2")
	for _, s := range []registry.Service{a, b} {
		if _, err := peer.reg.Register(s); err != nil {
			t.Fatal(err)
		}
	}
	peer.apply(a.Key(), 5, 1)
	peer.apply(b.Key(), 9, 3)
	f := peer.sources[b.Key()]
	f.mu.Lock()
	f.pos.CatchingUp = true
	f.mu.Unlock()
	good := peerServer(t, peer, "tok")
	// The replica's record registers both services, as etcd's shared
	// set does.
	dir := t.TempDir()
	old := mustOpen(t, dir)
	for _, s := range []registry.Service{a, b} {
		if _, err := old.reg.Register(s); err != nil {
			t.Fatal(err)
		}
	}
	old.close()

	w, err := openWith(t, Options{Path: dir, PeerToken: "tok", Peers: []string{good.URL}})
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[registry.ServiceKey]*streampos.Resume{a.Key(): {Seq: 5, Confirmed: true}, b.Key(): {Seq: 9}} {
		if diff := cmp.Diff(want, w.sources[key].resume); diff != "" {
			t.Errorf("%s resume (-want +got):\n%s", key, diff)
		}
	}
}
