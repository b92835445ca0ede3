package durable

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/rs/zerolog"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/contexts"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
	"github.com/mooncake-conductor-go/conductor/internal/state/regstore"
	"github.com/mooncake-conductor-go/conductor/internal/state/snapshot"
	"github.com/mooncake-conductor-go/conductor/internal/state/statedir"
	"github.com/mooncake-conductor-go/conductor/internal/streampos"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/fakeclock"
	"github.com/mooncake-conductor-go/conductor/registry"
)

func profile(t testing.TB) hashing.Profile {
	seed := "0"
	p, err := hashing.Resolve(hashing.Spec{Strategy: "vllm_v1", Algorithm: "sha256_cbor", IndexProjection: "low64_be", PythonHashSeed: &seed})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func service(t testing.TB, instance string, rank int, endpoint string) registry.Service {
	return registry.Service{Endpoint: endpoint, Type: sourcetype.VLLM, ModelName: "m", TenantID: "default",
		InstanceID: instance, BlockSize: 16, DPRank: rank, Profile: profile(t)}
}

// fakeSource is a source whose position the test sets; it stores what it
// is told to under the gate, like a subscriber applying a batch.
type fakeSource struct {
	mu     sync.Mutex
	pos    streampos.Position
	resume *streampos.Resume
}

func (f *fakeSource) Stop()         {}
func (f *fakeSource) Stale() bool   { return false }
func (f *fakeSource) State() string { return "live" }
func (f *fakeSource) Position() streampos.Position {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pos
}

// world is one service lifetime: state, index, registry with fake sources.
type world struct {
	st      *State
	ix      *index.Index
	reg     *registry.Registry
	sources map[registry.ServiceKey]*fakeSource
	owners  map[registry.ServiceKey]index.OwnerID
	tables  map[registry.ServiceKey]*index.Table
	log     *eventtest.LogBuffer
}

func open(t testing.TB, dir string, reset bool) (*world, error) {
	t.Helper()
	return openWith(t, Options{Path: dir, Reset: reset})
}

func openWith(t testing.TB, opts Options) (*world, error) {
	t.Helper()
	w := &world{sources: map[registry.ServiceKey]*fakeSource{}, owners: map[registry.ServiceKey]index.OwnerID{},
		tables: map[registry.ServiceKey]*index.Table{}, log: &eventtest.LogBuffer{}}
	opts.Logger, opts.CatchUpTimeout = zerolog.New(w.log), time.Hour
	st, err := Open(opts)
	if err != nil {
		return nil, err
	}
	w.st = st
	w.ix = index.New(index.Options{})
	cat := contexts.New(w.ix)
	w.reg = registry.New(registry.Options{Contexts: cat, Start: func(svc registry.Service, owner index.OwnerID) (registry.Source, error) {
		f := &fakeSource{}
		table := cat.Get(svc.Context()).Table
		if r := st.Resume(svc, table, owner); r != nil {
			f.resume = &r.Resume
		}
		w.sources[svc.Key()], w.owners[svc.Key()], w.tables[svc.Key()] = f, owner, table
		return f, nil
	}})
	for _, svc := range st.Recorded() {
		if _, err := w.reg.Register(svc); err != nil {
			t.Fatal(err)
		}
	}
	st.Start(w.reg, w.ix, nil)
	t.Cleanup(w.close)
	return w, nil
}

func (w *world) close() {
	w.st.Close()
	w.reg.Close()
	w.ix.Close()
	w.st.Release()
}

func mustOpen(t testing.TB, dir string) *world {
	t.Helper()
	w, err := open(t, dir, false)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// apply stores keys for a service and moves its position, as one batch.
func (w *world) apply(key registry.ServiceKey, seq uint64, keys ...uint64) {
	w.st.gate.RLock()
	defer w.st.gate.RUnlock()
	for _, k := range keys {
		w.tables[key].Store(w.owners[key], index.Put{Key: k, Tier: index.Device})
	}
	f := w.sources[key]
	f.mu.Lock()
	f.pos = streampos.Position{Seq: seq, HasSeq: true}
	f.mu.Unlock()
}

func TestMemoryOnly(t *testing.T) {
	log := &eventtest.LogBuffer{}
	st, err := Open(Options{Logger: zerolog.New(log)})
	if err != nil {
		t.Fatal(err)
	}
	// The gate is there for the snapshots peers fetch.
	if st.Gate() == nil || st.Dir() != "" || len(st.Recorded()) != 0 {
		t.Error("memory-only state has no gate, or has a directory or records")
	}
	if !strings.Contains(log.String(), `"level":"info"`) || !strings.Contains(log.String(), "memory only") {
		t.Errorf("log %q", log.String())
	}
	if err := st.Snapshot(); err != nil {
		t.Error(err)
	}
	st.Close()
	st.Release()
}

func TestSecondOpenRefused(t *testing.T) {
	dir := t.TempDir()
	mustOpen(t, dir)
	_, err := open(t, dir, false)
	var le *statedir.LockedError
	if !errors.As(err, &le) || le.PID != os.Getpid() {
		t.Fatalf("second open: %v", err)
	}
}

// TestSecondOpenAsksNoPeer: a process refused the directory (another holds
// it) is refused before it fetches anything from a peer, not after
// downloading a whole index.
func TestSecondOpenAsksNoPeer(t *testing.T) {
	dir := t.TempDir()
	mustOpen(t, dir)
	var asked atomic.Int32
	peer := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		asked.Add(1)
		rw.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer peer.Close()
	_, err := openWith(t, Options{Path: dir, Peers: []string{peer.URL}})
	var le *statedir.LockedError
	if !errors.As(err, &le) {
		t.Fatalf("second open: %v", err)
	}
	if n := asked.Load(); n != 0 {
		t.Errorf("the refused process asked the peer %d times", n)
	}
}

// Registrations and entries survive a restart; a snapshot is consistent
// with each source's recorded position.
func TestRestartRestoresRegistrationsAndEntries(t *testing.T) {
	dir := t.TempDir()
	w := mustOpen(t, dir)
	a, b := service(t, "a", 0, "tcp://h:1"), service(t, "b", 1, "tcp://h:2")
	for _, s := range []registry.Service{a, b} {
		if _, err := w.reg.Register(s); err != nil {
			t.Fatal(err)
		}
	}
	if diff := cmp.Diff(map[string]float64{OriginPeer: 0, OriginStateDir: 0, OriginNone: 1}, origins(t, w.st)); diff != "" {
		t.Errorf("conductor_restore_origin of a new directory (-want +got):\n%s", diff)
	}
	w.apply(a.Key(), 5, 1, 2, 3)
	w.apply(b.Key(), 9, 3, 4)
	w.close()

	w2 := mustOpen(t, dir)
	if diff := cmp.Diff(map[string]float64{OriginPeer: 0, OriginStateDir: 1, OriginNone: 0}, origins(t, w2.st)); diff != "" {
		t.Errorf("conductor_restore_origin after restart (-want +got):\n%s", diff)
	}
	if got := len(w2.reg.Services()); got != 2 {
		t.Fatalf("%d services after restart", got)
	}
	for key, want := range map[registry.ServiceKey]*streampos.Resume{a.Key(): {Seq: 5}, b.Key(): {Seq: 9}} {
		if diff := cmp.Diff(want, w2.sources[key].resume); diff != "" {
			t.Errorf("%s resume (-want +got):\n%s", key, diff)
		}
	}
	tb := w2.tables[a.Key()]
	var res index.QueryResult
	tb.Query(&chain{keys: []uint64{1, 2, 3}}, "a", &res)
	if len(res.Instances) != 1 || res.Instances[0].Max.Device != 48 {
		t.Errorf("restored answer for a: %+v", res.Instances)
	}
	tb.Query(&chain{keys: []uint64{3, 4}}, "b", &res)
	if len(res.Instances) != 1 || res.Instances[0].Max.Device != 32 {
		t.Errorf("restored answer for b: %+v", res.Instances)
	}
	if v := value(t, w2.st, "conductor_restore_sources", "restored"); v != 2 {
		t.Errorf("restored sources %v", v)
	}
	// An unregistration is durable too.
	if err := w2.reg.Unregister(b.Key()); err != nil {
		t.Fatal(err)
	}
	w2.close()
	w3 := mustOpen(t, dir)
	if got := len(w3.reg.Services()); got != 1 {
		t.Errorf("%d services after unregistering one", got)
	}
}

type chain struct {
	keys []uint64
	i    int
}

func (c *chain) Next() (uint64, int, bool) {
	if c.i == len(c.keys) {
		return 0, 0, false
	}
	c.i++
	return c.keys[c.i-1], 16, true
}

// value reads one series of the state's collector: the metric name and,
// when not empty, a label value.
func value(t *testing.T, st *State, name, label string) float64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 64)
	st.Collector().Collect(ch)
	close(ch)
	for m := range ch {
		if !strings.Contains(m.Desc().String(), `fqName: "`+name+`"`) {
			continue
		}
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			t.Fatal(err)
		}
		if label != "" && (len(d.Label) == 0 || d.Label[0].GetValue() != label) {
			continue
		}
		if d.Counter != nil {
			return d.Counter.GetValue()
		}
		return d.Gauge.GetValue()
	}
	t.Fatalf("no series %s{%s}", name, label)
	return 0
}

