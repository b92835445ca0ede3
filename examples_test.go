package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// pythonWith returns a Python 3 that can import modules: Debian's
// /usr/bin/python3 first (scripts/setup.sh --test installs python3-msgpack and
// python3-zmq for it), then whichever python3 is on PATH.
func pythonWith(t *testing.T, modules ...string) string {
	t.Helper()
	var tried []string
	for _, py := range []string{"/usr/bin/python3", "python3"} {
		path, err := exec.LookPath(py)
		if err != nil {
			continue
		}
		tried = append(tried, path)
		if exec.Command(path, "-c", "import "+strings.Join(modules, ", ")).Run() == nil {
			return path
		}
	}
	t.Fatalf("no Python 3 with %v among %v: run scripts/setup.sh --test (Debian's python3-msgpack and python3-zmq)", modules, tried)
	return ""
}

// TestPythonExample runs examples/python/publish_and_query.py against the
// real binary, with a bearer token: it registers a publisher, publishes a
// vLLM BlockStored it hashed itself, and exits 0 only once /query reports
// every block cached, so the example cannot drift from the service.
func TestPythonExample(t *testing.T) {
	conductorBinary(t) // built once per run; skips under -short
	py := pythonWith(t, "msgpack", "zmq")
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("example-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startConductor(t, filepath.Join(t.TempDir(), "state"), "--auth-token-file", tok)
	cmd := exec.Command(py, filepath.Join("examples", "python", "publish_and_query.py"),
		"--server", p.base, "--token-file", tok, "--timeout", "60")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("example failed: %v\n%s", err, out)
	}
	for _, want := range []string{"register: 200", "'device': 48", "unregister: 200"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// Its events carried extra_keys, so the ingest hash check could
	// check them, and they matched.
	log := p.logText()
	if strings.Contains(log, "cannot check this service's blocks") || strings.Contains(log, "does not reproduce") {
		t.Errorf("the hash check could not confirm the example's blocks:\n%s", log)
	}
	p.stop()
}

// TestSubcommandsThroughTheBinary: main dispatches the client
// subcommands, which reach a running conductor and exit with its answer's
// class.
func TestSubcommandsThroughTheBinary(t *testing.T) {
	bin := conductorBinary(t)
	p := startConductor(t, filepath.Join(t.TempDir(), "state"))
	run := func(stdin string, args ...string) (int, string, string) {
		cmd := exec.Command(bin, args...)
		cmd.Stdin = strings.NewReader(stdin)
		cmd.Env = append(os.Environ(), "CONDUCTOR_SERVER="+p.base)
		var out, errb strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return code, out.String(), errb.String()
	}
	if code, _, errs := run("", "global-view", "--help"); code != 0 || !strings.Contains(errs, "Usage: conductor global-view") {
		t.Errorf("global-view --help: exit %d, %q", code, errs)
	}
	if code, out, errs := run("", "services"); code != 0 || !strings.Contains(out, `"count": 0`) {
		t.Errorf("services: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	if code, out, _ := run(`{"model":"m"}`, "query"); code != 1 || !strings.Contains(out, `"reason": "missing"`) {
		t.Errorf("query without token_ids: exit %d, stdout %q", code, out)
	}
	if code, out, errs := run("", "services", "--server", "http://127.0.0.1:1"); code != 2 || out != "" || strings.Count(errs, "\n") != 1 {
		t.Errorf("unreachable: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	p.stop()
}
