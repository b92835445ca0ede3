package apicmd

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/contexts"
	"github.com/mooncake-conductor-go/conductor/internal/hashing/hashcmd"
	"github.com/mooncake-conductor-go/conductor/registry"
	"github.com/mooncake-conductor-go/conductor/server"
)

// startServer runs the real HTTP server on loopback port 0.
func startServer(t *testing.T, opts server.Options) string {
	t.Helper()
	ix := index.New(index.Options{})
	cat := contexts.New(ix)
	reg := registry.New(registry.Options{Contexts: cat})
	opts.Registry, opts.Contexts = reg, cat
	srv := server.New(opts)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		_ = srv.Shutdown(context.Background())
		<-done
		reg.Close()
	})
	return "http://" + ln.Addr().String()
}

type result struct {
	code           int
	stdout, stderr string
}

func run(t *testing.T, env map[string]string, stdin string, name string, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	code := Run(name, args, func(k string) string { return env[k] }, strings.NewReader(stdin), &out, &errb)
	return result{code, out.String(), errb.String()}
}

// decoded parses stdout, which must be one JSON value.
func decoded(t *testing.T, r result) any {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
		t.Fatalf("stdout is not JSON (%v): %q (stderr %q)", err, r.stdout, r.stderr)
	}
	return v
}

const registerBody = `{"endpoint":"tcp://127.0.0.1:7001","type":"vLLM","modelname":"m","instance_id":"inst-a",
  "block_size":16,"dp_rank":0,
  "hash_profile":{"strategy":"vllm_v1","algorithm":"sha256_cbor","python_hash_seed":"0","index_projection":"low64_be"}}`

// The whole round: register, list, query, unregister, with the exit
// codes and bodies a script relies on, and the bearer token from a file.
func TestSubcommandsAgainstServer(t *testing.T) {
	base := startServer(t, server.Options{AuthToken: "s3cret", DebugRoutes: true})
	tokFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	reqFile := filepath.Join(t.TempDir(), "register.json")
	if err := os.WriteFile(reqFile, []byte(registerBody), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"CONDUCTOR_SERVER": base}
	query := `{"model":"m","block_size":16,"token_ids":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]}`
	for _, tc := range []struct {
		name     string
		cmd      string
		args     []string
		stdin    string
		code     int
		want     any // decoded stdout; nil: not compared
		stderrRe string
		contains string // a line of the indented JSON answer
	}{
		{name: "register without the token", cmd: "register", stdin: registerBody, code: 1,
			want: map[string]any{"error": "a valid bearer token is required"}, stderrRe: "401"},
		{name: "register a bad body", cmd: "register", args: []string{"--token-file", tokFile}, stdin: `{"type":"vLLM"}`, code: 1,
			want: map[string]any{"error": "endpoint is required", "reason": "missing", "field": "endpoint"}, stderrRe: "400"},
		{name: "register a repeated member", cmd: "register", args: []string{"--token-file", tokFile}, stdin: `{"type":"vLLM","type":"vLLM"}`, code: 1},
		{name: "register from --file", cmd: "register", args: []string{"--token-file", tokFile, "--file", reqFile}, code: 0,
			want: map[string]any{"status": "registered successfully", "instance_id": "inst-a"}},
		{name: "services", cmd: "services", code: 0, contains: `"InstanceID": "inst-a"`},
		{name: "global-view", cmd: "global-view", code: 0, contains: `"inst-a"`},
		{name: "query", cmd: "query", stdin: query, code: 0, contains: `"inst-a": {`},
		{name: "query with a float block size", cmd: "query", stdin: `{"model":"m","block_size":16.5,"token_ids":[1]}`, code: 1},
		{name: "explain", cmd: "explain", stdin: query, code: 0, contains: `"context_known": true`},
		{name: "unregister an unknown service", cmd: "unregister", args: []string{"--token-file", tokFile}, stdin: `{"instance_id":"nobody","dp_rank":0}`, code: 1,
			want: map[string]any{"error": "service not found: nobody|default|0"}, stderrRe: "404"},
		{name: "unregister", cmd: "unregister", args: []string{"--token-file", tokFile}, stdin: `{"instance_id":"inst-a","dp_rank":0}`, code: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, env, tc.stdin, tc.cmd, tc.args...)
			if r.code != tc.code {
				t.Fatalf("exit %d, want %d; stdout %q stderr %q", r.code, tc.code, r.stdout, r.stderr)
			}
			got := decoded(t, r)
			if !strings.Contains(r.stdout, tc.contains) {
				t.Errorf("answer does not contain %q:\n%s", tc.contains, r.stdout)
			}
			if tc.want != nil {
				if diff := cmp.Diff(tc.want, got); diff != "" {
					t.Errorf("answer (-want +got):\n%s", diff)
				}
			}
			if tc.code == 1 {
				if m, ok := got.(map[string]any); !ok || m["error"] == nil {
					t.Errorf("error answer without an error member: %v", got)
				}
				if strings.Count(r.stderr, "\n") != 1 || !strings.Contains(r.stderr, tc.stderrRe) {
					t.Errorf("stderr %q: want one line naming %q", r.stderr, tc.stderrRe)
				}
			}
			if tc.code == 0 && r.stderr != "" {
				t.Errorf("stderr on success: %q", r.stderr)
			}
		})
	}
	if r := run(t, env, "", "services"); strings.Contains(r.stdout, "inst-a") {
		t.Errorf("services after unregister still lists inst-a: %s", r.stdout)
	}
}

