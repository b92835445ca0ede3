package main

import (
	"go/ast"
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
			// The token memo lives at the doors, behind one wrapper
			// (tokenmemo.Door): the codec decodes (its TokenHook takes ids
			// it is told are known) and the engine answers; neither
			// consults, teaches or holds it (issue 42, docs/architecture.md).
			name: "the token memo stays at the doors", dirs: []string{"codec", "internal/query"},
			withTests: true, minFiles: 10,
			forbidden: func(p string) bool { return strings.HasSuffix(p, "/internal/tokenmemo") },
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
		{
			// The registration record's schema (internal/registration) and
			// the strict field reading under it (internal/reqfields) sit
			// below both the HTTP codec and the state that stores records:
			// neither they nor the state reads records through the codec.
			name:      "state reads its records without the HTTP codec",
			dirs:      []string{"internal/state/regstore", "internal/state/durable", "internal/state/snapshot", "internal/state/statedir", "internal/registration", "internal/reqfields"},
			withTests: true, minFiles: 10,
			forbidden: func(p string) bool {
				return strings.HasSuffix(p, "/conductor/codec") || strings.HasSuffix(p, "/conductor/server")
			},
		},
		{
			// The subscribers hand their counters and states to the metrics
			// as plain values the metrics own (Options.Ingest,
			// SourceStates); the app adapts them.
			name: "metrics know no subscriber", dirs: []string{"internal/metrics"},
			withTests: true, minFiles: 4,
			forbidden: func(p string) bool { return strings.HasSuffix(p, "/conductor/subscriber") },
		},
		{
			// The registry decides registrations; the doors, the sources,
			// the state and the metrics sit above it.
			name: "registry calls nothing above it", dirs: []string{"registry"},
			withTests: true, minFiles: 8,
			forbidden: func(p string) bool {
				for _, up := range []string{"/conductor/codec", "/conductor/server", "/conductor/subscriber", "/internal/state/", "/internal/metrics", "/internal/etcdreg", "/internal/inferencecache/"} {
					if strings.HasSuffix(p, up) || strings.Contains(p, up) {
						return true
					}
				}
				return false
			},
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

// TestRegistryAPIInItsOwnTerms: the registry hands a source factory only
// what it decides (the service and its engine owner); a source's table,
// and the contexts a Mooncake stream may bind to, are the catalogue's
// (docs/architecture.md). No exported declaration of registry/ may name
// the machinery it used to pass through: a context's catalogue entry or
// an index table.
func TestRegistryAPIInItsOwnTerms(t *testing.T) {
	forbidden := map[string]bool{"contexts.Entry": true, "index.Table": true}
	paths, err := filepath.Glob(filepath.Join("registry", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	decls := 0
	for _, path := range paths {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		check := func(what string, n ast.Node) {
			decls++
			ast.Inspect(n, func(n ast.Node) bool {
				if sel, ok := n.(*ast.SelectorExpr); ok {
					if x, ok := sel.X.(*ast.Ident); ok && forbidden[x.Name+"."+sel.Sel.Name] {
						t.Errorf("%s: %s names %s.%s", path, what, x.Name, sel.Sel.Name)
					}
				}
				return true
			})
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Name.IsExported() && (d.Recv == nil || exportedRecv(d.Recv)) {
					check(d.Name.Name, d.Type)
				}
			case *ast.GenDecl:
				for _, sp := range d.Specs {
					ts, ok := sp.(*ast.TypeSpec)
					if !ok || !ts.Name.IsExported() {
						continue
					}
					if st, ok := ts.Type.(*ast.StructType); ok {
						// Unexported fields are the registry's own.
						for _, fld := range st.Fields.List {
							for _, n := range fld.Names {
								if n.IsExported() {
									check(ts.Name.Name+"."+n.Name, fld.Type)
								}
							}
							if len(fld.Names) == 0 {
								check(ts.Name.Name+" (embedded)", fld.Type)
							}
						}
						continue
					}
					check(ts.Name.Name, ts.Type)
				}
			}
		}
	}
	if decls < 20 {
		t.Fatalf("checked %d exported declarations; the test looks in the wrong place", decls)
	}
}

// exportedRecv reports whether a method's receiver type is exported.
func exportedRecv(recv *ast.FieldList) bool {
	if recv == nil || len(recv.List) == 0 {
		return false
	}
	t := recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	id, ok := t.(*ast.Ident)
	return ok && id.IsExported()
}
