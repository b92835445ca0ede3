package statedir

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// holderEnv makes the test binary, re-executed, hold a directory's lock
// until its stdin closes: a real second process for the exclusion tests.
const holderEnv = "STATEDIR_TEST_HOLD"

func TestMain(m *testing.M) {
	if dir := os.Getenv(holderEnv); dir != "" {
		d, err := Open(dir, Options{})
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(2)
		}
		fmt.Println("locked")
		io.Copy(io.Discard, os.Stdin)
		d.Close()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// startHolder runs a second process that locks dir and waits.
func startHolder(t *testing.T, dir string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), holderEnv+"="+dir)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "locked\n" {
		t.Fatalf("holder process: %q, %v", line, err)
	}
	return cmd
}

func listDir(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return out
}

func TestOpenCreatesPrivateDirectory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a", "b", "state")
	d, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Mode().Perm(); got != 0o700 {
		t.Errorf("mode %o, want 700", got)
	}
	if d.Path() != path {
		t.Errorf("Path() = %q, want %q", d.Path(), path)
	}
	b, err := os.ReadFile(filepath.Join(path, LockName))
	if err != nil {
		t.Fatal(err)
	}
	if want := strconv.Itoa(os.Getpid()) + "\n"; string(b) != want {
		t.Errorf("lock file holds %q, want %q", b, want)
	}
}

func TestOpenRejectsEmptyPath(t *testing.T) {
	if _, err := Open("", Options{}); err == nil {
		t.Fatal("Open(\"\") succeeded")
	}
}

// A second open file description in the same process conflicts like a
// second process would: flock locks belong to the open file description.
func TestSecondOpenInProcessIsRefused(t *testing.T) {
	dir := t.TempDir()
	d, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = Open(dir, Options{})
	var le *LockedError
	if !errors.As(err, &le) {
		t.Fatalf("second Open: %v, want a LockedError", err)
	}
	if le.PID != os.Getpid() || le.Path != dir {
		t.Errorf("LockedError %+v, want pid %d and path %s", le, os.Getpid(), dir)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	d2, err := Open(dir, Options{})
	if err != nil {
		t.Fatalf("Open after Close: %v", err)
	}
	d2.Close()
}

func TestSecondProcessIsRefusedWithHolderPID(t *testing.T) {
	dir := t.TempDir()
	holder := startHolder(t, dir)
	_, err := Open(dir, Options{})
	var le *LockedError
	if !errors.As(err, &le) {
		t.Fatalf("Open while another process holds the lock: %v", err)
	}
	if le.PID != holder.Process.Pid {
		t.Errorf("holder pid %d, want %d", le.PID, holder.Process.Pid)
	}
	msg := err.Error()
	for _, want := range []string{dir, strconv.Itoa(holder.Process.Pid)} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q does not name %q", msg, want)
		}
	}

	// A holder that dies without unlocking (SIGKILL) leaves the directory
	// free: the kernel drops the lock with its last descriptor.
	if err := holder.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	holder.Wait()
	d, err := Open(dir, Options{})
	if err != nil {
		t.Fatalf("Open after the holder was killed: %v", err)
	}
	d.Close()
}

func fixedNow(ts string) func() time.Time {
	return func() time.Time {
		t, err := time.Parse(time.RFC3339, ts)
		if err != nil {
			panic(err)
		}
		return t
	}
}