// The query's answer printed is the JSON form of the server's
// MessagePack, member for member.
func TestQueryAnswerShape(t *testing.T) {
	base := startServer(t, server.Options{})
	env := map[string]string{"CONDUCTOR_SERVER": base}
	if r := run(t, env, registerBody, "register"); r.code != 0 {
		t.Fatalf("register: %+v", r)
	}
	r := run(t, env, `{"model":"m","block_size":16,"token_ids":[1,2,3]}`, "query")
	if r.code != 0 {
		t.Fatalf("query: %+v", r)
	}
	got := decoded(t, r).(map[string]any)
	if _, ok := got["instances"].(map[string]any)["inst-a"]; !ok {
		t.Errorf("query answer %v does not name the registered instance", got)
	}
	r = run(t, env, "", "services")
	svcs := decoded(t, r)
	if !strings.Contains(r.stdout, "inst-a") {
		t.Errorf("services answer %v does not list inst-a", svcs)
	}
}

// Usage errors and an unreachable server exit 2 with one line on stderr
// and nothing on stdout; --help exits 0.
func TestUsageAndUnreachable(t *testing.T) {
	// A port nothing listens on: bound, then closed.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	for _, tc := range []struct {
		name  string
		env   map[string]string
		cmd   string
		args  []string
		stdin string
		code  int
		errRe string
	}{
		{"help", nil, "query", []string{"--help"}, "", 0, "Usage: conductor query"},
		{"help of a GET command", nil, "services", []string{"-h"}, "", 0, "Usage: conductor services"},
		{"unreachable", map[string]string{"CONDUCTOR_SERVER": dead}, "services", nil, "", 2, "no answer from " + dead},
		{"unreachable by flag", nil, "query", []string{"--server", dead}, `{}`, 2, "no answer from " + dead},
		{"not JSON", nil, "query", []string{"--server", dead}, `{"model":`, 2, "not one JSON value"},
		{"trailing data", nil, "query", []string{"--server", dead}, `{} {}`, 2, "unexpected data after the value"},
		{"empty input", nil, "register", []string{"--server", dead}, ``, 2, "empty input"},
		{"no such file", nil, "register", []string{"--server", dead, "--file", "/nonexistent/x.json"}, ``, 2, "/nonexistent/x.json"},
		{"GET command takes no --file", nil, "services", []string{"--file", "x"}, ``, 2, "flag provided but not defined"},
		{"extra argument", nil, "services", []string{"now"}, ``, 2, "unexpected arguments"},
		{"bad server URL", nil, "services", []string{"--server", "127.0.0.1:13333"}, ``, 2, "not an http:// or https:// base URL"},
		{"missing token file", nil, "services", []string{"--server", dead, "--token-file", "/nonexistent/t"}, ``, 2, "--token-file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, tc.env, tc.stdin, tc.cmd, tc.args...)
			if r.code != tc.code {
				t.Fatalf("exit %d, want %d: %+v", r.code, tc.code, r)
			}
			if !strings.Contains(r.stderr, tc.errRe) {
				t.Errorf("stderr %q does not contain %q", r.stderr, tc.errRe)
			}
			if tc.code == 2 {
				if r.stdout != "" || strings.Count(r.stderr, "\n") != 1 {
					t.Errorf("want one stderr line and no stdout: %+v", r)
				}
			}
		})
	}
}

