// Package regstore records the set of registrations in the state directory
// so a restarted service knows its publishers again: routers register them
// once, at their own start, and would not do it again for us.
//
// The record is one file, replaced atomically (write, fsync, rename, fsync
// the directory) with the whole set on every change, so it is either the set
// before a change or the set after it. Registration changes are rare and the
// set is bounded (4,096 services of a few hundred bytes), so rewriting it is
// cheaper to get right than a log, and there is nothing to compact.
//
// Each registration is kept as the MessagePack body of the /register request
// that would recreate it (internal/registration.Encode), and read back
// through the same schema and rules /register uses
// (registration.DecodeService), so a record can never hold a registration
// the API would refuse.
package regstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sort"

	"github.com/cespare/xxhash/v2"

	"github.com/mooncake-conductor-go/conductor/internal/registration"
	"github.com/mooncake-conductor-go/conductor/internal/state/statedir"
	"github.com/mooncake-conductor-go/conductor/registry"
)

// FileName is the record's name inside the state directory.
const FileName = "registrations"

// Version is the record format this release writes; Load accepts it and
// every earlier one it knows.
const Version = 1

// magic opens every record file.
var magic = [8]byte{'C', 'N', 'D', 'R', 'E', 'G', 0, 0}

// headerLen is magic, version (u32) and count (u32).
const headerLen = 16

// CorruptError is a record that exists but cannot be read back: start-up
// stops on it, since silently forgetting services is worse than not
// starting, unless the operator resets the state directory.
type CorruptError struct {
	Path   string
	Reason string
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("registration record %s is unreadable (%s); fix or remove it, or start with --state-reset to move the state aside", e.Path, e.Reason)
}

// Store reads and replaces the record in one state directory. Save is
// called with the registry's lock held, so calls never overlap.
type Store struct {
	dir *statedir.Dir
	// write, when set, wraps the file writer (tests inject failures).
	write func(io.Writer) io.Writer
}

// New returns a store over an open state directory.
func New(dir *statedir.Dir) *Store { return &Store{dir: dir} }

// Path is the record's path.
func (s *Store) Path() string { return s.dir.File(FileName) }

// Save durably replaces the record with svcs (in any order; it is written
// sorted by service key). It returns only once the new record would survive
// a crash; on error the previous record is intact.
func (s *Store) Save(svcs []registry.Service) error {
	data := Encode(svcs)
	_, err := s.dir.WriteAtomic(FileName, func(w io.Writer) error {
		if s.write != nil {
			w = s.write(w)
		}
		_, err := w.Write(data)
		return err
	})
	if err != nil {
		return fmt.Errorf("record registrations: %w", err)
	}
	return nil
}

// Load returns the recorded registrations sorted by service key; a missing
// record is an empty set (a fresh directory). Anything else that cannot be
// read fully is a *CorruptError.
func (s *Store) Load() ([]registry.Service, error) {
	data, err := os.ReadFile(s.Path())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, &CorruptError{Path: s.Path(), Reason: err.Error()}
	}
	svcs, reason := Decode(data)
	if reason != "" {
		return nil, &CorruptError{Path: s.Path(), Reason: reason}
	}
	return svcs, nil
}

// Encode renders a record: header, one length-prefixed /register body per
// service, and an xxhash64 of everything before it.
func Encode(svcs []registry.Service) []byte {
	sorted := append([]registry.Service(nil), svcs...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Key() < sorted[j].Key() })
	b := append([]byte(nil), magic[:]...)
	b = binary.LittleEndian.AppendUint32(b, Version)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(sorted)))
	for i := range sorted {
		body := registration.Encode(&sorted[i])
		b = binary.LittleEndian.AppendUint32(b, uint32(len(body)))
		b = append(b, body...)
	}
	return binary.LittleEndian.AppendUint64(b, xxhash.Sum64(b))
}

// Decode parses a record; reason is empty on success and otherwise says
// what is wrong, for the start-up error.
func Decode(data []byte) (svcs []registry.Service, reason string) {
	if len(data) < headerLen+8 {
		return nil, fmt.Sprintf("truncated: %d bytes", len(data))
	}
	if !bytes.Equal(data[:8], magic[:]) {
		return nil, "not a registration record (bad magic)"
	}
	if v := binary.LittleEndian.Uint32(data[8:]); v != Version {
		return nil, fmt.Sprintf("format version %d, this release reads version %d", v, Version)
	}
	body, sum := data[:len(data)-8], binary.LittleEndian.Uint64(data[len(data)-8:])
	if xxhash.Sum64(body) != sum {
		return nil, "checksum mismatch (truncated or damaged)"
	}
	n := binary.LittleEndian.Uint32(data[12:])
	p := headerLen
	for i := uint32(0); i < n; i++ {
		if len(body)-p < 4 {
			return nil, fmt.Sprintf("record %d of %d is cut short", i, n)
		}
		l := int(binary.LittleEndian.Uint32(body[p:]))
		p += 4
		if l > len(body)-p {
			return nil, fmt.Sprintf("record %d of %d is cut short", i, n)
		}
		svc, err := registration.DecodeService(body[p : p+l])
		if err != nil {
			return nil, fmt.Sprintf("record %d of %d is not a valid registration: %v", i, n, err)
		}
		svcs = append(svcs, svc)
		p += l
	}
	if p != len(body) {
		return nil, fmt.Sprintf("%d bytes after the last record", len(body)-p)
	}
	return svcs, ""
}
