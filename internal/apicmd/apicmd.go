// Package apicmd is the command line of a running conductor: the
// subcommands register, unregister, query, query-by-hash, services,
// global-view and explain send one request to the HTTP API and print its answer as JSON.
//
// The API speaks MessagePack, which a shell cannot write; these
// subcommands take the request as JSON with exactly the API's field names
// (docs/api.md), re-encode it value for value as MessagePack, and turn the
// MessagePack answer back into JSON. Nothing is checked on this side: the
// server's decoder is the one judge of a request, so what the command line
// accepts and refuses is what a router sees.
package apicmd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/mooncake-conductor-go/conductor/codec"
	"github.com/mooncake-conductor-go/conductor/internal/bearer"
)

// Exit codes, as the issue and `conductor hash` define them.
const (
	exitOK     = 0
	exitAnswer = 1 // the server answered with an error status
	exitUsage  = 2 // bad flags or input, or no answer at all
)

// DefaultServer is the base URL used without --server or CONDUCTOR_SERVER:
// the service's default port on this machine.
const DefaultServer = "http://127.0.0.1:13333"

// maxAnswer bounds the answer read, far above any real one (a /services
// of 4,096 services is a few MiB), so a wrong URL cannot exhaust memory.
const maxAnswer = 256 << 20

// command is one subcommand: the route it calls and what it says of itself.
type command struct {
	method, path string
	summary      string
	example      string
}

func (c command) body() bool { return c.method == http.MethodPost }

var commands = map[string]command{
	"register": {http.MethodPost, "/register",
		"registers an engine's or the Mooncake master's event publisher (POST /register)",
		`{"endpoint":"tcp://10.0.0.1:5557","type":"vLLM","modelname":"deepseek","instance_id":"prefill-0","block_size":16,"dp_rank":0,` +
			`"hash_profile":{"strategy":"vllm_v1","algorithm":"sha256_cbor","python_hash_seed":"0","index_projection":"low64_be"}}`},
	"unregister": {http.MethodPost, "/unregister",
		"removes a registration and its engine's blocks (POST /unregister)",
		`{"instance_id":"prefill-0","dp_rank":0}`},
	"query": {http.MethodPost, "/query",
		"asks how many leading tokens of a prompt each instance holds, per tier (POST /query)",
		`{"model":"deepseek","block_size":16,"token_ids":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]}`},
	"query-by-hash": {http.MethodPost, "/query_by_hash",
		"asks the same with the prompt's block hashes instead of its tokens (POST /query_by_hash)",
		`{"model":"deepseek","block_size":16,"seq_hashes":[16863443419780771464,12466389667045779788]}`},
	"explain": {http.MethodPost, "/debug/explain",
		"says where each owner's run stopped and why, for a server started with --debug-routes (POST /debug/explain)",
		`{"model":"deepseek","block_size":16,"token_ids":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]}`},
	"services": {http.MethodGet, "/services",
		"lists the registered services and their sources' state (GET /services)", ""},
	"global-view": {http.MethodGet, "/global_view",
		"lists every context with its instances and prefix counts (GET /global_view)", ""},
}

// accept is the Accept header a subcommand sends when it is not
// MessagePack. /services adds each source's State, PublisherRestarts and
// StaleRecoveries to its JSON form only, so that is the form a person
// asking for it gets.
var accept = map[string]string{"services": "application/json"}

// notFound is added to the status line of a subcommand's 404: why its
// route can be missing and how to turn it on.
var notFound = map[string]string{
	"explain": "the server serves /debug/explain only when started with --debug-routes (or CONDUCTOR_DEBUG_ROUTES=1)",
}

// keyMembers names, per subcommand, the answer members whose numbers are
// 64-bit keys. They are printed as decimal strings, as `conductor hash
// --json` prints keys, because readers that parse JSON numbers as doubles
// (jq, JavaScript) round them.
var keyMembers = map[string][]string{"explain": {"key"}}

