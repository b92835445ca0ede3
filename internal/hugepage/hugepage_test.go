package hugepage

import (
	"bufio"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/google/go-cmp/cmp"
	"github.com/rs/zerolog"
)

func TestParseMapsLine(t *testing.T) {
	for _, tc := range []struct {
		line string
		want addrRange
		ok   bool
	}{
		{"c000000000-c004000000 rw-p 00000000 00:00 0 ", addrRange{0xc000000000, 0xc004000000}, true},
		{"55d0c0a00000-55d0c0c00000 rw-p 00000000 00:00 0                          [heap]", addrRange{0x55d0c0a00000, 0x55d0c0c00000}, true},
		{"7f0000000000-7f0000400000 rw-s 00000000 00:05 1234                       /dev/zero (deleted)", addrRange{}, false},
		{"7f0000000000-7f0000400000 r--p 00000000 00:00 0 ", addrRange{}, false},
		{"7f0000000000-7f0000400000 rw-p 00001000 08:01 4242                       /usr/lib/libzmq.so.5", addrRange{}, false},
		{"7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]", addrRange{}, false},
		{"zz-7f0000400000 rw-p 00000000 00:00 0 ", addrRange{}, false},
		{"7f0000400000-7f0000000000 rw-p 00000000 00:00 0 ", addrRange{}, false},
		{"", addrRange{}, false},
	} {
		got, ok := parseMapsLine([]byte(tc.line))
		if ok != tc.ok || got != tc.want {
			t.Errorf("parseMapsLine(%q) = %x, %v; want %x, %v", tc.line, got, ok, tc.want, tc.ok)
		}
	}
}

func TestMode(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ content, want string }{
		{"always [madvise] never\n", "madvise"},
		{"[always] madvise never\n", "always"},
		{"always madvise [never]\n", "never"},
		{"garbage\n", ""},
	} {
		p := filepath.Join(dir, "enabled")
		if err := os.WriteFile(p, []byte(tc.content), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := Mode(p); got != tc.want {
			t.Errorf("Mode(%q) = %q, want %q", tc.content, got, tc.want)
		}
	}
	if got := Mode(filepath.Join(dir, "missing")); got != "" {
		t.Errorf("Mode(missing) = %q, want \"\"", got)
	}
}

func TestSmapsField(t *testing.T) {
	raw := []byte("Rss:              68004 kB\nAnonHugePages:     63488 kB\nSwap: 0 kB\n")
	for _, tc := range []struct {
		name string
		want int64
	}{{"Rss:", 68004 << 10}, {"AnonHugePages:", 63488 << 10}, {"Missing:", -1}} {
		if got := smapsField(raw, tc.name); got != tc.want {
			t.Errorf("smapsField(%q) = %d, want %d", tc.name, got, tc.want)
		}
	}
}

// region maps n bytes of anonymous memory between two inaccessible
// guard pages, so the kernel cannot merge it with a neighbour and its
// smaps entry is its own, aligned to a chunk.
func region(t *testing.T, n int) []byte {
	t.Helper()
	mem, err := syscall.Mmap(-1, 0, n+3*ChunkBytes, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Munmap(mem) })
	base := uintptr(unsafe.Pointer(&mem[0]))
	off := int((ChunkBytes-base%ChunkBytes)%ChunkBytes) + ChunkBytes
	if err := syscall.Mprotect(mem[off-pageBytes:off], syscall.PROT_NONE); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mprotect(mem[off+n:off+n+pageBytes], syscall.PROT_NONE); err != nil {
		t.Fatal(err)
	}
	return mem[off : off+n]
}

// vmaField reads a field of the smaps entry of the mapping holding b.
func vmaField(t *testing.T, b []byte, name string) int64 {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	addr := uint64(uintptr(unsafe.Pointer(&b[0])))
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if lo, hi, ok := strings.Cut(strings.Fields(line + " x")[0], "-"); ok && !strings.HasSuffix(line, " kB") && !strings.Contains(lo, ":") {
			l, err1 := strconv.ParseUint(lo, 16, 64)
			h, err2 := strconv.ParseUint(hi, 16, 64)
			in = err1 == nil && err2 == nil && l <= addr && addr < h
			continue
		}
		if in {
			if v := smapsField([]byte(line), name); v >= 0 {
				return v
			}
		}
	}
	t.Fatalf("no %s for the mapping at %#x", name, addr)
	return 0
}

