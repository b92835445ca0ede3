package config

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
	"os"
	"path"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
)

// MemoryLimit is the memory limit the process runs under, as the default
// index budget derives it (docs/index-memory.md#the-default).
type MemoryLimit struct {
	// Bytes is the limit, 0 when none is known.
	Bytes int64
	// Source says where it came from: "cgroup <file>", "GOMEMLIMIT", or
	// "" when none is known.
	Source string
}

// ProcessMemoryLimit finds the limit from the files under root ("/" in
// production; tests pass a directory laid out like one) and goMemLimit,
// the runtime's soft limit when GOMEMLIMIT is set (math.MaxInt64 or less
// than 1 when not).
//
// The cgroup v2 limit is the smallest memory.max on the path from the
// process's cgroup (the "0::" line of /proc/self/cgroup) up to the root of
// the cgroup mount, because every ancestor's limit applies to it; "max"
// means no limit at that level. Inside a container the mount's root is the
// container's own cgroup, which is where its limit sits. cgroup v1 and a
// missing mount give no limit. When both a cgroup limit and GOMEMLIMIT are
// known the smaller wins: the process must fit under both.
func ProcessMemoryLimit(root string, goMemLimit int64) MemoryLimit {
	var out MemoryLimit
	if limit, file, ok := cgroupLimit(root); ok {
		out = MemoryLimit{Bytes: limit, Source: "cgroup " + file}
	}
	if goMemLimit > 0 && goMemLimit < math.MaxInt64 && (out.Bytes == 0 || goMemLimit < out.Bytes) {
		out = MemoryLimit{Bytes: goMemLimit, Source: "GOMEMLIMIT"}
	}
	return out
}

// cgroupLimit reads the cgroup v2 memory limit; ok is false without one.
func cgroupLimit(root string) (limit int64, file string, ok bool) {
	data, err := os.ReadFile(filepath.Join(root, "proc/self/cgroup"))
	if err != nil {
		return 0, "", false
	}
	var rel string
	found := false
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if p, isV2 := strings.CutPrefix(sc.Text(), "0::"); isV2 {
			rel, found = p, true
			break
		}
	}
	if !found {
		return 0, "", false
	}
	mount := filepath.Join(root, "sys/fs/cgroup")
	for dir := path.Clean("/" + rel); ; dir = path.Dir(dir) {
		f := filepath.Join(mount, filepath.FromSlash(dir), "memory.max")
		if b, err := os.ReadFile(f); err == nil {
			v := strings.TrimSpace(string(b))
			if n, err := strconv.ParseInt(v, 10, 64); err == nil && n > 0 && (!ok || n < limit) {
				limit, file, ok = n, strings.TrimPrefix(f, filepath.Clean(root)), true
			}
		}
		if dir == "/" {
			return limit, file, ok
		}
	}
}

// memoryLimit is the running process's limit; tests replace it.
var memoryLimit = func() MemoryLimit { return ProcessMemoryLimit("/", debug.SetMemoryLimit(-1)) }

// indexMemory resolves --index-memory-mib: "auto" derives half the
// process's memory limit (0, unbounded, when none is known); otherwise a
// number of MiB, 0 meaning unbounded.
func indexMemory(v string, limit func() MemoryLimit) (bytes int64, note string, err error) {
	if v == "auto" {
		l := limit()
		if l.Bytes == 0 {
			return 0, "index memory unbounded: no memory limit known (no cgroup v2 memory.max, no GOMEMLIMIT); set --index-memory-mib to bound it", nil
		}
		b := l.Bytes / 2
		return b, fmt.Sprintf("index memory budget %d MiB: half the %d MiB limit of %s", b>>20, l.Bytes>>20, l.Source), nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 || n > 1<<30 {
		return 0, "", fmt.Errorf("invalid index memory budget %q MiB: want auto, 0 (unbounded) or a size in MiB", v)
	}
	return n << 20, "", nil
}
