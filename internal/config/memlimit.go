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
	"slices"
	"strconv"
	"strings"

	"github.com/mooncake-conductor-go/conductor/internal/membudget"
)

// MemoryLimit is the memory limit the process runs under, as --memory-mib
// auto derives the budget from it (docs/index-memory.md#the-budget).
type MemoryLimit struct {
	// Bytes is the limit, 0 when none is known.
	Bytes int64
	// Source says where it came from: "cgroup <file>", "GOMEMLIMIT",
	// "--memory-mib", or "" when none is known.
	Source string
}

// ProcessMemoryLimit finds the limit from the files under root ("/" in
// production; tests pass a directory laid out like one) and goMemLimit,
// the runtime's soft limit when GOMEMLIMIT is set (math.MaxInt64 or less
// than 1 when not). The smallest of the known limits wins: the process
// must fit under all of them.
//
// The cgroup v2 limit is the smallest memory.max on the path from the
// process's cgroup (the "0::" line of /proc/self/cgroup) up to the root of
// the cgroup mount, because every ancestor's limit applies to it; "max"
// means no limit at that level. Inside a container the mount's root is the
// container's own cgroup, which is where its limit sits. The cgroup v1
// limit is the smallest memory.limit_in_bytes on the path of the memory
// controller's line (for example "4:memory:/docker/abc") under
// /sys/fs/cgroup/memory, or that mount's root (a container sees its own
// cgroup there); values of 2^60 and more are v1's "no limit".
func ProcessMemoryLimit(root string, goMemLimit int64) MemoryLimit {
	var out MemoryLimit
	consider := func(n int64, src string) {
		if n > 0 && (out.Bytes == 0 || n < out.Bytes) {
			out = MemoryLimit{Bytes: n, Source: src}
		}
	}
	data, _ := os.ReadFile(filepath.Join(root, "proc/self/cgroup"))
	if rel, ok := cgroupPath(data, func(ctrl string) bool { return ctrl == "" }); ok {
		if limit, file, ok := smallestOnPath(root, "sys/fs/cgroup", rel, "memory.max"); ok {
			consider(limit, "cgroup "+file)
		}
	}
	if rel, ok := cgroupPath(data, func(ctrl string) bool { return slices.Contains(strings.Split(ctrl, ","), "memory") }); ok {
		if limit, file, ok := smallestOnPath(root, "sys/fs/cgroup/memory", rel, "memory.limit_in_bytes"); ok {
			consider(limit, "cgroup "+file)
		}
	}
	if goMemLimit > 0 && goMemLimit < math.MaxInt64 {
		consider(goMemLimit, "GOMEMLIMIT")
	}
	return out
}

// cgroupPath is the path of the first /proc/self/cgroup line
// ("id:controllers:path") whose controllers match: "" for the v2 line.
func cgroupPath(data []byte, match func(controllers string) bool) (string, bool) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.SplitN(sc.Text(), ":", 3)
		if len(f) == 3 && match(f[1]) && (f[1] != "" || f[0] == "0") {
			return f[2], true
		}
	}
	return "", false
}

// noLimitV1 is where cgroup v1's unlimited value (the largest page-aligned
// int64) and anything near it start.
const noLimitV1 = 1 << 60

// smallestOnPath reads name in each directory from rel up to the mount's
// root and returns the smallest limit found; ok is false without one.
func smallestOnPath(root, mount, rel, name string) (limit int64, file string, ok bool) {
	base := filepath.Join(root, mount)
	for dir := path.Clean("/" + rel); ; dir = path.Dir(dir) {
		f := filepath.Join(base, filepath.FromSlash(dir), name)
		if b, err := os.ReadFile(f); err == nil {
			v := strings.TrimSpace(string(b))
			if n, err := strconv.ParseInt(v, 10, 64); err == nil && n > 0 && n < noLimitV1 && (!ok || n < limit) {
				limit, file, ok = n, strings.TrimPrefix(f, filepath.Clean(root)), true
			}
		}
		if dir == "/" {
			return limit, file, ok
		}
	}
}

// processMemoryLimit is the running process's limit.
func processMemoryLimit() MemoryLimit { return ProcessMemoryLimit("/", debug.SetMemoryLimit(-1)) }

// memoryBudget resolves --memory-mib: "auto" derives the budget from the
// process's memory limit less the headroom (0, unbounded, when none is
// known); otherwise a number of MiB, 0 meaning unbounded.
func memoryBudget(v string, limit func() MemoryLimit) (total int64, l MemoryLimit, err error) {
	if v == "auto" {
		l = limit()
		if l.Bytes == 0 {
			return 0, l, nil
		}
		total, err = membudget.FromLimit(l.Bytes, l.Source)
		return total, l, err
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 || n > 1<<30 || (n > 0 && n < membudget.MinLimit>>20) {
		return 0, l, fmt.Errorf("invalid memory budget %q MiB: want auto, 0 (unbounded) or a size in MiB of at least %d", v, membudget.MinLimit>>20)
	}
	return n << 20, MemoryLimit{Source: "--memory-mib"}, nil
}

// indexMemory resolves --index-memory-mib when given: a number of MiB, 0
// meaning unbounded ("auto" follows the budget: ok is false).
func indexMemory(v string) (bytes int64, ok bool, err error) {
	if v == "auto" {
		return 0, false, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 || n > 1<<30 {
		return 0, false, fmt.Errorf("invalid index memory budget %q MiB: want auto, 0 (unbounded) or a size in MiB", v)
	}
	return n << 20, true, nil
}
