package main

import (
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// dirListing is a directory's files with their sizes and modification
// times, to tell whether anything was written.
func dirListing(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		out[p] = fmt.Sprintf("%s %d bytes, modified %d", info.Mode(), info.Size(), info.ModTime().UnixNano())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A second process that is refused, by the state directory's lock or by
// the HTTP port, leaves every state directory exactly as it found it: no
// snapshot, no record, not even a new directory.
func TestRefusedStartWritesNothing(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	p := startConductor(t, dir)
	before := dirListing(t, dir)

	if _, err := tryStart(t, dir); err == nil {
		t.Fatal("a second conductor started on the same state directory")
	}
	if diff := cmp.Diff(before, dirListing(t, dir)); diff != "" {
		t.Errorf("the process refused by the lock changed the directory (-before +after):\n%s", diff)
	}

	u, err := url.Parse(p.base)
	if err != nil {
		t.Fatal(err)
	}
	fresh := filepath.Join(t.TempDir(), "fresh")
	_, err = tryStart(t, fresh, "--port", u.Port())
	if err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("a second conductor on a port in use: %v", err)
	}
	if _, err := os.Stat(fresh); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the process refused the port created its state directory: %v", err)
	}
	p.stop()
}
