package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/mooncake-conductor-go/conductor/internal/apicmd"
	"github.com/mooncake-conductor-go/conductor/internal/config"
	"github.com/mooncake-conductor-go/conductor/internal/hashing/hashcmd"
)

// The command line is verbs: serve (the default, so `conductor --port
// 13333` runs the service as it always has), hash, the API verbs of
// package apicmd, and help. --help and `conductor help` list every verb
// with one line each; `conductor help <verb>` and `conductor <verb>
// --help` print the verb's own usage (docs/api.md#from-a-shell-the-conductor-command-line).

// verb is one word of the command line and its one-line description.
type verb struct{ name, summary string }

const (
	serveSummary = "runs the service: subscribes to the registered publishers and answers routers (the default verb; its flags are below)"
	helpSummary  = "prints this text, or one verb's usage: conductor help <verb>"
)

// verbs lists every verb in the order the usage text shows them: serve,
// hash, the API verbs (sorted), help.
func verbs() []verb {
	vs := []verb{{"serve", serveSummary}, {"hash", hashcmd.Summary}}
	for _, n := range apicmd.Names() {
		vs = append(vs, verb{n, apicmd.Summary(n)})
	}
	return append(vs, verb{"help", helpSummary})
}

func verbNames() []string {
	var names []string
	for _, v := range verbs() {
		names = append(names, v.name)
	}
	return names
}

// usage is the --help text: the synopsis, every verb, then serve's flags.
func usage() string {
	var b strings.Builder
	b.WriteString("Usage: conductor [serve] [flags]     run the service\n" +
		"       conductor <verb> [flags]      run another verb\n" +
		"       conductor help [verb]         this text, or a verb's usage\n\nVerbs:\n")
	width := 0
	for _, v := range verbs() {
		width = max(width, len(v.name))
	}
	for _, v := range verbs() {
		fmt.Fprintf(&b, "  %-*s  %s\n", width, v.name, v.summary)
	}
	b.WriteString("\nThe API verbs call a running conductor with a JSON request (docs/api.md).\n" +
		"Run conductor help <verb> (or conductor <verb> --help) for a verb's flags.\n\n")
	b.WriteString(config.Usage())
	return b.String()
}

// runVerb runs the verb args name, if it is one other than serve, and
// returns its exit code with done set. For serve, named or not (args
// empty or starting with a flag), done is false and serveArgs are the
// service's flags.
func runVerb(args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) (serveArgs []string, code int, done bool) {
	if len(args) == 0 || args[0] == "" || strings.HasPrefix(args[0], "-") {
		return args, 0, false
	}
	switch name, rest := args[0], args[1:]; {
	case name == "serve":
		return rest, 0, false
	case name == "hash":
		return nil, hashcmd.Run(rest, stdin, stdout, stderr), true
	case apicmd.Is(name):
		return nil, apicmd.Run(name, rest, getenv, stdin, stdout, stderr), true
	case name == "help":
		return nil, help(rest, getenv, stdout, stderr), true
	default:
		// A word where the service takes only flags is a mistyped verb:
		// a usage error, exit 2, as the verbs' own are.
		fmt.Fprintf(stderr, "conductor: unknown verb %q (verbs: %s; see conductor help)\n", name, strings.Join(verbNames(), ", "))
		return nil, 2, true
	}
}

// help answers `conductor help [verb]`: the usage text, or the verb's own
// usage, on stdout (asked for, it is the answer, not a diagnostic).
func help(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	switch {
	case len(args) == 0 || (len(args) == 1 && (args[0] == "serve" || args[0] == "help")):
		fmt.Fprint(stdout, usage())
		return 0
	case len(args) > 1:
		fmt.Fprintf(stderr, "conductor help: one verb at most, got %q\n", args)
		return 2
	case args[0] == "hash":
		return hashcmd.Run([]string{"--help"}, strings.NewReader(""), stdout, stdout)
	case apicmd.Is(args[0]):
		return apicmd.Run(args[0], []string{"--help"}, getenv, strings.NewReader(""), stdout, stdout)
	}
	fmt.Fprintf(stderr, "conductor help: unknown verb %q (verbs: %s)\n", args[0], strings.Join(verbNames(), ", "))
	return 2
}