// Names returns the subcommands, sorted, for the main usage text.
func Names() []string {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Summary is subcommand name's one-line description, for the main usage
// text; empty for a name that is not one.
func Summary(name string) string { return commands[name].summary }

// Is reports whether name is one of this package's subcommands.
func Is(name string) bool {
	_, ok := commands[name]
	return ok
}

// options are one invocation's parsed flags.
type options struct {
	server    string
	tokenFile string
	file      string
	timeout   time.Duration
}

// Run executes subcommand name with args (the words after it) and returns
// the process exit code. getenv is os.Getenv in production.
func Run(name string, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) int {
	cmd, ok := commands[name]
	if !ok {
		fmt.Fprintf(stderr, "conductor: unknown subcommand %q\n", name)
		return exitUsage
	}
	prog := "conductor " + name
	o, err := parseFlags(prog, cmd, args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", prog, err)
		return exitUsage
	}
	req, err := newRequest(name, cmd, o, stdin)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", prog, err)
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		fmt.Fprintf(stderr, "%s: no answer from %s: %v\n", prog, o.server, unwrapURLError(err))
		return exitUsage
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer+1))
	if err == nil && len(raw) > maxAnswer {
		err = fmt.Errorf("answer is over %d MiB", maxAnswer>>20)
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: reading the answer from %s: %v\n", prog, o.server, err)
		return exitUsage
	}
	js, err := answerJSON(resp.Header.Get("Content-Type"), raw, keyMembers[name])
	if err != nil {
		fmt.Fprintf(stderr, "%s: %s answered %s with a body that is not MessagePack or JSON: %v\n", prog, o.server, resp.Status, err)
		return exitUsage
	}
	stdout.Write(js)
	if resp.StatusCode/100 != 2 {
		if hint := notFound[name]; resp.StatusCode == http.StatusNotFound && hint != "" {
			fmt.Fprintf(stderr, "%s: %s: %s\n", prog, resp.Status, hint)
		} else {
			fmt.Fprintf(stderr, "%s: %s\n", prog, resp.Status)
		}
		return exitAnswer
	}
	return exitOK
}

func parseFlags(prog string, cmd command, args []string, getenv func(string) string, stderr io.Writer) (options, error) {
	o := options{server: getenv("CONDUCTOR_SERVER")}
	if o.server == "" {
		o.server = DefaultServer
	}
	fl := flag.NewFlagSet(prog, flag.ContinueOnError)
	// The flag package prints its error and the whole usage text; a
	// usage error here is one line (Run's), the text only on --help.
	fl.SetOutput(io.Discard)
	fl.StringVar(&o.server, "server", o.server, "base URL of the conductor (environment CONDUCTOR_SERVER)")
	fl.StringVar(&o.tokenFile, "token-file", "", "file holding the bearer token of a server run with --auth-token-file")
	if cmd.body() {
		fl.StringVar(&o.file, "file", "", "read the JSON request from this file instead of stdin")
	}
	fl.DurationVar(&o.timeout, "timeout", 30*time.Second, "how long to wait for the answer")
	usage := func() {
		w := stderr
		fl.SetOutput(stderr)
		if cmd.body() {
			fmt.Fprintf(w, "Usage: %s [--server URL] [--token-file F] [--file request.json] < request.json\n\n", prog)
			fmt.Fprintf(w, "%s.\n\nThe request is one JSON object with the HTTP API's field names (docs/api.md),\n"+
				"sent as MessagePack; the answer is printed as JSON. Exit status: 0 on a 2xx\n"+
				"answer, 1 on an error answer (its body printed, with reason and field),\n"+
				"2 on a usage error or when the server cannot be reached.\n\nExample:\n  echo '%s' | %s\n\n",
				capitalize(cmd.summary), cmd.example, prog)
		} else {
			fmt.Fprintf(w, "Usage: %s [--server URL] [--token-file F]\n\n", prog)
			fmt.Fprintf(w, "%s.\n\nThe answer is printed as JSON. Exit status: 0 on a 2xx answer, 1 on an\n"+
				"error answer (its body printed), 2 on a usage error or when the server\ncannot be reached.\n\n",
				capitalize(cmd.summary))
		}
		fl.PrintDefaults()
	}
	fl.Usage = func() {}
	if err := fl.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage()
			return o, err
		}
		return o, fmt.Errorf("%w (see --help)", err)
	}
	if fl.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q (see --help)", fl.Args())
	}
	u, err := url.Parse(o.server)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return o, fmt.Errorf("--server %q is not an http:// or https:// base URL", o.server)
	}
	if o.timeout <= 0 {
		return o, errors.New("--timeout must be positive")
	}
	return o, nil
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// newRequest builds the HTTP request: the JSON body re-encoded as
// MessagePack for the POST routes, the bearer token when given, and an
// Accept that prefers MessagePack answers (errors come as MessagePack too
// and are converted here alike), or the command's own.
func newRequest(name string, cmd command, o options, stdin io.Reader) (*http.Request, error) {
	var body io.Reader
	if cmd.body() {
		in := stdin
		if o.file != "" {
			f, err := os.Open(o.file)
			if err != nil {
				return nil, err
			}
			defer f.Close()
			in = f
		}
		data, err := io.ReadAll(in)
		if err != nil {
			return nil, fmt.Errorf("reading the request: %w", err)
		}
		packed, err := JSONToMsgpack(data)
		if err != nil {
			return nil, fmt.Errorf("the request is not one JSON value: %w", err)
		}
		body = bytes.NewReader(packed)
	}
	req, err := http.NewRequest(cmd.method, strings.TrimRight(o.server, "/")+cmd.path, body)
	if err != nil {
		return nil, err
	}
	if cmd.body() {
		req.Header.Set("Content-Type", "application/msgpack")
	}
	if a := accept[name]; a != "" {
		req.Header.Set("Accept", a)
	} else {
		req.Header.Set("Accept", "application/msgpack")
	}
	if o.tokenFile != "" {
		tok, err := os.ReadFile(o.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("--token-file: %w", err)
		}
		t := strings.TrimSpace(string(tok))
		if t == "" {
			return nil, fmt.Errorf("--token-file %s is empty", o.tokenFile)
		}
		req.Header.Set("Authorization", bearer.Header(t))
	}
	return req, nil
}

