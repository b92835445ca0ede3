package eventfixtures

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// readTree returns every file under dir except hand-written ones (*.md),
// by slash path relative to dir.
func readTree(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == "gen" {
				return filepath.SkipDir // the generator's own source
			}
			return nil
		}
		if strings.HasSuffix(path, ".md") {
			return nil
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		out[filepath.ToSlash(rel)] = b
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestCommittedFixturesAreGenerated runs the generator into a temporary
// directory and compares every file, byte for byte, with testdata/events:
// a hand edit to a fixture, or a generator change not followed by
// regenerating, fails here.
func TestCommittedFixturesAreGenerated(t *testing.T) {
	dir := t.TempDir()
	// A leftover payload from a removed fixture must not survive a run.
	if err := os.MkdirAll(filepath.Join(dir, "payloads"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "payloads", "gone.msgpack"), []byte{0xc0}, 0o644); err != nil {
		t.Fatal(err)
	}
	n, err := Write(dir)
	if err != nil {
		t.Fatal(err)
	}
	got := readTree(t, dir)
	if n != len(got) {
		t.Errorf("Write reported %d files, directory holds %d", n, len(got))
	}
	want := readTree(t, filepath.Join("..", "..", "..", "testdata", "events"))
	if len(want) < 100 {
		t.Fatalf("testdata/events holds only %d generated files; wrong directory?", len(want))
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("generated fixtures differ from testdata/events (-committed +generated); run go run ./testdata/events/gen and review:\n%s", diff)
	}
}

// TestEncoders pins the encoders' format choices on the edges the fixtures
// rely on, so a regression shows here and not only as a large file diff.
func TestEncoders(t *testing.T) {
	packs := []struct {
		v    any
		want []byte
	}{
		{nil, []byte{0xc0}},
		{127, []byte{0x7f}},
		{128, []byte{0xcc, 0x80}},
		{-32, []byte{0xe0}},
		{-33, []byte{0xd0, 0xdf}},
		{uint64(1) << 63, []byte{0xcf, 0x80, 0, 0, 0, 0, 0, 0, 0}},
		{int64(-1) << 40, []byte{0xd3, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0}},
		{pyNaN, []byte{0xcb, 0x7f, 0xf8, 0, 0, 0, 0, 0, 0}},
		{[]byte{1}, []byte{0xc4, 1, 1}},
		{strings.Repeat("a", 31), append([]byte{0xbf}, strings.Repeat("a", 31)...)},
		{strings.Repeat("a", 32), append([]byte{0xd9, 32}, strings.Repeat("a", 32)...)},
		{rawMap{{1, "x"}, {"k", nil}}, []byte{0x82, 0x01, 0xa1, 'x', 0xa1, 'k', 0xc0}},
		{m("b", 1, "a", 2), []byte{0x82, 0xa1, 'b', 0x01, 0xa1, 'a', 0x02}},
	}
	for _, c := range packs {
		if diff := cmp.Diff(c.want, packMsgpack(c.v)); diff != "" {
			t.Errorf("pack(%#v) (-want +got):\n%s", c.v, diff)
		}
	}
	got := string(marshalJSON(m("a", []any{}, "b", m(), "c", []any{1.5, 101.0, "é\"\x01"}, "d", jsonView(pyNaN))))
	want := "{\n \"a\": [],\n \"b\": {},\n \"c\": [\n  1.5,\n  101.0,\n  \"\\u00e9\\\"\\u0001\"\n ],\n \"d\": {\n  \"$float\": \"nan\"\n }\n}\n"
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("marshalJSON (-want +got):\n%s", diff)
	}
}
