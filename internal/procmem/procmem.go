// Package procmem reads this process's memory figures from /proc: its
// resident set (statm, the kernel's counters, no page-table walk) and the
// fields of smaps_rollup (a walk of its page tables, about a millisecond
// per GiB resident), for the memory tests.
package procmem

import (
	"bytes"
	"os"
	"strconv"
	"strings"
)

// Resident returns the process's resident set and the part of it that is
// shared (file pages and shared memory), in bytes.
func Resident() (rss, shared int64, ok bool) {
	raw, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0, 0, false
	}
	f := strings.Fields(string(raw))
	if len(f) < 3 {
		return 0, 0, false
	}
	r, err1 := strconv.ParseInt(f[1], 10, 64)
	s, err2 := strconv.ParseInt(f[2], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	page := int64(os.Getpagesize())
	return r * page, s * page, true
}

// RSS is the process's resident set in bytes, 0 when unknown.
func RSS() int64 {
	rss, _, _ := Resident()
	return rss
}

// Rollup reads one field of /proc/self/smaps_rollup ("AnonHugePages:",
// "Rss:") in bytes, -1 when it cannot be read.
func Rollup(name string) int64 {
	raw, err := os.ReadFile("/proc/self/smaps_rollup")
	if err != nil {
		return -1
	}
	return SmapsField(raw, name)
}

// SmapsField reads a "Name:   N kB" line of an smaps file, in bytes; -1
// when it is missing.
func SmapsField(raw []byte, name string) int64 {
	for line := range bytes.Lines(raw) {
		if rest, ok := bytes.CutPrefix(line, []byte(name)); ok {
			f := bytes.Fields(rest)
			if len(f) == 0 {
				return -1
			}
			kb, err := strconv.ParseInt(string(f[0]), 10, 64)
			if err != nil {
				return -1
			}
			return kb << 10
		}
	}
	return -1
}