// unwrapURLError drops net/http's "Post \"URL\": " prefix, which repeats
// what the message already names.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// answerJSON returns an answer body as indented JSON and a final newline.
// MessagePack is converted by codec.AppendJSON, the converter the server
// uses for its own JSON forms, so the command line prints exactly what
// `Accept: application/json` would; anything it does not take (a proxy's
// answer, say) is decoded generically. Numbers of the members named in
// keyMembers become strings.
func answerJSON(contentType string, raw []byte, keyMembers []string) ([]byte, error) {
	var js []byte
	switch {
	case len(raw) == 0:
		js = []byte("null")
	case strings.Contains(contentType, "json"):
		if !json.Valid(raw) {
			return nil, errors.New("invalid JSON")
		}
		js = raw
	default:
		var err error
		if js, err = codec.AppendJSON(nil, raw); err != nil {
			var v any
			if err := msgpack.Unmarshal(raw, &v); err != nil {
				return nil, err
			}
			if js, err = json.Marshal(jsonable(v)); err != nil {
				return nil, err
			}
		}
	}
	if len(keyMembers) > 0 {
		var err error
		if js, err = quoteMembers(js, keyMembers); err != nil {
			return nil, err
		}
	}
	var out bytes.Buffer
	if err := json.Indent(&out, js, "", "  "); err != nil {
		return nil, err
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}

// jsonable makes a generically decoded MessagePack value marshalable:
// maps with non-string keys get their keys printed.
func jsonable(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = jsonable(e)
		}
	case map[any]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[fmt.Sprint(k)] = jsonable(e)
		}
		return m
	case []any:
		for i, e := range x {
			x[i] = jsonable(e)
		}
	case []byte:
		return x // base64, as encoding/json writes bytes
	}
	return v
}

// quoteMembers rewrites one JSON value with every number that is the value
// of an object member named in names turned into a string of the same
// digits. Everything else, member order included, is kept.
func quoteMembers(js []byte, names []string) ([]byte, error) {
	type frame struct {
		object  bool
		n       int    // members or elements written so far
		keyNext bool   // in an object: the next string is a member name
		member  string // in an object: the name of the value being read
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	var (
		out   bytes.Buffer
		stack []frame
	)
	// value writes the separator an element or member value needs and
	// reports the member name it is the value of ("" in an array).
	value := func() string {
		if len(stack) == 0 {
			return ""
		}
		f := &stack[len(stack)-1]
		if f.object {
			f.keyNext = true
			return f.member
		}
		if f.n > 0 {
			out.WriteByte(',')
		}
		f.n++
		return ""
	}
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		if len(stack) > 0 {
			if f := &stack[len(stack)-1]; f.object && f.keyNext {
				if d, ok := tok.(json.Delim); !ok || d != '}' {
					name, _ := tok.(string)
					if f.n > 0 {
						out.WriteByte(',')
					}
					f.n++
					f.keyNext, f.member = false, name
					k, _ := json.Marshal(name)
					out.Write(k)
					out.WriteByte(':')
					continue
				}
			}
		}
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{', '[':
				value()
				out.WriteByte(byte(v))
				stack = append(stack, frame{object: v == '{', keyNext: v == '{'})
			default:
				out.WriteByte(byte(v))
				stack = stack[:len(stack)-1]
			}
		case json.Number:
			if m := value(); m != "" && slices.Contains(names, m) {
				out.WriteString(strconv.Quote(v.String()))
			} else {
				out.WriteString(v.String())
			}
		default:
			value()
			b, err := json.Marshal(v)
			if err != nil {
				return nil, err
			}
			out.Write(b)
		}
	}
	if len(stack) > 0 {
		return nil, io.ErrUnexpectedEOF
	}
	return out.Bytes(), nil
}
