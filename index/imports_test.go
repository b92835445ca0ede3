package index

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestIndexImportsNothingInternal: index is a top-level package, so its
// surface may name no internal type; it keeps which owners hold which keys
// and nothing about how keys are computed (a context's hash profile lives
// in internal/contexts, beside its table). It imports only the standard
// library.
func TestIndexImportsNothingInternal(t *testing.T) {
	paths, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	files := 0
	for _, path := range paths {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		files++
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if first, _, _ := strings.Cut(p, "/"); strings.Contains(first, ".") {
				t.Errorf("%s imports %s", path, p)
			}
		}
	}
	if files < 10 {
		t.Fatalf("read %d files; the test looks in the wrong place", files)
	}
}