func TestJSONToMsgpack(t *testing.T) {
	for _, tc := range []struct {
		in, hex string
	}{
		// Members in order, a repeated one kept.
		{`{"b":1,"a":2,"b":3}`, "83a16201a16102a16203"},
		{`[0,-1,127,128,-33,65536]`, "9600ff7fcc80d0dfce00010000"},
		{`18446744073709551615`, "cfffffffffffffffff"},
		{`-9223372036854775808`, "d38000000000000000"},
		{`1.5`, "cb3ff8000000000000"},
		{`16.0`, "cb4030000000000000"},
		{`[true,false,null,"x"]`, "94c3c2c0a178"},
		{`{}`, "80"},
		{`{"t":[[1,2],[3]]}`, "81a174929201029103"},
	} {
		got, err := JSONToMsgpack([]byte(tc.in))
		if err != nil {
			t.Errorf("%s: %v", tc.in, err)
			continue
		}
		if hex.EncodeToString(got) != tc.hex {
			t.Errorf("%s: got %x, want %s", tc.in, got, tc.hex)
		}
	}
	for _, bad := range []string{``, `{`, `[1,]`, `{} 1`, `18446744073709551616`, `{"a"}`} {
		if _, err := JSONToMsgpack([]byte(bad)); err == nil {
			t.Errorf("%q: accepted", bad)
		}
	}
}

// `conductor services` prints the JSON form of /services, which adds each
// source's State, StateDetail, PublisherRestarts and StaleRecoveries to the
// contract's fields.
func TestServicesShowsSourceState(t *testing.T) {
	base := startServer(t, server.Options{})
	env := map[string]string{"CONDUCTOR_SERVER": base}
	if r := run(t, env, registerBody, "register"); r.code != 0 {
		t.Fatalf("register: %+v", r)
	}
	r := run(t, env, "", "services")
	if r.code != 0 {
		t.Fatalf("services: %+v", r)
	}
	svcs := decoded(t, r).(map[string]any)["services"].([]any)
	if len(svcs) != 1 {
		t.Fatalf("services: %v", svcs)
	}
	svc := svcs[0].(map[string]any)
	for _, f := range []string{"State", "StateDetail", "PublisherRestarts", "StaleRecoveries", "InstanceID", "HashProfile"} {
		if _, ok := svc[f]; !ok {
			t.Errorf("service has no %s: %v", f, svc)
		}
	}
	if s, _ := svc["State"].(string); s == "" {
		t.Errorf("State %v, want a state name", svc["State"])
	}
	if n, ok := svc["PublisherRestarts"].(float64); !ok || n != 0 {
		t.Errorf("PublisherRestarts %v, want 0", svc["PublisherRestarts"])
	}
}

// Against a server without --debug-routes, explain says how to turn the
// route on; other 404s keep the bare status line.
func TestExplainWithoutDebugRoutes(t *testing.T) {
	base := startServer(t, server.Options{})
	env := map[string]string{"CONDUCTOR_SERVER": base}
	r := run(t, env, `{"model":"m","block_size":16,"token_ids":[1]}`, "explain")
	if r.code != 1 {
		t.Fatalf("exit %d, want 1: %+v", r.code, r)
	}
	if !strings.Contains(r.stderr, "404") || !strings.Contains(r.stderr, "--debug-routes") || strings.Count(r.stderr, "\n") != 1 {
		t.Errorf("stderr %q: want one line naming 404 and --debug-routes", r.stderr)
	}
	r = run(t, env, `{"instance_id":"nobody","dp_rank":0}`, "unregister")
	if r.code != 1 || strings.Contains(r.stderr, "debug-routes") {
		t.Errorf("unregister of an unknown service: %+v", r)
	}
}

