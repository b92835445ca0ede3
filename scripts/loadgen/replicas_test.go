package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/vmihailenco/msgpack/v5"
)

func TestParseTargets(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    []string
		wantErr string
	}{
		{in: "", want: nil},
		{in: "  ", want: nil},
		{in: "http://127.0.0.1:1", want: []string{"http://127.0.0.1:1"}},
		{in: " http://127.0.0.1:1/ ,http://127.0.0.1:2", want: []string{"http://127.0.0.1:1", "http://127.0.0.1:2"}},
		{in: "http://127.0.0.1:1,,http://127.0.0.1:2", wantErr: "empty URL"},
		{in: "http://127.0.0.1:1,", wantErr: "empty URL"},
		{in: "http://127.0.0.1:1,http://127.0.0.1:1/", wantErr: "given twice"},
		{in: strings.Repeat("http://127.0.0.1:1,", 8) + "http://127.0.0.1:9", wantErr: "given twice"},
		{in: "http://127.0.0.1:1,http://127.0.0.1:2,http://127.0.0.1:3,http://127.0.0.1:4,http://127.0.0.1:5," +
			"http://127.0.0.1:6,http://127.0.0.1:7,http://127.0.0.1:8,http://127.0.0.1:9", wantErr: "at most 8"},
	} {
		got, err := parseTargets(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("parseTargets(%q) = %v, %v; want an error with %q", tc.in, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !cmp.Equal(got, tc.want) {
			t.Errorf("parseTargets(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestParsePIDs(t *testing.T) {
	for _, tc := range []struct {
		in      string
		targets int
		want    []int
		ok      bool
	}{
		{"", 2, nil, true},
		{"12, 34", 2, []int{12, 34}, true},
		{"12", 2, nil, false},
		{"12,34,56", 2, nil, false},
		{"12,x", 2, nil, false},
		{"12,0", 2, nil, false},
		{"-3,4", 2, nil, false},
	} {
		got, err := parsePIDs(tc.in, tc.targets)
		if (err == nil) != tc.ok || (tc.ok && !cmp.Equal(got, tc.want)) {
			t.Errorf("parsePIDs(%q, %d) = %v, %v; want %v (ok %v)", tc.in, tc.targets, got, err, tc.want, tc.ok)
		}
	}
}

// The multi-server flags refuse combinations that would measure something
// else than asked, and leave the defaults as they were: one server.
func TestReplicaFlags(t *testing.T) {
	o, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.serverReplicas != 1 || o.targets != nil || o.servers() != 1 {
		t.Errorf("defaults: %d replicas, targets %v", o.serverReplicas, o.targets)
	}
	o, err = parseFlags([]string{"--targets", "http://127.0.0.1:1,http://127.0.0.1:2", "--server-pids", "5,6"})
	if err != nil || o.servers() != 2 || !cmp.Equal(o.serverPIDs, []int{5, 6}) {
		t.Errorf("--targets with --server-pids: %v, %+v", err, o)
	}
	if o, err = parseFlags([]string{"--spawn", "--server-replicas", "3"}); err != nil || o.servers() != 3 {
		t.Errorf("--spawn --server-replicas 3: %v", err)
	}
	for _, bad := range [][]string{
		{"--server-replicas", "2"},
		{"--spawn", "--server-replicas", "0"},
		{"--spawn", "--server-replicas", "9"},
		{"--spawn", "--targets", "http://127.0.0.1:1"},
		{"--server-pids", "5"},
		{"--targets", "http://127.0.0.1:1", "--server-pid", "5"},
		{"--targets", "http://127.0.0.1:1,http://127.0.0.1:2", "--server-pids", "5"},
		{"--spawn", "--server-replicas", "2", "--restart"},
		{"--restart"},
		{"--spawn", "--server-replicas", "2", "--soak", "1m"},
		{"--targets", "http://127.0.0.1:1", "--soak", "1m"},
	} {
		if _, err := parseFlags(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestPerServerFigures(t *testing.T) {
	samples := []sample{{target: 0}, {target: 1}, {target: 0}, {target: 2}, {target: 0}}
	if got := perTarget(samples, 3); !cmp.Equal(got, []int{3, 1, 1}) {
		t.Errorf("perTarget = %v", got)
	}
	if got := total([]time.Duration{time.Second, 2 * time.Second}); got != 3*time.Second {
		t.Errorf("total = %v", got)
	}
	// One unknown server makes the sum unknown, not a smaller number.
	if got := total([]time.Duration{time.Second, -1}); got != -1 {
		t.Errorf("total with an unknown = %v", got)
	}
	for _, tc := range []struct {
		c0, c1, elapsed time.Duration
		want            float64
	}{
		{time.Second, 3 * time.Second, 2 * time.Second, 1},
		{0, 500 * time.Millisecond, time.Second, 0.5},
		{-1, time.Second, time.Second, -1},
		{2 * time.Second, time.Second, time.Second, -1},
		{0, time.Second, 0, -1},
	} {
		if got := cores(tc.c0, tc.c1, tc.elapsed); got != tc.want {
			t.Errorf("cores(%v, %v, %v) = %v, want %v", tc.c0, tc.c1, tc.elapsed, got, tc.want)
		}
	}
}

// answering serves /query with one fixed answer for instance "a".
func answering(t *testing.T, device int64) *httptest.Server {
	t.Helper()
	body, err := msgpack.Marshal(map[string]any{"instances": map[string]any{"a": map[string]any{
		"longest_matched": device, "dp": map[string]int64{"0": device},
		"rank_matches": map[string]any{"0": map[string]int64{"device": device, "cpu_local": device, "cpu_share": device, "disk": device}},
		"device":       device, "cpu_local": device, "cpu_share": device, "disk": device,
	}}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/msgpack")
		w.Write(body)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// The driver sends queries to its targets in turn and checks every
// answer: a replica that answers differently from the model is counted
// and named, however many others answer right.
func TestDriverChecksEveryTarget(t *testing.T) {
	good, bad := answering(t, 16), answering(t, 32)
	var targets []*api
	for _, srv := range []*httptest.Server{good, bad, good} {
		a, err := newAPI(srv.URL, "", 4)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(a.close)
		targets = append(targets, a)
	}
	fails := &failures{}
	d := &driver{targets: targets, pool: []preparedQuery{{query: &query{kind: kindFull, expect: []int{16}}, body: []byte{0x80}}},
		ids: []string{"a"}, fails: fails, pres: func(int) presence { return mustMatch }}
	t0 := time.Now()
	samples, _ := d.run(context.Background(), 1, t0, t0.Add(time.Minute), 9, nil)
	if got := perTarget(samples, 3); !cmp.Equal(got, []int{3, 3, 3}) {
		t.Fatalf("queries per target %v, want 3 each", got)
	}
	if got := fails.count.Load(); got != 3 {
		t.Fatalf("%d failures, want the bad target's 3: %v", got, fails.first)
	}
	for _, f := range fails.first {
		if !strings.Contains(f, bad.URL) {
			t.Errorf("failure %q does not name the bad target %s", f, bad.URL)
		}
	}
}

// Two spawned servers: every publisher registered on both, each one's
// answers to the whole pool checked, and the timed queries split between
// them with every answer checked.
func TestServerReplicasShort(t *testing.T) {
	if testing.Short() {
		t.Skip("loadgen: spawns and loads two servers for a few seconds")
	}
	o, ctx := spawnedRun(t, "--server-replicas", "2", "--publishers", "2", "--prompts", "40", "--prompt-tokens", "512",
		"--system-tokens", "128", "--groups", "4", "--queries", "40", "--cold-pass", "--concurrency", "2", "--duration", "500ms")
	rep, err := run(ctx, o)
	if rep == nil {
		t.Fatalf("load did not run: %v", err)
	}
	md := logMarkdown(t, rep)
	if err != nil || rep.Failures != 0 {
		t.Fatalf("load failed (%v): %d wrong answers or errors", err, rep.Failures)
	}
	if rep.ServerReplicas != 2 || len(rep.Targets) != 2 || rep.Targets[0] == rep.Targets[1] {
		t.Fatalf("servers: %d at %v", rep.ServerReplicas, rep.Targets)
	}
	if len(rep.Levels) != 1 {
		t.Fatalf("levels: %+v", rep.Levels)
	}
	l := rep.Levels[0]
	if len(l.PerServer) != 2 || l.PerServer[0].Queries == 0 || l.PerServer[1].Queries == 0 ||
		l.PerServer[0].Queries+l.PerServer[1].Queries != l.Queries {
		t.Fatalf("queries not split between the servers: %+v of %d", l.PerServer, l.Queries)
	}
	for _, p := range l.PerServer {
		if p.ServerCPUPerQueryUS <= 0 && p.ServerCPUCores < 0 {
			t.Errorf("no CPU figure for %s: %+v", p.Target, p)
		}
	}
	// The verification pass asks each server the whole pool, the cold
	// pass every stored prompt once: both count as checked answers.
	if min := int64(2*40 + 40 + l.Queries); rep.Checked < min {
		t.Errorf("%d answers checked, want at least %d", rep.Checked, min)
	}
	if !strings.Contains(md, "2 servers, queries sent to them in turn") {
		t.Error("the Markdown report lacks the per-server table")
	}
}

// TestRestartShort: --restart stops the spawned server, starts it again on
// its state directory, and checks every answer of the pool again.
func TestRestartShort(t *testing.T) {
	if testing.Short() {
		t.Skip("loadgen: spawns, loads and restarts a server")
	}
	o, ctx := spawnedRun(t, "--restart", "--publishers", "2", "--prompts", "40", "--prompt-tokens", "512",
		"--system-tokens", "128", "--groups", "4", "--queries", "40", "--concurrency", "1", "--duration", "300ms")
	rep, err := run(ctx, o)
	if rep == nil {
		t.Fatalf("load did not run: %v", err)
	}
	logMarkdown(t, rep)
	if err != nil || rep.Failures != 0 {
		t.Fatalf("load failed (%v): %d wrong answers or errors", err, rep.Failures)
	}
	r := rep.Restart
	if r == nil {
		t.Fatal("no restart in the report")
	}
	if r.Checked != 40 || r.Failures != 0 || r.ToReadyMS <= 0 || r.StopMS <= 0 {
		t.Errorf("restart: %+v, want the pool of 40 checked again without failures", r)
	}
}