func TestCorruptRegistrationsStopStartUnlessReset(t *testing.T) {
	dir := t.TempDir()
	w := mustOpen(t, dir)
	if _, err := w.reg.Register(service(t, "a", 0, "tcp://h:1")); err != nil {
		t.Fatal(err)
	}
	w.close()
	name := filepath.Join(dir, regstore.FileName)
	data, _ := os.ReadFile(name)
	data[len(data)/2] ^= 0xff
	if err := os.WriteFile(name, data, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := open(t, dir, false)
	var ce *regstore.CorruptError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), name) {
		t.Fatalf("open with a corrupt record: %v", err)
	}
	w2, err := open(t, dir, true)
	if err != nil {
		t.Fatalf("open with reset: %v", err)
	}
	if n := len(w2.reg.Services()); n != 0 {
		t.Errorf("%d services after reset", n)
	}
}

// Each unusable snapshot is logged at ERROR with the file and the reason,
// moved aside, and the service starts empty with its registrations.
func TestBadSnapshot(t *testing.T) {
	for name, damage := range map[string]func([]byte) []byte{
		"truncated": func(b []byte) []byte { return b[:len(b)-7] },
		"checksum":  func(b []byte) []byte { b[len(b)-2] ^= 1; return b },
		"future version": func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b[8:], snapshot.Version+1)
			return b
		},
		"missing": nil,
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			w := mustOpen(t, dir)
			a := service(t, "a", 0, "tcp://h:1")
			if _, err := w.reg.Register(a); err != nil {
				t.Fatal(err)
			}
			w.apply(a.Key(), 3, 1, 2)
			w.close()
			file := filepath.Join(dir, snapshot.FileName)
			if damage == nil {
				os.Remove(file)
			} else {
				data, _ := os.ReadFile(file)
				if err := os.WriteFile(file, damage(data), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			w2 := mustOpen(t, dir)
			log := w2.log.String()
			if !strings.Contains(log, `"level":"error"`) || !strings.Contains(log, file) {
				t.Errorf("no ERROR naming %s: %s", file, log)
			}
			if len(w2.reg.Services()) != 1 || w2.sources[a.Key()].resume != nil {
				t.Error("registration not restored, or restored with a resume point")
			}
			var res index.QueryResult
			w2.tables[a.Key()].Query(&chain{keys: []uint64{1}}, "", &res)
			if len(res.Instances) != 1 || res.Instances[0].Max.Device != 0 {
				t.Errorf("answer from a bad snapshot: %+v", res.Instances)
			}
			aside, _ := filepath.Glob(file + ".corrupt-*")
			if damage != nil && len(aside) != 1 {
				t.Errorf("moved aside: %v", aside)
			}
		})
	}
}

