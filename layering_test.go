package main

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestLayering keeps data flowing one way (docs/architecture.md): each rule
// names packages by directory and the imports they may not have, read from
// their files' import clauses.
func TestLayering(t *testing.T) {
	for _, rule := range []struct {
		name string
		// dirs are the packages the rule covers; withTests reads their
		// _test.go files too.
		dirs      []string
		withTests bool
		// minFiles guards against a rule that reads nothing (a moved
		// package) and so cannot fail.
		minFiles  int
		forbidden func(path string) bool
	}{
		{
			// index is a top-level package, so its surface may name no
			// internal type; it keeps which owners hold which keys and
			// nothing about how keys are computed (a context's hash
			// profile lives in internal/contexts, beside its table). It
			// imports only the standard library.
			name: "index imports only the standard library", dirs: []string{"index"}, minFiles: 10,
			forbidden: func(p string) bool { first, _, _ := strings.Cut(p, "/"); return strings.Contains(first, ".") },
		},
		{
			// The engine takes decoded requests; decoding /query bodies
			// (codec) and reading MessagePack (msgp) belong to the doors,
			// and registration rules (registry) sit above it.
			name: "query knows no wire format", dirs: []string{"internal/query"}, minFiles: 2,
			forbidden: func(p string) bool {
				return strings.HasSuffix(p, "/codec") || strings.HasSuffix(p, "/internal/msgp") || strings.Contains(p, "/inferencecache/") ||
					strings.HasSuffix(p, "/registry") || strings.HasSuffix(p, "/server")
			},
		},
		{
			// The durable state and the decoders are stages the subscriber
			// calls; neither, nor the values they share with it
			// (internal/streampos), imports the subscriber.
			name: "stages do not call up", dirs: []string{"internal/state/durable", "internal/streampos", "internal/events"},
			withTests: true, minFiles: 20,
			forbidden: func(p string) bool { return strings.HasSuffix(p, "/conductor/subscriber") },
		},
		{
			// The decoders and the subscriber hand their durable parts over
			// as the decoders' types (events.Binding); the snapshot file
			// format, and durable state in general, stay out of ingest.
			name: "ingest knows no state format", dirs: []string{"internal/events", "subscriber"},
			withTests: true, minFiles: 10,
			forbidden: func(p string) bool { return strings.Contains(p, "/internal/state/") },
		},
	} {
		t.Run(rule.name, func(t *testing.T) {
			files := 0
			for _, dir := range rule.dirs {
				paths, err := filepath.Glob(filepath.Join(filepath.FromSlash(dir), "*.go"))
				if err != nil {
					t.Fatal(err)
				}
				for _, path := range paths {
					if !rule.withTests && strings.HasSuffix(path, "_test.go") {
						continue
					}
					f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
					if err != nil {
						t.Fatal(err)
					}
					files++
					for _, imp := range f.Imports {
						if p, _ := strconv.Unquote(imp.Path.Value); rule.forbidden(p) {
							t.Errorf("%s imports %s", path, p)
						}
					}
				}
			}
			if files < rule.minFiles {
				t.Fatalf("read %d files; the rule looks in the wrong place", files)
			}
		})
	}
}
