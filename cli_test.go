package main

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/rs/zerolog"

	"github.com/mooncake-conductor-go/conductor/internal/apicmd"
	"github.com/mooncake-conductor-go/conductor/internal/config"
	"github.com/mooncake-conductor-go/conductor/subscriber"
)

// TestConsoleLogColoursOnlyOnTerminal: the console format writes escape
// codes for a terminal and plain text for anything else.
func TestConsoleLogColoursOnlyOnTerminal(t *testing.T) {
	defer zerolog.SetGlobalLevel(zerolog.GlobalLevel())
	for _, tc := range []struct {
		name        string
		format      string
		tty, colour bool
	}{
		{"console on a terminal", "console", true, true},
		{"console into a pipe or file", "console", false, false},
		{"json on a terminal", "json", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			log := newLogger(&config.Config{LogLevel: zerolog.InfoLevel, LogFormat: tc.format}, &buf, tc.tty)
			log.Warn().Str("service", "p0").Msg("hello")
			out := buf.String()
			if !strings.Contains(out, "hello") {
				t.Fatalf("nothing logged: %q", out)
			}
			if got := strings.Contains(out, "\x1b["); got != tc.colour {
				t.Errorf("escape codes %v, want %v: %q", got, tc.colour, out)
			}
		})
	}
}

func TestBuildInfoMetric(t *testing.T) {
	e := startApp(t)
	text := e.scrape()
	re := regexp.MustCompile(`(?m)^conductor_build_info\{commit="[^"]+",goversion="` + regexp.QuoteMeta(runtime.Version()) +
		`",libzmq="\d+\.\d+\.\d+",version="[^"]+"\} 1$`)
	if !re.MatchString(text) {
		t.Errorf("no conductor_build_info series of value 1 in:\n%s", grepLines(text, "build_info"))
	}
}

func grepLines(text, sub string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestCommandLine runs the real binary, built with a version and commit
// stamped at link time, the way an operator meets it first.
func TestCommandLine(t *testing.T) {
	bin := conductorBinary(t)
	// The binary records the pebbe/zmq4 it was built with, and it is the
	// release the event receive path mirrors: the check the service runs
	// at start-up is not vacuous and passes.
	bi, err := buildinfo.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(bi.Deps, func(d *debug.Module) bool { return d.Path == "github.com/pebbe/zmq4" }) {
		t.Fatalf("the binary records no github.com/pebbe/zmq4 among %d dependencies", len(bi.Deps))
	}
	if err := subscriber.CheckZMQBinding(bi); err != nil {
		t.Errorf("the binary's own build: %v", err)
	}
	run := commandRunner(t, bin)
	for _, h := range []string{"--help", "-h"} {
		code, out, _ := run("", h)
		if code != 0 || !strings.Contains(out, "-hash-memo-mib int") || !strings.Contains(out, "(default 64)") || !strings.Contains(out, "\nVerbs:\n") {
			t.Errorf("%s: exit %d, stdout %q", h, code, out)
		}
	}
	code, out, _ := run("", "--version")
	want := regexp.MustCompile(`^conductor ` + regexp.QuoteMeta(testBinaryVersion) + ` \(commit ` + testBinaryCommit + `, ` + regexp.QuoteMeta(runtime.Version()) + `, libzmq \d+\.\d+\.\d+\)\n$`)
	if code != 0 || !want.MatchString(out) {
		t.Errorf("--version: exit %d, stdout %q", code, out)
	}
	if code, _, errOut := run("", "--no-such-flag"); code == 0 || !strings.Contains(errOut, "--help") {
		t.Errorf("unknown flag: exit %d, stderr %q", code, errOut)
	}
	// A mistyped verb is a usage error (2), as the verbs' own are, and
	// names the real ones.
	for _, word := range []string{"regster", "serv"} {
		if code, out, errOut := run("", word); code != 2 || out != "" || !strings.Contains(errOut, `unknown verb "`+word+`"`) || !strings.Contains(errOut, "register") {
			t.Errorf("%s: exit %d, stdout %q, stderr %q", word, code, out, errOut)
		}
	}
	// serve is the default verb, named or not; help lists every verb and
	// gives each one's usage.
	for _, args := range [][]string{{"serve", "--help"}, {"help"}, {"help", "serve"}} {
		if code, out, _ := run("", args...); code != 0 || !strings.Contains(out, "  query-by-hash  ") || !strings.Contains(out, "-hash-memo-mib int") {
			t.Errorf("%q: exit %d, stdout %q", args, code, out)
		}
	}
	if code, out, _ := run("", "help", "query-by-hash"); code != 0 || !strings.HasPrefix(out, "Usage: conductor query-by-hash ") {
		t.Errorf("help query-by-hash: exit %d, stdout %q", code, out)
	}
	code, out, _ = run("[1,2,3,4]", "hash", "--strategy", "sglang", "--block-size", "4")
	if code != 0 || !strings.Contains(out, "key 14958615928728313947 (0xcf97adeedb59e05b)  event -3488128144981237669") {
		t.Errorf("hash: exit %d, stdout %q", code, out)
	}
	if code, _, errOut := run("[1", "hash", "--strategy", "sglang", "--block-size", "4"); code != 2 || errOut == "" {
		t.Errorf("hash with bad input: exit %d, stderr %q", code, errOut)
	}
}

// commandRunner runs bin with args and stdin, without a config file, and
// returns its exit code and output; a run that outlives a minute is killed
// (and so fails).
func commandRunner(t *testing.T, bin string) func(stdin string, args ...string) (code int, stdout, stderr string) {
	return func(stdin string, args ...string) (code int, stdout, stderr string) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = append(os.Environ(), "CONDUCTOR_CONFIG_PATH="+filepath.Join(t.TempDir(), "none.json"))
		cmd.Stdin = strings.NewReader(stdin)
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode(), o.String(), e.String()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0, o.String(), e.String()
	}
}

