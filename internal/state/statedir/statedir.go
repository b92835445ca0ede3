// Package statedir owns the directory where the service keeps what must
// survive a restart: the registration record and the index snapshot. It
// makes the directory exclusive to one process (an flock on a lock file
// that names its holder), moves old contents aside on request instead of
// deleting them, and writes files so that a crash at any point leaves
// either the previous or the new version, never a torn one.
package statedir

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// LockName is the lock file inside the directory. It holds the pid of the
// process that owns the directory, so a refused second process can say who
// holds it.
const LockName = "LOCK"

// resetPrefix names the subdirectories --state-reset moves old contents
// into; they are never moved again by a later reset.
const resetPrefix = "reset-"

// Dir is an open, exclusively locked state directory. The lock lasts until
// Close or the process's end (the kernel drops an flock with its last
// descriptor, so a crashed holder never leaves the directory locked).
type Dir struct {
	path string
	lock *os.File
	now  func() time.Time
}

// LockedError is returned by Open when another process holds the directory.
type LockedError struct {
	Path string
	// PID is the holder's pid as its lock file records it (0 when the file
	// could not be read, e.g. the holder has not written it yet).
	PID int
}

func (e *LockedError) Error() string {
	if e.PID > 0 {
		return fmt.Sprintf("state directory %s is in use by another conductor (pid %d); stop it or choose another --state-dir", e.Path, e.PID)
	}
	return fmt.Sprintf("state directory %s is in use by another conductor (pid unknown); stop it or choose another --state-dir", e.Path)
}

// Options tune Open.
type Options struct {
	// Reset moves everything the directory holds into a fresh
	// reset-<timestamp> subdirectory before it is used (--state-reset).
	Reset bool
	// Now stamps reset and corrupt-file names; time.Now when nil.
	Now func() time.Time
}

// Open creates path (mode 0700, parents included) when missing, takes its
// lock and, with Options.Reset, moves its old contents aside. The caller
// must Close the Dir.
func Open(path string, opts Options) (*Dir, error) {
	if path == "" {
		return nil, errors.New("state directory path is empty")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("state directory %s: %w", path, err)
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return nil, fmt.Errorf("create state directory %s: %w", abs, err)
	}
	f, err := os.OpenFile(filepath.Join(abs, LockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock file of state directory %s: %w", abs, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, &LockedError{Path: abs, PID: readPID(filepath.Join(abs, LockName))}
		}
		return nil, fmt.Errorf("lock state directory %s: %w", abs, err)
	}
	d := &Dir{path: abs, lock: f, now: opts.Now}
	if d.now == nil {
		d.now = time.Now
	}
	if err := d.writePID(); err != nil {
		d.Close()
		return nil, err
	}
	if err := d.removeTemporaries(); err != nil {
		d.Close()
		return nil, err
	}
	if opts.Reset {
		if err := d.reset(); err != nil {
			d.Close()
			return nil, err
		}
	}
	return d, nil
}

// removeTemporaries deletes what a crash in the middle of WriteAtomic left
// behind: temporary files that were never renamed into place, hence never
// part of the state.
func (d *Dir) removeTemporaries() error {
	entries, err := os.ReadDir(d.path)
	if err != nil {
		return fmt.Errorf("read state directory %s: %w", d.path, err)
	}
	for _, e := range entries {
		if n := e.Name(); strings.HasPrefix(n, ".") && strings.Contains(n, tmpMarker) && e.Type().IsRegular() {
			if err := os.Remove(filepath.Join(d.path, n)); err != nil {
				return fmt.Errorf("remove unfinished %s: %w", filepath.Join(d.path, n), err)
			}
		}
	}
	return nil
}

// tmpMarker is in the name of every temporary file WriteAtomic creates.
const tmpMarker = ".tmp-"

// readPID reads the holder's pid from a lock file, 0 when unreadable.
func readPID(name string) int {
	b, err := os.ReadFile(name)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}

// writePID records this process as the holder. It writes through the
// locked descriptor: the file is never replaced, since a new inode would
// not carry the lock.
func (d *Dir) writePID() error {
	if err := d.lock.Truncate(0); err != nil {
		return fmt.Errorf("write lock file of %s: %w", d.path, err)
	}
	if _, err := d.lock.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0); err != nil {
		return fmt.Errorf("write lock file of %s: %w", d.path, err)
	}
	return nil
}