func residentPages(t *testing.T, b []byte) int {
	t.Helper()
	vec := make([]byte, len(b)/pageBytes)
	if _, _, e := syscall.Syscall(syscall.SYS_MINCORE, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatal(e)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

// requireCollapse fails unless the kernel knows MADV_COLLAPSE, which the
// service's hosts (Linux 6.1 or later) do.
func requireCollapse(t *testing.T, err error) {
	t.Helper()
	if errors.Is(err, ErrUnsupported) {
		t.Fatalf("%v: the tests need Linux 6.1 or later", err)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// TestPassCollapsesOnlyDenseChunks is the package's contract on the real
// kernel: a fully resident region ends on huge pages, and a half-resident
// one is left as it was, holes included (collapsing it would have made
// every page resident).
func TestPassCollapsesOnlyDenseChunks(t *testing.T) {
	const n = 8 * ChunkBytes
	dense, sparse := region(t, n), region(t, n)
	for i := 0; i < n; i += pageBytes {
		dense[i] = 1
		if i/pageBytes%2 == 0 {
			sparse[i] = 1
		}
	}
	if got := vmaField(t, dense, "AnonHugePages:"); got != 0 {
		t.Fatalf("dense region on huge pages before any pass (%d bytes): the host's THP mode is not what the test assumes", got)
	}
	c := New(Options{Logger: zerolog.Nop()})
	r, err := c.Pass()
	requireCollapse(t, err)
	if r.Dense < n/ChunkBytes || r.Collapsed < n/ChunkBytes {
		t.Errorf("pass %+v: want at least %d dense and collapsed chunks", r, n/ChunkBytes)
	}
	if got := vmaField(t, dense, "AnonHugePages:"); got != n {
		t.Errorf("dense region: %d bytes on huge pages, want %d", got, n)
	}
	if got := vmaField(t, sparse, "AnonHugePages:"); got != 0 {
		t.Errorf("sparse region: %d bytes on huge pages, want 0", got)
	}
	if got, want := residentPages(t, sparse), n/pageBytes/2; got != want {
		t.Errorf("sparse region: %d pages resident after the pass, want the %d it had", got, want)
	}
	for i := 0; i < n; i += pageBytes {
		if dense[i] != 1 {
			t.Fatalf("dense region's byte %d is %d after the collapse, want 1", i, dense[i])
		}
	}
	// Again: chunks already on huge pages cost the kernel a look.
	r2, err := c.Pass()
	requireCollapse(t, err)
	if r2.Collapsed < n/ChunkBytes {
		t.Errorf("second pass %+v: want the %d chunks still collapsed", r2, n/ChunkBytes)
	}
	if passes, _ := c.Stats(); passes != 2 {
		t.Errorf("Stats: %d passes, want 2", passes)
	}
}

func modeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "enabled")
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestLoopCollapsesAfterGrowth runs the collapser as the service does: the
// Go heap grows by a slab larger than MinGrowth and holds still, and a
// pass puts the slab on huge pages; Stop ends the goroutine.
func TestLoopCollapsesAfterGrowth(t *testing.T) {
	c := New(Options{Interval: 5 * time.Millisecond, MinGrowth: 4 << 20, ModePath: modeFile(t, "always [madvise] never\n"), Logger: zerolog.Nop()})
	if !c.Wanted() {
		t.Fatal("madvise mode: want passes")
	}
	c.Start()
	defer c.Stop()
	slab := make([]uint64, 32<<20/8)
	for i := range slab {
		slab[i] = uint64(i)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if passes, _ := c.Stats(); passes > 0 && heapHuge(slab) {
			break
		}
		if time.Now().After(deadline) {
			passes, failed := c.Stats()
			t.Fatalf("slab not on huge pages after 30 s: %d passes, %d failed chunks", passes, failed)
		}
		time.Sleep(time.Millisecond)
	}
	c.Stop()
	select {
	case <-c.done:
	default:
		t.Fatal("loop still running after Stop")
	}
}

// heapHuge says whether some chunk inside b is on a huge page, judged by
// the process's AnonHugePages (b is most of what this test allocates).
func heapHuge(b []uint64) bool {
	return AnonHugeBytes() >= int64(len(b)*8)/2
}

// TestNoPassesUnlessMadvise: in "always" the kernel does the work at fault
// time, in "never" the operator said no, and without THP there is nothing
// to ask; Start then starts nothing and Stop returns at once.
func TestNoPassesUnlessMadvise(t *testing.T) {
	for _, content := range []string{"[always] madvise never\n", "always madvise [never]\n", ""} {
		c := New(Options{Interval: time.Millisecond, ModePath: modeFile(t, content), Logger: zerolog.Nop()})
		if c.Wanted() {
			t.Errorf("mode %q: Wanted", c.Mode())
		}
		c.Start()
		c.Stop()
		c.Stop() // idempotent
		if passes, failed := c.Stats(); passes != 0 || failed != 0 {
			t.Errorf("mode %q: %d passes, %d failed", c.Mode(), passes, failed)
		}
	}
}

func TestAnonymousRangesOfThisProcess(t *testing.T) {
	b := region(t, 2*ChunkBytes)
	got, err := anonymousRanges("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	lo := uintptr(unsafe.Pointer(&b[0]))
	var holding []addrRange
	for _, r := range got {
		if r.lo <= lo && lo < r.hi {
			holding = append(holding, r)
		}
	}
	if diff := cmp.Diff([]addrRange{{lo, lo + 2*ChunkBytes}}, holding, cmp.AllowUnexported(addrRange{})); diff != "" {
		t.Errorf("the test's mapping among the anonymous ranges (-want +got):\n%s", diff)
	}
	if _, err := anonymousRanges(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("missing maps file: no error")
	}
}