// TestServiceRefusesAnotherZMQBinding: a binary whose event receive path
// mirrors another pebbe/zmq4 release than the one it was built with (here
// linked to claim v0.0.0-other) refuses to serve, naming both releases,
// while --version and the hash subcommand still work.
func TestServiceRefusesAnotherZMQBinding(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "conductor")
	build := exec.Command("go", "build", "-ldflags", "-X github.com/mooncake-conductor-go/conductor/subscriber.pebbeVersion=v0.0.0-other", "-o", bin, ".")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		t.Fatal(err)
	}
	run := commandRunner(t, bin)
	if code, out, _ := run("", "--version"); code != 0 || !strings.HasPrefix(out, "conductor ") {
		t.Errorf("--version: exit %d, stdout %q", code, out)
	}
	if code, out, _ := run("[1,2,3,4]", "hash", "--strategy", "sglang", "--block-size", "4"); code != 0 || !strings.Contains(out, "key 14958615928728313947") {
		t.Errorf("hash: exit %d, stdout %q", code, out)
	}
	code, _, errOut := run("", "--state-dir", t.TempDir(), "--addr", "127.0.0.1:0")
	for _, w := range []string{"github.com/pebbe/zmq4 v1.4.0", "v0.0.0-other"} {
		if code != 1 || !strings.Contains(errOut, w) {
			t.Errorf("service: exit %d, stderr %q does not name %q", code, errOut, w)
		}
	}
	if strings.Contains(errOut, "panic") {
		t.Errorf("service panicked: %s", errOut)
	}
}

// TestHashCheckSeriesFollowRegistration: an engine's hash-check series
// appear at zero when it registers and go when it unregisters.
func TestHashCheckSeriesFollowRegistration(t *testing.T) {
	e := startApp(t)
	pub := newPublisher(t)
	if status, out := e.post("/register", vllmRegistration("hc0", pub.endpoint)); status != 200 {
		t.Fatalf("register: %d %v", status, out)
	}
	series := []string{
		`conductor_hash_check_total{result="match",service="hc0|default|0"}`,
		`conductor_hash_check_total{result="mismatch",service="hc0|default|0"}`,
	}
	text := e.scrape()
	for _, s := range series {
		if got := metricValue(text, s); got != 0 {
			t.Errorf("%s = %v after registration, want 0", s, got)
		}
	}
	if status, out := e.post("/unregister", map[string]any{"instance_id": "hc0", "tenant_id": "default", "dp_rank": 0}); status != 200 {
		t.Fatalf("unregister: %d %v", status, out)
	}
	text = e.scrape()
	for _, s := range series {
		if got := metricValue(text, s); got != -1 {
			t.Errorf("%s = %v after unregistration, want absent", s, got)
		}
	}
}