func TestResetMovesContentsAside(t *testing.T) {
	dir := t.TempDir()
	d, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"registrations", "snapshot"} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(n), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	d.Close()

	d, err = Open(dir, Options{Reset: true, Now: fixedNow("2026-01-02T03:04:05Z")})
	if err != nil {
		t.Fatal(err)
	}
	aside := "reset-20260102T030405.000000000Z"
	if diff := cmp.Diff([]string{LockName, aside}, listDir(t, dir)); diff != "" {
		t.Errorf("directory after reset (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"registrations", "snapshot"}, listDir(t, filepath.Join(dir, aside))); diff != "" {
		t.Errorf("moved aside (-want +got):\n%s", diff)
	}
	b, err := os.ReadFile(filepath.Join(dir, aside, "snapshot"))
	if err != nil || string(b) != "snapshot" {
		t.Errorf("moved file content %q, %v", b, err)
	}
	// A second reset leaves the first one's directory alone and, with
	// nothing else to move, creates none.
	if err := os.WriteFile(filepath.Join(dir, "snapshot"), []byte("new"), 0o600); err != nil {
		t.Fatal(err)
	}
	d.Close()
	d, err = Open(dir, Options{Reset: true, Now: fixedNow("2026-01-02T03:04:06Z")})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	aside2 := "reset-20260102T030406.000000000Z"
	if diff := cmp.Diff([]string{LockName, aside, aside2}, listDir(t, dir)); diff != "" {
		t.Errorf("directory after second reset (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"snapshot"}, listDir(t, filepath.Join(dir, aside2))); diff != "" {
		t.Errorf("second reset moved (-want +got):\n%s", diff)
	}
}

func TestResetRefusedWhileLocked(t *testing.T) {
	dir := t.TempDir()
	startHolder(t, dir)
	if err := os.WriteFile(filepath.Join(dir, "snapshot"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	var le *LockedError
	if _, err := Open(dir, Options{Reset: true}); !errors.As(err, &le) {
		t.Fatalf("reset while locked: %v", err)
	}
	if diff := cmp.Diff([]string{LockName, "snapshot"}, listDir(t, dir)); diff != "" {
		t.Errorf("a refused reset changed the directory (-want +got):\n%s", diff)
	}
}

func TestWriteAtomic(t *testing.T) {
	dir := t.TempDir()
	d, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	n, err := d.WriteAtomic("f", func(w io.Writer) error { _, err := io.WriteString(w, "first"); return err })
	if err != nil || n != 5 {
		t.Fatalf("WriteAtomic: %d, %v", n, err)
	}
	// A failing writer leaves the previous content and no temporary file.
	boom := errors.New("boom")
	_, err = d.WriteAtomic("f", func(w io.Writer) error {
		io.WriteString(w, "partial")
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("failed write: %v", err)
	}
	if b, _ := os.ReadFile(d.File("f")); string(b) != "first" {
		t.Errorf("content after failed write %q, want first", b)
	}
	if diff := cmp.Diff([]string{LockName, "f"}, listDir(t, dir)); diff != "" {
		t.Errorf("leftovers (-want +got):\n%s", diff)
	}
	if _, err := d.WriteAtomic("f", func(w io.Writer) error { _, err := io.WriteString(w, "second"); return err }); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(d.File("f")); string(b) != "second" {
		t.Errorf("content %q, want second", b)
	}
}

func TestWriteAtomicIntoRemovedDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	d, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	_, err = d.WriteAtomic("f", func(w io.Writer) error { return nil })
	if err == nil {
		t.Fatal("write into a removed directory succeeded")
	}
	if got := FailureReason(err); got != ReasonMissingDir {
		t.Errorf("reason %q, want %q (%v)", got, ReasonMissingDir, err)
	}
}

func TestMoveAside(t *testing.T) {
	dir := t.TempDir()
	d, err := Open(dir, Options{Now: fixedNow("2026-01-02T03:04:05Z")})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := os.WriteFile(d.File("snapshot"), []byte("bad"), 0o600); err != nil {
		t.Fatal(err)
	}
	to, err := d.MoveAside("snapshot")
	if err != nil {
		t.Fatal(err)
	}
	want := d.File("snapshot.corrupt-20260102T030405.000000000Z")
	if to != want {
		t.Errorf("moved to %s, want %s", to, want)
	}
	if diff := cmp.Diff([]string{LockName, filepath.Base(want)}, listDir(t, dir)); diff != "" {
		t.Errorf("directory (-want +got):\n%s", diff)
	}
}

func TestFailureReason(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("write: %w", syscall.ENOSPC), ReasonNoSpace},
		{&os.PathError{Op: "write", Path: "x", Err: syscall.EDQUOT}, ReasonNoSpace},
		{&os.PathError{Op: "open", Path: "x", Err: syscall.EACCES}, ReasonPermission},
		{&os.PathError{Op: "open", Path: "x", Err: syscall.EROFS}, ReasonPermission},
		{&os.PathError{Op: "open", Path: "x", Err: syscall.ENOENT}, ReasonMissingDir},
		{errors.New("other"), ReasonIO},
		{&os.PathError{Op: "write", Path: "x", Err: syscall.EIO}, ReasonIO},
	} {
		if got := FailureReason(tc.err); got != tc.want {
			t.Errorf("FailureReason(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

// A temporary file a crash left behind mid-write is removed at the next
// Open; the files it was to replace are untouched.
func TestOpenRemovesUnfinishedTemporaries(t *testing.T) {
	dir := t.TempDir()
	for n, content := range map[string]string{".index.snapshot.tmp-123": "half", "index.snapshot": "whole", ".hidden": "x"} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	d, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if diff := cmp.Diff([]string{".hidden", LockName, "index.snapshot"}, listDir(t, dir)); diff != "" {
		t.Errorf("directory (-want +got):\n%s", diff)
	}
}