// explain prints its 64-bit keys as decimal strings, the very strings
// `conductor hash --json` prints, so jq does not round them.
func TestExplainKeysAreStrings(t *testing.T) {
	base := startServer(t, server.Options{DebugRoutes: true})
	env := map[string]string{"CONDUCTOR_SERVER": base}
	if r := run(t, env, registerBody, "register"); r.code != 0 {
		t.Fatalf("register: %+v", r)
	}
	toks := "[" + strings.Repeat("7,", 31) + "7]"
	r := run(t, env, `{"model":"m","block_size":16,"token_ids":`+toks+`}`, "explain")
	if r.code != 0 {
		t.Fatalf("explain: %+v", r)
	}
	var hashOut, hashErr bytes.Buffer
	if code := hashcmd.Run([]string{"--strategy", "vllm_v1", "--algorithm", "sha256_cbor", "--seed", "0", "--block-size", "16", "--json"},
		strings.NewReader(toks), &hashOut, &hashErr); code != 0 {
		t.Fatalf("hash: %d %s", code, hashErr.String())
	}
	var want []any
	for _, line := range strings.Split(strings.TrimSpace(hashOut.String()), "\n") {
		var b struct{ Key string }
		if err := json.Unmarshal([]byte(line), &b); err != nil {
			t.Fatal(err)
		}
		want = append(want, b.Key)
	}
	var got []any
	for _, b := range decoded(t, r).(map[string]any)["blocks"].([]any) {
		got = append(got, b.(map[string]any)["key"])
	}
	if diff := cmp.Diff(want, got); diff != "" || len(got) != 2 {
		t.Errorf("explain's keys (-hash --json +explain):\n%s", diff)
	}
}

func TestQuoteMembers(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"key":18446744073709551615}`, `{"key":"18446744073709551615"}`},
		{`{"b":1,"key":2,"a":[{"key":3,"x":{"key":-4}},5,"key"],"key2":6}`,
			`{"b":1,"key":"2","a":[{"key":"3","x":{"key":"-4"}},5,"key"],"key2":6}`},
		{`{"key":"s","k":{"key":null},"e":{},"l":[]}`, `{"key":"s","k":{"key":null},"e":{},"l":[]}`},
		{`[1,{"key":[1,2]},true]`, `[1,{"key":[1,2]},true]`},
		{`12`, `12`},
	} {
		got, err := quoteMembers([]byte(tc.in), []string{"key"})
		if err != nil || string(got) != tc.want {
			t.Errorf("%s: got %s (%v), want %s", tc.in, got, err, tc.want)
		}
	}
	if _, err := quoteMembers([]byte(`{"key":`), []string{"key"}); err == nil {
		t.Error("truncated JSON accepted")
	}
}

// TestQueryByHashVerb: the verb sends seq_hashes (64-bit values kept
// exact from JSON) from stdin or --file and prints the answer or the 400.
func TestQueryByHashVerb(t *testing.T) {
	base := startServer(t, server.Options{})
	env := map[string]string{"CONDUCTOR_SERVER": base}
	reg := `{"endpoint":"tcp://127.0.0.1:7002","type":"vLLM","modelname":"std","instance_id":"std-a","block_size":16,"dp_rank":0,
	  "hash_profile":{"strategy":"rfc1527","algorithm":"xxh3_64","seed":"1337"}}`
	if r := run(t, env, reg, "register"); r.code != 0 {
		t.Fatalf("register: %d %s %s", r.code, r.stdout, r.stderr)
	}
	if r := run(t, env, "", "services"); !strings.Contains(r.stdout, `"seed": "1337"`) {
		t.Errorf("services does not show the standard profile's seed: %s", r.stdout)
	}
	file := filepath.Join(t.TempDir(), "q.json")
	if err := os.WriteFile(file, []byte(`{"model":"std","block_size":16,"seq_hashes":[16863443419780771464,18446744073709551615]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	r := run(t, env, "", "query-by-hash", "--file", file)
	want := map[string]any{"instances": map[string]any{"std-a": map[string]any{"longest_matched": 0.0, "dp": map[string]any{"0": 0.0},
		"rank_matches": map[string]any{"0": map[string]any{"device": 0.0, "cpu_local": 0.0, "cpu_share": 0.0, "disk": 0.0}},
		"device":       0.0, "cpu_local": 0.0, "cpu_share": 0.0, "disk": 0.0}}}
	if r.code != 0 {
		t.Fatalf("query-by-hash: %d %s %s", r.code, r.stdout, r.stderr)
	}
	if d := cmp.Diff(want, decoded(t, r)); d != "" {
		t.Errorf("answer (-want +got):\n%s", d)
	}
	r = run(t, env, `{"model":"std","block_size":16,"seq_hashes":[1,-2]}`, "query-by-hash")
	if d := cmp.Diff(map[string]any{"error": "seq_hashes[1] is negative; entries are unsigned 64-bit keys", "reason": "invalid_value",
		"field": "seq_hashes", "index": 1.0}, decoded(t, r)); d != "" || r.code != 1 {
		t.Errorf("exit %d; error (-want +got):\n%s", r.code, d)
	}
}