// TestHashCheckOff: with --hash-check-every 0 an engine gets no checker, so
// no hash-check series appears for it.
func TestHashCheckOff(t *testing.T) {
	e := startAppWith(t, func(c *config.Config) { c.HashCheckEvery = 0 })
	pub := newPublisher(t)
	if status, out := e.post("/register", vllmRegistration("hc-off", pub.endpoint)); status != 200 {
		t.Fatalf("register: %d %v", status, out)
	}
	text := e.scrape()
	for _, s := range []string{
		`conductor_hash_check_total{result="match",service="hc-off|default|0"}`,
		`conductor_hash_check_total{result="mismatch",service="hc-off|default|0"}`,
	} {
		if got := metricValue(text, s); got != -1 {
			t.Errorf("%s = %v with the check off, want absent", s, got)
		}
	}
	if metricValue(text, `conductor_services{type="vLLM"}`) != 1 {
		t.Errorf("the service is not registered:\n%s", text)
	}
}

// TestVerbs: the usage text lists every verb once, with one line each
// (serve, hash, every API verb, help); help answers for each on stdout;
// serve, named or not, leaves the flags to the service; anything else is
// a usage error naming the verbs. Every verb is documented in docs/api.md.
func TestVerbs(t *testing.T) {
	want := append([]string{"serve", "hash"}, apicmd.Names()...)
	want = append(want, "help")
	if d := cmp.Diff(want, verbNames()); d != "" {
		t.Fatalf("verbs (-want +got):\n%s", d)
	}
	u := usage()
	doc, err := os.ReadFile(filepath.Join("docs", "api.md"))
	if err != nil {
		t.Fatal(err)
	}
	getenv := func(string) string { return "" }
	for _, v := range verbs() {
		line := regexp.MustCompile(`(?m)^  `+regexp.QuoteMeta(v.name)+` +(\S.*)$`).FindAllStringSubmatch(u, -1)
		if len(line) != 1 || line[0][1] != v.summary || v.summary == "" || strings.Contains(v.summary, "\n") {
			t.Errorf("%s: usage lines %q, want one with %q", v.name, line, v.summary)
		}
		if !strings.Contains(string(doc), "`"+v.name+"`") && !strings.Contains(string(doc), "`conductor "+v.name) {
			t.Errorf("docs/api.md does not name the verb %s", v.name)
		}
		var out, errOut bytes.Buffer
		_, code, done := runVerb([]string{"help", v.name}, getenv, strings.NewReader(""), &out, &errOut)
		prefix := "Usage: conductor " + v.name + " "
		if v.name == "serve" || v.name == "help" {
			prefix = "Usage: conductor [serve] [flags]"
		}
		if !done || code != 0 || !strings.HasPrefix(out.String(), prefix) || errOut.Len() != 0 {
			t.Errorf("help %s: done %v, exit %d, stdout %q, stderr %q", v.name, done, code, out.String(), errOut.String())
		}
	}
	for _, tc := range []struct {
		args      []string
		serveArgs []string
		code      int
		done      bool
		stdout    string // a prefix
		stderr    string // a part
	}{
		{args: nil, serveArgs: nil},
		{args: []string{"--port", "1"}, serveArgs: []string{"--port", "1"}},
		{args: []string{"serve"}, serveArgs: []string{}},
		{args: []string{"serve", "--port", "1"}, serveArgs: []string{"--port", "1"}},
		{args: []string{"help"}, done: true, stdout: "Usage: conductor [serve] [flags]"},
		{args: []string{"help", "nope"}, code: 2, done: true, stderr: `unknown verb "nope" (verbs: serve, hash, `},
		{args: []string{"help", "query", "hash"}, code: 2, done: true, stderr: "one verb at most"},
		{args: []string{"srve", "--port", "1"}, code: 2, done: true, stderr: `unknown verb "srve" (verbs: serve, hash, `},
		{args: []string{"query", "--help"}, done: true},
	} {
		var out, errOut bytes.Buffer
		serveArgs, code, done := runVerb(tc.args, getenv, strings.NewReader(""), &out, &errOut)
		if !cmp.Equal(serveArgs, tc.serveArgs, cmpopts.EquateEmpty()) || code != tc.code || done != tc.done ||
			!strings.HasPrefix(out.String(), tc.stdout) || !strings.Contains(errOut.String(), tc.stderr) {
			t.Errorf("%q: serve args %q, exit %d, done %v, stdout %.60q, stderr %q", tc.args, serveArgs, code, done, out.String(), errOut.String())
		}
	}
}
