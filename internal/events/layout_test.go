package events

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestIngestKnowsNoStateFormat: the decoders and the subscriber hand their
// durable parts over as this package's types (Binding); the snapshot file
// format, and durable state in general, stay out of the ingest path.
func TestIngestKnowsNoStateFormat(t *testing.T) {
	root := filepath.Join("..", "..")
	files := 0
	for _, dir := range []string{filepath.Join(root, "internal", "events"), filepath.Join(root, "subscriber")} {
		paths, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, path := range paths {
			f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			files++
			for _, imp := range f.Imports {
				if p, _ := strconv.Unquote(imp.Path.Value); strings.Contains(p, "/internal/state/") {
					t.Errorf("%s imports %s", path, p)
				}
			}
		}
	}
	if files < 10 {
		t.Fatalf("read %d files; the test looks in the wrong place", files)
	}
}