// stamp is the timestamp used in names of files moved aside: sortable, no
// characters that need quoting.
func (d *Dir) stamp() string { return d.now().UTC().Format("20060102T150405.000000000Z") }

// reset moves every entry but the lock file and earlier reset directories
// into reset-<timestamp>.
func (d *Dir) reset() error {
	entries, err := os.ReadDir(d.path)
	if err != nil {
		return fmt.Errorf("reset state directory %s: %w", d.path, err)
	}
	var move []string
	for _, e := range entries {
		if n := e.Name(); n != LockName && !strings.HasPrefix(n, resetPrefix) {
			move = append(move, n)
		}
	}
	if len(move) == 0 {
		return nil
	}
	aside := filepath.Join(d.path, resetPrefix+d.stamp())
	if err := os.Mkdir(aside, 0o700); err != nil {
		return fmt.Errorf("reset state directory %s: %w", d.path, err)
	}
	for _, n := range move {
		if err := os.Rename(filepath.Join(d.path, n), filepath.Join(aside, n)); err != nil {
			return fmt.Errorf("reset state directory %s: move %s aside: %w", d.path, n, err)
		}
	}
	if err := syncDir(d.path); err != nil {
		return fmt.Errorf("reset state directory %s: %w", d.path, err)
	}
	return nil
}

// Path is the directory's absolute path.
func (d *Dir) Path() string { return d.path }

// File is the path of a file in the directory.
func (d *Dir) File(name string) string { return filepath.Join(d.path, name) }

// Close releases the lock. The lock file stays, with the last holder's pid.
func (d *Dir) Close() error {
	if d == nil || d.lock == nil {
		return nil
	}
	err := d.lock.Close() // closing the last descriptor drops the flock
	d.lock = nil
	return err
}

// MoveAside renames a bad file to <name>.corrupt-<timestamp>, so it can be
// examined later and is not read again. It returns the new path.
func (d *Dir) MoveAside(name string) (string, error) {
	to := name + ".corrupt-" + d.stamp()
	if err := os.Rename(d.File(name), d.File(to)); err != nil {
		return "", fmt.Errorf("move %s aside: %w", d.File(name), err)
	}
	if err := syncDir(d.path); err != nil {
		return "", fmt.Errorf("move %s aside: %w", d.File(name), err)
	}
	return d.File(to), nil
}

// WriteAtomic replaces name with what write produces: it writes a
// temporary file in the same directory, fsyncs it, renames it over name and
// fsyncs the directory, so after a crash name is either the old or the new
// content. On any failure the temporary file is removed and name is left as
// it was. It returns the bytes written.
func (d *Dir) WriteAtomic(name string, write func(w io.Writer) error) (int64, error) {
	return writeAtomic(d.path, name, write)
}

func writeAtomic(dir, name string, write func(w io.Writer) error) (n int64, err error) {
	f, err := os.CreateTemp(dir, "."+name+tmpMarker+"*")
	if err != nil {
		return 0, fmt.Errorf("write %s: %w", filepath.Join(dir, name), err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
			err = fmt.Errorf("write %s: %w", filepath.Join(dir, name), err)
		}
	}()
	cw := &countingWriter{w: f}
	if err = write(cw); err != nil {
		return 0, err
	}
	if err = f.Sync(); err != nil {
		return 0, err
	}
	if err = f.Close(); err != nil {
		return 0, err
	}
	if err = os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		return 0, err
	}
	if err = syncDir(dir); err != nil {
		return 0, err
	}
	return cw.n, nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// syncDir makes a rename or creation in dir durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}

// Failure reasons of writes, the values of a failures-by-reason metric.
const (
	ReasonNoSpace    = "no_space"
	ReasonPermission = "permission"
	ReasonMissingDir = "missing_dir"
	ReasonIO         = "io"
)

// FailureReason classifies a write error for metrics: a full disk, a
// permission problem (including a read-only file system), the directory
// gone from underneath, or anything else.
func FailureReason(err error) string {
	switch {
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return ReasonNoSpace
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.EROFS):
		return ReasonPermission
	case errors.Is(err, fs.ErrNotExist):
		return ReasonMissingDir
	}
	return ReasonIO
}
