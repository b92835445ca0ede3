package query

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestQueryKnowsNoWireFormat: the engine takes decoded requests; decoding
// /query bodies (codec) and reading MessagePack (msgp) belong to the doors,
// and registration rules (registry) sit above it: data flows from the
// doors through query to index, never back up.
func TestQueryKnowsNoWireFormat(t *testing.T) {
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
			if strings.HasSuffix(p, "/codec") || strings.HasSuffix(p, "/internal/msgp") || strings.Contains(p, "/inferencecache/") ||
				strings.HasSuffix(p, "/registry") || strings.HasSuffix(p, "/server") {
				t.Errorf("%s imports %s", path, p)
			}
		}
	}
	if files < 2 {
		t.Fatalf("read %d files; the test looks in the wrong place", files)
	}
}
