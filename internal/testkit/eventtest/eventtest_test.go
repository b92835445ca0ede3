package eventtest

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/mooncake-conductor-go/conductor/index"
)

// testkit is where every package of test support lives.
const testkit = "github.com/mooncake-conductor-go/conductor/internal/testkit/"

// TestImportedOnlyByTests: product code never links test support in: no
// file outside internal/testkit imports a package of it but a test file
// (testdata's generators are not product code and are not walked).
func TestImportedOnlyByTests(t *testing.T) {
	root := filepath.Dir(filepath.Dir(FixtureDir(t)))
	users := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasPrefix(path, filepath.Join(root, "internal", "testkit")+string(filepath.Separator)) {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); strings.HasPrefix(p, testkit) {
				users++
				if !strings.HasSuffix(path, "_test.go") {
					t.Errorf("%s imports %s outside a test file", path, p)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if users == 0 {
		t.Errorf("found no importer at all; the walk is looking in the wrong place (%s)", root)
	}
}

func TestExpectedOps(t *testing.T) {
	prior := []Op{
		{Kind: "acquire", Tier: index.CPUShare, Key: 5},
		{Kind: "acquire", Tier: index.CPUShare, Key: 5},
		{Kind: "acquire", Tier: index.Disk, Key: 6},
		{Kind: "release", Tier: index.Disk, Key: 6},
	}
	f := &Fixture{ID: "x", Expect: Expect{Effects: []Effect{
		{Op: "store", Tier: "device", Owner: "engine", Prefixes: []string{"18446744073709551615", "1"}},
		{Op: "remove", Tier: "cpu_share", Owner: "shared backend=b (t) object=o", Prefixes: []string{"2"}},
		{Op: "clear", Tiers: []string{"device", "disk"}},
		{Op: "clear_shared"},
	}}}
	want := []Op{
		{Kind: "store", Owner: Owner, Tier: index.Device, Key: 1<<64 - 1},
		{Kind: "store", Owner: Owner, Tier: index.Device, Key: 1},
		{Kind: "release", Tier: index.CPUShare, Key: 2},
		{Kind: "clear", Owner: Owner, Mask: 1<<index.Device | 1<<index.Disk},
		{Kind: "release", Tier: index.CPUShare, Key: 5},
		{Kind: "release", Tier: index.CPUShare, Key: 5},
	}
	if diff := cmp.Diff(want, ExpectedOps(t, f, prior)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestResultName(t *testing.T) {
	for in, want := range map[string]string{
		"applied": "applied", "ignored: unknown medium": "ignored",
		"rejected: bad hash": "rejected", "no-op (already stored)": "no-op",
	} {
		if got := ResultName(t, in); got != want {
			t.Errorf("ResultName(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestManifestLoads: the shared loader finds the fixtures from a package
// two levels below the module root, and every fixture resolves.
func TestManifestLoads(t *testing.T) {
	m := LoadManifest(t)
	if len(m.Fixtures) < 90 {
		t.Fatalf("%d fixtures", len(m.Fixtures))
	}
	for _, f := range m.Fixtures {
		if _, ok := m.Registrations[f.Registration]; !ok {
			t.Errorf("%s: no registration %q", f.ID, f.Registration)
		}
		if f.PayloadFile != "" {
			Payload(t, m.Fixture(t, f.ID)) // fails the test if unreadable
		}
	}
}