type failingWriter struct{ err error }

func (f failingWriter) Write([]byte) (int, error) { return 0, f.err }

// A write failure keeps the previous snapshot, is counted by reason, and
// the next attempt succeeds once the fault is gone.
func TestSnapshotWriteFailure(t *testing.T) {
	dir := t.TempDir()
	w := mustOpen(t, dir)
	a := service(t, "a", 0, "tcp://h:1")
	if _, err := w.reg.Register(a); err != nil {
		t.Fatal(err)
	}
	w.apply(a.Key(), 1, 1)
	if err := w.st.Snapshot(); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, snapshot.FileName)
	before, _ := os.ReadFile(file)
	w.apply(a.Key(), 2, 2)
	w.st.writeHook = func(io.Writer) io.Writer { return failingWriter{syscall.ENOSPC} }
	if err := w.st.Snapshot(); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Snapshot on a full disk: %v", err)
	}
	if after, _ := os.ReadFile(file); !bytes.Equal(before, after) {
		t.Error("the previous snapshot changed")
	}
	if v := value(t, w.st, "conductor_snapshot_failures_total", "no_space"); v != 1 {
		t.Errorf("no_space failures %v", v)
	}
	w.st.writeHook = nil
	if err := w.st.Snapshot(); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(file)
	snap, err := snapshot.Read(data)
	if err != nil || len(snap.Sources) != 1 || snap.Sources[0].Seq != 2 {
		t.Errorf("snapshot after recovery: %+v, %v", snap, err)
	}
	// The directory removed underneath: counted as missing_dir.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := w.st.Snapshot(); err == nil {
		t.Fatal("snapshot into a removed directory succeeded")
	}
	if v := value(t, w.st, "conductor_snapshot_failures_total", "missing_dir"); v != 1 {
		t.Errorf("missing_dir failures %v", v)
	}
}

