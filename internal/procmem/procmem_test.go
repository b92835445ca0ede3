package procmem

import (
	"syscall"
	"testing"
)

func TestSmapsField(t *testing.T) {
	raw := []byte("Rss:              68004 kB\nAnonHugePages:     63488 kB\nSwap: 0 kB\nOdd: x kB\nEmpty:\n")
	for _, tc := range []struct {
		name string
		want int64
	}{{"Rss:", 68004 << 10}, {"AnonHugePages:", 63488 << 10}, {"Swap:", 0}, {"Missing:", -1}, {"Odd:", -1}, {"Empty:", -1}} {
		if got := SmapsField(raw, tc.name); got != tc.want {
			t.Errorf("SmapsField(%q) = %d, want %d", tc.name, got, tc.want)
		}
	}
}

// TestResidentFollowsWrites: writing 16 MiB of fresh anonymous memory
// shows in the resident set, and not in its shared part.
func TestResidentFollowsWrites(t *testing.T) {
	rss0, shared0, ok := Resident()
	if !ok {
		t.Fatal("no /proc/self/statm")
	}
	mem, err := syscall.Mmap(-1, 0, 16<<20, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(mem)
	for i := 0; i < len(mem); i += 4096 {
		mem[i] = 1
	}
	rss1, shared1, _ := Resident()
	if rss1-rss0 < 15<<20 {
		t.Errorf("RSS grew by %d bytes after writing 16 MiB, want at least 15 MiB", rss1-rss0)
	}
	if shared1-shared0 > 1<<20 {
		t.Errorf("shared part grew by %d bytes for private memory", shared1-shared0)
	}
	if got := Rollup("Rss:"); got < rss1/2 {
		t.Errorf("smaps_rollup Rss %d, statm %d", got, rss1)
	}
}
