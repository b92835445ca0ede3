package config

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// layout writes files (path relative to a fresh root → content) and
// returns the root.
func layout(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, c := range files {
		f := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestProcessMemoryLimit(t *testing.T) {
	const gib = 1 << 30
	for _, tc := range []struct {
		name       string
		files      map[string]string
		goMemLimit int64
		want       MemoryLimit
	}{{
		name: "container: the namespace root holds the limit",
		files: map[string]string{
			"proc/self/cgroup":          "0::/\n",
			"sys/fs/cgroup/memory.max":  "4294967296\n",
			"sys/fs/cgroup/memory.high": "max\n",
		},
		goMemLimit: math.MaxInt64,
		want:       MemoryLimit{Bytes: 4 * gib, Source: "cgroup /sys/fs/cgroup/memory.max"},
	}, {
		name: "nested: the smallest limit on the path up wins",
		files: map[string]string{
			"proc/self/cgroup":                           "0::/kubepods/pod1/ctr\n",
			"sys/fs/cgroup/kubepods/memory.max":          "8589934592\n",
			"sys/fs/cgroup/kubepods/pod1/memory.max":     "2147483648\n",
			"sys/fs/cgroup/kubepods/pod1/ctr/memory.max": "max\n",
		},
		want: MemoryLimit{Bytes: 2 * gib, Source: "cgroup /sys/fs/cgroup/kubepods/pod1/memory.max"},
	}, {
		name: "no limit anywhere",
		files: map[string]string{
			"proc/self/cgroup":                                    "0::/user.slice/session-1.scope\n",
			"sys/fs/cgroup/user.slice/memory.max":                 "max\n",
			"sys/fs/cgroup/user.slice/session-1.scope/memory.max": "max\n",
		},
		goMemLimit: math.MaxInt64,
	}, {
		name:  "cgroup v1 only",
		files: map[string]string{"proc/self/cgroup": "12:memory:/docker/abc\n", "sys/fs/cgroup/memory/memory.limit_in_bytes": "1073741824\n"},
	}, {
		name:       "no proc: GOMEMLIMIT alone",
		goMemLimit: 3 * gib,
		want:       MemoryLimit{Bytes: 3 * gib, Source: "GOMEMLIMIT"},
	}, {
		name: "GOMEMLIMIT below the cgroup limit wins",
		files: map[string]string{
			"proc/self/cgroup":         "0::/\n",
			"sys/fs/cgroup/memory.max": "4294967296\n",
		},
		goMemLimit: gib,
		want:       MemoryLimit{Bytes: gib, Source: "GOMEMLIMIT"},
	}, {
		name: "a cgroup limit below GOMEMLIMIT wins",
		files: map[string]string{
			"proc/self/cgroup":         "0::/\n",
			"sys/fs/cgroup/memory.max": "1073741824\n",
		},
		goMemLimit: 4 * gib,
		want:       MemoryLimit{Bytes: gib, Source: "cgroup /sys/fs/cgroup/memory.max"},
	}, {
		name: "garbage in memory.max is no limit",
		files: map[string]string{
			"proc/self/cgroup":         "0::/\n",
			"sys/fs/cgroup/memory.max": "lots\n",
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ProcessMemoryLimit(layout(t, tc.files), tc.goMemLimit); got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestIndexMemoryFlag(t *testing.T) {
	old := memoryLimit
	t.Cleanup(func() { memoryLimit = old })
	for _, tc := range []struct {
		name, flag, env string
		limit           MemoryLimit
		want            int64
		note            string // a substring of the INFO note; "" for none
		err             bool
	}{
		{name: "default from cgroup", limit: MemoryLimit{Bytes: 8 << 30, Source: "cgroup /sys/fs/cgroup/memory.max"}, want: 4 << 30, note: "half the 8192 MiB limit of cgroup"},
		{name: "default unbounded", note: "unbounded: no memory limit known"},
		{name: "flag", flag: "32", limit: MemoryLimit{Bytes: 8 << 30}, want: 32 << 20},
		{name: "env", env: "64", want: 64 << 20},
		{name: "flag over env", flag: "16", env: "64", want: 16 << 20},
		{name: "zero is unbounded", flag: "0", limit: MemoryLimit{Bytes: 8 << 30}, want: 0},
		{name: "negative", flag: "-1", err: true},
		{name: "not a number", env: "lots", err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			memoryLimit = func() MemoryLimit { return tc.limit }
			var args []string
			if tc.flag != "" {
				args = append(args, "--index-memory-mib", tc.flag)
			}
			args = append(args, "--config", "")
			c, err := Load(args, func(k string) string {
				if k == "CONDUCTOR_INDEX_MEMORY_MIB" {
					return tc.env
				}
				return ""
			})
			if tc.err {
				if err == nil {
					t.Fatalf("accepted, budget %d", c.IndexMemoryBytes)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.IndexMemoryBytes != tc.want {
				t.Fatalf("budget %d, want %d", c.IndexMemoryBytes, tc.want)
			}
			if (tc.note == "") != (c.IndexMemoryNote == "") || !strings.Contains(c.IndexMemoryNote, tc.note) {
				t.Fatalf("note %q, want one containing %q", c.IndexMemoryNote, tc.note)
			}
		})
	}
}