// Close returns the last snapshot's failure, which the app turns into a
// non-zero exit status; the previous snapshot is kept.
func TestCloseReturnsLastSnapshotFailure(t *testing.T) {
	dir := t.TempDir()
	w := mustOpen(t, dir)
	a := service(t, "a", 0, "tcp://h:1")
	if _, err := w.reg.Register(a); err != nil {
		t.Fatal(err)
	}
	w.apply(a.Key(), 1, 1)
	w.st.writeHook = func(io.Writer) io.Writer { return failingWriter{syscall.ENOSPC} }
	if err := w.st.Close(); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Close on a full disk: %v, want ENOSPC", err)
	}
	if _, err := os.Stat(filepath.Join(dir, snapshot.FileName)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a snapshot file after the failed write: %v", err)
	}
	// A second Close has nothing left to write.
	w.st.writeHook = nil
	if err := w.st.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// A restored source that never settles holds readiness until the catch-up
// timeout, is then told to drop its restored entries, and counts as lagging.
func TestReadinessWaitsForRestoredSources(t *testing.T) {
	clock := fakeclock.New(time.Unix(1000, 0))
	st, err := Open(Options{Path: t.TempDir(), Logger: zerolog.Nop(), CatchUpTimeout: 30 * time.Second, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Release()
	if ok, why := st.Ready(); ok || why != "restoring state" {
		t.Errorf("before Start: %v %q", ok, why)
	}
	ix := index.New(index.Options{})
	cat := contexts.New(ix)
	reg := registry.New(registry.Options{Contexts: cat})
	defer reg.Close()
	st.Start(reg, ix, nil)
	defer st.Close()
	// A restored source catching up, as subscriber.Subscriber begins one.
	r := streampos.NewRestore(streampos.Resume{Seq: 1}, st.stats.outcome)
	r.Begin()
	st.readyMu.Lock()
	st.restores = append(st.restores, r)
	st.readyMu.Unlock()
	if ok, why := st.Ready(); ok || why != "1 restored sources are catching up" {
		t.Errorf("catching up: %v %q", ok, why)
	}
	clock.Add(31 * time.Second)
	if ok, _ := st.Ready(); !ok {
		t.Error("not ready after the catch-up timeout")
	}
	if !r.Expired() {
		t.Error("the laggard was not told to drop its restored entries")
	}
	r.Settle(streampos.Lagging) // as the source does when told
	if v := value(t, st, "conductor_restore_sources", "lagging"); v != 1 {
		t.Errorf("lagging %v", v)
	}
}

// The config file's registrations are not recorded (the file is their
// record); dynamic ones are, including one that replaced a file entry.
func TestStaticRegistrationsNotRecorded(t *testing.T) {
	dir := t.TempDir()
	st, err := Open(Options{Path: dir, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	ix := index.New(index.Options{})
	cat := contexts.New(ix)
	reg := registry.New(registry.Options{Contexts: cat})
	a, b := service(t, "a", 0, "tcp://h:1"), service(t, "b", 0, "tcp://h:2")
	for _, s := range []registry.Service{a, b} {
		if _, err := reg.Register(s); err != nil {
			t.Fatal(err)
		}
	}
	st.Start(reg, ix, []registry.Service{a})
	c := service(t, "c", 0, "tcp://h:3")
	if _, err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	st.Close()
	reg.Close()
	ix.Close()
	st.Release()
	got, err := regstore.New(mustDir(t, dir)).Load()
	if err != nil {
		t.Fatal(err)
	}
	var keys []registry.ServiceKey
	for _, s := range got {
		keys = append(keys, s.Key())
	}
	if diff := cmp.Diff([]registry.ServiceKey{"b|default|0", "c|default|0"}, keys); diff != "" {
		t.Errorf("recorded (-want +got):\n%s", diff)
	}
}

func mustDir(t *testing.T, path string) *statedir.Dir {
	t.Helper()
	d, err := statedir.Open(path, statedir.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// A snapshot's position is restored only into the registration it was
// taken for: re-registered under the same key with another endpoint, the
// source starts fresh.
func TestPositionOnlyForTheSameRegistration(t *testing.T) {
	dir := t.TempDir()
	w := mustOpen(t, dir)
	a := service(t, "a", 0, "tcp://h:1")
	if _, err := w.reg.Register(a); err != nil {
		t.Fatal(err)
	}
	w.apply(a.Key(), 5, 1, 2)
	if err := w.st.Snapshot(); err != nil {
		t.Fatal(err)
	}
	old, err := os.ReadFile(filepath.Join(dir, snapshot.FileName))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.reg.Unregister(a.Key()); err != nil {
		t.Fatal(err)
	}
	moved := service(t, "a", 0, "tcp://h:9")
	if _, err := w.reg.Register(moved); err != nil {
		t.Fatal(err)
	}
	w.close()
	// As if the conductor had crashed before snapshotting again.
	if err := os.WriteFile(filepath.Join(dir, snapshot.FileName), old, 0o600); err != nil {
		t.Fatal(err)
	}
	w2 := mustOpen(t, dir)
	if r := w2.sources[a.Key()].resume; r != nil {
		t.Errorf("a different registration resumed at %+v", r)
	}
	var res index.QueryResult
	w2.tables[a.Key()].Query(&chain{keys: []uint64{1}}, "", &res)
	if len(res.Instances) != 1 || res.Instances[0].Max.Device != 0 {
		t.Errorf("entries of the old registration restored: %+v", res.Instances)
	}
}

// TestSharedRegistrationsNotRecorded: with another store as the record,
// the directory's registration record is neither read (a damaged one does
// not stop start-up) nor written, and the snapshot still is.
func TestSharedRegistrationsNotRecorded(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, regstore.FileName), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	st, err := Open(Options{Path: dir, Logger: zerolog.Nop(), SharedRegistrations: true})
	if err != nil {
		t.Fatalf("a damaged record stopped start-up although it is not used: %v", err)
	}
	ix := index.New(index.Options{})
	cat := contexts.New(ix)
	reg := registry.New(registry.Options{Contexts: cat})
	st.Start(reg, ix, nil)
	if _, err := reg.Register(service(t, "a", 0, "tcp://h:1")); err != nil {
		t.Fatal(err)
	}
	st.Close()
	reg.Close()
	ix.Close()
	st.Release()
	if b, err := os.ReadFile(filepath.Join(dir, regstore.FileName)); err != nil || string(b) != "garbage" {
		t.Fatalf("record touched: %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(dir, snapshot.FileName)); err != nil {
		t.Fatalf("no snapshot: %v", err)
	}
}
