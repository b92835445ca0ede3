package config

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mooncake-conductor-go/conductor/internal/membudget"
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
		name:  "cgroup v1: a container sees its own cgroup at the mount's root",
		files: map[string]string{"proc/self/cgroup": "12:memory:/docker/abc\n", "sys/fs/cgroup/memory/memory.limit_in_bytes": "1073741824\n"},
		want:  MemoryLimit{Bytes: gib, Source: "cgroup /sys/fs/cgroup/memory/memory.limit_in_bytes"},
	}, {
		name: "cgroup v1 nested: the smallest on the path up, unlimited levels skipped",
		files: map[string]string{
			"proc/self/cgroup":                                             "11:cpu,cpuacct:/kubepods/pod1/ctr\n4:memory,hugetlb:/kubepods/pod1/ctr\n0::/\n",
			"sys/fs/cgroup/memory/memory.limit_in_bytes":                   "9223372036854771712\n",
			"sys/fs/cgroup/memory/kubepods/memory.limit_in_bytes":          "8589934592\n",
			"sys/fs/cgroup/memory/kubepods/pod1/memory.limit_in_bytes":     "2147483648\n",
			"sys/fs/cgroup/memory/kubepods/pod1/ctr/memory.limit_in_bytes": "9223372036854771712\n",
		},
		want: MemoryLimit{Bytes: 2 * gib, Source: "cgroup /sys/fs/cgroup/memory/kubepods/pod1/memory.limit_in_bytes"},
	}, {
		name:  "cgroup v1 unlimited everywhere",
		files: map[string]string{"proc/self/cgroup": "4:memory:/user.slice\n", "sys/fs/cgroup/memory/user.slice/memory.limit_in_bytes": "9223372036854771712\n"},
	}, {
		name: "hybrid: v1's memory limit, v2 without a memory controller",
		files: map[string]string{
			"proc/self/cgroup": "0::/system.slice/x.service\n4:memory:/system.slice/x.service\n",
			"sys/fs/cgroup/memory/system.slice/x.service/memory.limit_in_bytes": "536870912\n",
		},
		goMemLimit: gib,
		want:       MemoryLimit{Bytes: gib / 2, Source: "cgroup /sys/fs/cgroup/memory/system.slice/x.service/memory.limit_in_bytes"},
	}, {
		name: "v2 and v1 both limited: the smaller wins",
		files: map[string]string{
			"proc/self/cgroup":                           "0::/\n4:memory:/\n",
			"sys/fs/cgroup/memory.max":                   "1073741824\n",
			"sys/fs/cgroup/memory/memory.limit_in_bytes": "2147483648\n",
		},
		want: MemoryLimit{Bytes: gib, Source: "cgroup /sys/fs/cgroup/memory.max"},
	}, {
		name:       "GOMEMLIMIT below a cgroup v1 limit wins",
		files:      map[string]string{"proc/self/cgroup": "4:memory:/\n", "sys/fs/cgroup/memory/memory.limit_in_bytes": "2147483648\n"},
		goMemLimit: gib,
		want:       MemoryLimit{Bytes: gib, Source: "GOMEMLIMIT"},
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

// TestMemoryFlags: --memory-mib and the parts' overrides, by flag and by
// environment, against the split the budget's rule gives.
func TestMemoryFlags(t *testing.T) {
	const mib = 1 << 20
	cgroup8G := MemoryLimit{Bytes: 8 << 30, Source: "cgroup /sys/fs/cgroup/memory.max"}
	for _, tc := range []struct {
		name  string
		args  []string
		env   map[string]string
		limit MemoryLimit
		want  membudget.Budget
		err   bool
	}{
		{name: "auto from the cgroup: limit less headroom, split by the rule", limit: cgroup8G,
			want: membudget.Split(6<<30, 8<<30, cgroup8G.Source, nil)},
		{name: "auto without a limit: unbounded", want: membudget.Split(0, 0, "", nil)},
		{name: "auto under a tiny limit", limit: MemoryLimit{Bytes: 32 * mib, Source: "GOMEMLIMIT"}, err: true},
		{name: "flag", args: []string{"--memory-mib", "512"}, limit: cgroup8G,
			want: membudget.Split(512*mib, 0, "--memory-mib", nil)},
		{name: "env", env: map[string]string{"CONDUCTOR_MEMORY_MIB": "256"},
			want: membudget.Split(256*mib, 0, "--memory-mib", nil)},
		{name: "flag over env", args: []string{"--memory-mib", "128"}, env: map[string]string{"CONDUCTOR_MEMORY_MIB": "256"},
			want: membudget.Split(128*mib, 0, "--memory-mib", nil)},
		{name: "zero is unbounded", args: []string{"--memory-mib", "0"}, limit: cgroup8G, want: membudget.Split(0, 0, "--memory-mib", nil)},
		{name: "under the minimum", args: []string{"--memory-mib", "16"}, err: true},
		{name: "not a number", env: map[string]string{"CONDUCTOR_MEMORY_MIB": "lots"}, err: true},
		{name: "index override by flag", args: []string{"--memory-mib", "512", "--index-memory-mib", "32"},
			want: membudget.Split(512*mib, 0, "--memory-mib", map[membudget.Part]int64{membudget.Index: 32 * mib})},
		{name: "index override by env, 0 unbounded", env: map[string]string{"CONDUCTOR_INDEX_MEMORY_MIB": "0"}, limit: cgroup8G,
			want: membudget.Split(6<<30, 8<<30, cgroup8G.Source, map[membudget.Part]int64{membudget.Index: 0})},
		{name: "cache overrides", args: []string{"--memory-mib", "512", "--hash-memo-mib", "0", "--link-memo-mib", "7"},
			env:  map[string]string{"CONDUCTOR_TOKEN_MEMO_MIB": "5"},
			want: membudget.Split(512*mib, 0, "--memory-mib", map[membudget.Part]int64{membudget.HashMemo: 0, membudget.Links: 7 * mib, membudget.TokenMemo: 5 * mib})},
		{name: "index override invalid", args: []string{"--index-memory-mib", "-1"}, err: true},
		{name: "cache override invalid", env: map[string]string{"CONDUCTOR_LINK_MEMO_MIB": "x"}, err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := load(append(tc.args, "--config", ""), func(k string) string { return tc.env[k] }, func() MemoryLimit { return tc.limit })
			if tc.err {
				if err == nil {
					t.Fatalf("accepted: %+v", c.Memory)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, c.Memory); diff != "" {
				t.Fatalf("budget (-want +got):\n%s", diff)
			}
			sz := c.Memory.Size
			got := []int64{c.IndexMemoryBytes, int64(c.LinkMemoBytes), int64(c.MemoBytes), int64(c.TokenMemoBytes)}
			want := []int64{sz[membudget.Index], sz[membudget.Links], sz[membudget.HashMemo], sz[membudget.TokenMemo]}
			if !slices.Equal(got, want) {
				t.Fatalf("config sizes %v, budget parts %v", got, want)
			}
		})
	}
}
