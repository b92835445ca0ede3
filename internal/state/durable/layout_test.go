package durable

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestStagesDoNotCallUp: the durable state and the decoders are stages the
// subscriber calls; neither, nor the values they share with it
// (internal/streampos), imports the subscriber.
func TestStagesDoNotCallUp(t *testing.T) {
	root := filepath.Join("..", "..", "..")
	files := 0
	for _, dir := range []string{
		filepath.Join(root, "internal", "state", "durable"), filepath.Join(root, "internal", "streampos"),
		filepath.Join(root, "internal", "events"),
	} {
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
				if p, _ := strconv.Unquote(imp.Path.Value); strings.HasSuffix(p, "/conductor/subscriber") {
					t.Errorf("%s imports %s", path, p)
				}
			}
		}
	}
	if files < 20 {
		t.Fatalf("read %d files; the test looks in the wrong place", files)
	}
}
