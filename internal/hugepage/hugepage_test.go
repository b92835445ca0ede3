package hugepage

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/google/go-cmp/cmp"
	"github.com/rs/zerolog"

	"github.com/mooncake-conductor-go/conductor/internal/procmem"
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
		{"c000000000-c004000000 rw-p 00000000 00:00 0                              [anon: Go: heap]", addrRange{0xc000000000, 0xc004000000}, true},
		{"7f0000000000-7f0000400000 rw-p 00000000 00:00 0                          [anon:zmq]", addrRange{0x7f0000000000, 0x7f0000400000}, true},
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
			if v := procmem.SmapsField([]byte(line), name); v >= 0 {
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

// mapsOf writes a maps file naming only the regions given, so that a
// pass looks at nothing else of the test binary.
func mapsOf(t *testing.T, regions ...[]byte) string {
	t.Helper()
	var b strings.Builder
	for _, r := range regions {
		lo := uintptr(unsafe.Pointer(&r[0]))
		fmt.Fprintf(&b, "%x-%x rw-p 00000000 00:00 0 \n", lo, lo+uintptr(len(r)))
	}
	p := filepath.Join(t.TempDir(), "maps")
	if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// collapser is a collapser in madvise mode on this kernel, which must
// know MADV_COLLAPSE (Linux 6.1, as the service's hosts).
func collapser(t *testing.T, opts Options) *Collapser {
	t.Helper()
	opts.ModePath = modeFile(t, "always [madvise] never\n")
	opts.Logger = zerolog.Nop()
	c := New(opts)
	if !c.Wanted() {
		t.Fatal("the kernel does not know MADV_COLLAPSE: the tests need Linux 6.1 or later")
	}
	return c
}

// passUntilCollapsed runs passes until one collapses every chunk it finds
// full (a chunk can fail for a moment: pages briefly locked, no huge page
// free until compaction), at most a few times.
func passUntilCollapsed(t *testing.T, c *Collapser) PassResult {
	t.Helper()
	var r PassResult
	for range 5 {
		var err error
		if r, err = c.Pass(); err != nil {
			t.Fatal(err)
		}
		if r.Failed == 0 {
			break
		}
	}
	return r
}

// TestPassCollapsesOnlyFullChunks is the package's contract on the real
// kernel: a fully written region ends on huge pages; a half-written one
// and one only read (its pages are the kernel's zero page) are left as
// they were, holes included, where collapsing would have made all of
// their pages resident.
func TestPassCollapsesOnlyFullChunks(t *testing.T) {
	if m := Mode("/sys/kernel/mm/transparent_hugepage/enabled"); m == "always" {
		t.Skip("THP mode always: fresh regions fault in on huge pages, and there is nothing to collapse")
	}
	const n = 8 * ChunkBytes
	dense, sparse, read := region(t, n), region(t, n), region(t, n)
	var sum byte
	for i := 0; i < n; i += pageBytes {
		dense[i] = 1
		if i/pageBytes%2 == 0 {
			sparse[i] = 1
		}
		sum += read[i]
	}
	if sum != 0 {
		t.Fatal("fresh anonymous memory is not zero")
	}
	rssRead := vmaField(t, read, "Rss:")
	c := collapser(t, Options{MapsPath: mapsOf(t, dense, sparse, read)})
	r := passUntilCollapsed(t, c)
	if want := (PassResult{Full: n / ChunkBytes, Collapsed: n / ChunkBytes}); r != want {
		t.Errorf("pass %+v, want %+v: only the dense region's chunks are full", r, want)
	}
	if got := vmaField(t, dense, "AnonHugePages:"); got != n {
		t.Errorf("dense region: %d bytes on huge pages, want %d", got, n)
	}
	for _, tc := range []struct {
		name     string
		b        []byte
		resident int
	}{{"half-written", sparse, n / pageBytes / 2}, {"read-only", read, -1}} {
		if got := vmaField(t, tc.b, "AnonHugePages:"); got != 0 {
			t.Errorf("%s region: %d bytes on huge pages, want 0", tc.name, got)
		}
		if tc.resident >= 0 {
			if got := residentPages(t, tc.b); got != tc.resident {
				t.Errorf("%s region: %d pages resident after the pass, want the %d it had", tc.name, got, tc.resident)
			}
		}
	}
	if got := vmaField(t, read, "Rss:"); got != rssRead {
		t.Errorf("read-only region: Rss %d after the pass, want the %d it had", got, rssRead)
	}
	for i := 0; i < n; i += pageBytes {
		if dense[i] != 1 {
			t.Fatalf("dense region's byte %d is %d after the collapse, want 1", i, dense[i])
		}
	}
	// Again: chunks already on huge pages cost the kernel a look, and
	// count as collapsed.
	if r2 := passUntilCollapsed(t, c); r2.Collapsed != n/ChunkBytes {
		t.Errorf("second pass %+v: want the %d chunks still collapsed", r2, n/ChunkBytes)
	}
	if passes, _ := c.Stats(); passes < 2 {
		t.Errorf("Stats: %d passes, want at least 2", passes)
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

// waitFor polls cond until it holds, failing after a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("still waiting for %s after a minute", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestLoopPassesAfterGrowthHeldStill drives the loop with its resident
// reading: the memory the process holds at start is a pass's work once it
// holds still; while it holds still no further pass runs; growth by
// MinGrowth that then holds still brings the next. Stop ends the loop.
func TestLoopPassesAfterGrowthHeldStill(t *testing.T) {
	if m := Mode("/sys/kernel/mm/transparent_hugepage/enabled"); m == "always" {
		t.Skip("THP mode always: fresh regions fault in on huge pages, and there is nothing to collapse")
	}
	const n = 4 * ChunkBytes
	b := region(t, n)
	for i := 0; i < n; i += pageBytes {
		b[i] = 1
	}
	var resident, reads atomic.Uint64
	resident.Store(64 << 20)
	c := collapser(t, Options{Interval: time.Millisecond, MinGrowth: 8 << 20, MapsPath: mapsOf(t, b),
		Resident: func() uint64 { reads.Add(1); return resident.Load() }})
	c.Start()
	defer c.Stop()
	passes := func() uint64 { p, _ := c.Stats(); return p }
	waitFor(t, "the first pass", func() bool { return passes() == 1 })
	if got := vmaField(t, b, "AnonHugePages:"); got != n {
		t.Errorf("after the first pass: %d bytes of the region on huge pages, want %d", got, n)
	}
	// Twenty ticks of memory holding still: no pass.
	from := reads.Load()
	waitFor(t, "twenty ticks", func() bool { return reads.Load() >= from+20 })
	if got := passes(); got != 1 {
		t.Fatalf("%d passes while memory held still, want 1", got)
	}
	// Growth short of MinGrowth: still none.
	resident.Add(4 << 20)
	from = reads.Load()
	waitFor(t, "twenty ticks", func() bool { return reads.Load() >= from+20 })
	if got := passes(); got != 1 {
		t.Fatalf("%d passes after 4 MiB of growth, want 1", got)
	}
	resident.Add(4 << 20)
	waitFor(t, "the pass after 8 MiB of growth", func() bool { return passes() == 2 })
	c.Stop()
	after := reads.Load()
	c.Stop() // idempotent
	if got := reads.Load(); got != after {
		t.Errorf("the loop read memory %d times after Stop returned", got-after)
	}
}

// TestNoLoopUnlessMadvise: in "always" the kernel does the work at fault
// time, in "never" the operator said no, and without THP there is nothing
// to ask; Start then starts no goroutine, and Stop returns at once, as it
// does without Start (and a Start after it starts nothing).
func TestNoLoopUnlessMadvise(t *testing.T) {
	for _, content := range []string{"[always] madvise never\n", "always madvise [never]\n", ""} {
		c := New(Options{Interval: time.Millisecond, ModePath: modeFile(t, content), Logger: zerolog.Nop()})
		if c.Wanted() {
			t.Errorf("mode %q: Wanted", c.Mode())
		}
		c.Start()
		if c.started.Load() {
			t.Errorf("mode %q: a loop started", c.Mode())
		}
		c.Stop()
	}
	c := New(Options{ModePath: modeFile(t, "always [madvise] never\n"), Logger: zerolog.Nop()})
	c.Stop()
	c.Start()
	if c.started.Load() {
		t.Error("Start after Stop started a loop")
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

func TestAnonResident(t *testing.T) {
	before := anonResident()
	b := region(t, 16<<20)
	for i := 0; i < len(b); i += pageBytes {
		b[i] = 1
	}
	if got := anonResident(); got < before+15<<20 {
		t.Errorf("anonResident %d after writing 16 MiB, want at least %d", got, before+15<<20)
	}
}

// TestLoopRefreshes: with memory holding still and no growth, a pass
// still runs once Refresh has passed since the last, for chunks the
// runtime split and filled again.
func TestLoopRefreshes(t *testing.T) {
	var resident atomic.Uint64
	c := collapser(t, Options{Interval: time.Millisecond, MinGrowth: 1 << 40, Refresh: 20 * time.Millisecond,
		MapsPath: mapsOf(t, region(t, ChunkBytes)), Resident: resident.Load})
	c.Start()
	defer c.Stop()
	waitFor(t, "two passes without growth", func() bool { p, _ := c.Stats(); return p >= 2 })
}

// TestWithoutCollapseSupport: on a kernel that does not know
// MADV_COLLAPSE a pass says so and does nothing, and Start starts no
// loop even in madvise mode.
func TestWithoutCollapseSupport(t *testing.T) {
	c := New(Options{ModePath: modeFile(t, "always [madvise] never\n"), Logger: zerolog.Nop()})
	c.supported = false
	if c.Wanted() {
		t.Error("Wanted without MADV_COLLAPSE")
	}
	if _, err := c.Pass(); !errors.Is(err, ErrUnsupported) {
		t.Errorf("Pass: %v, want ErrUnsupported", err)
	}
	c.Start()
	if c.started.Load() {
		t.Error("a loop started without MADV_COLLAPSE")
	}
	c.Stop()
	if passes, _ := c.Stats(); passes != 0 {
		t.Errorf("%d passes counted", passes)
	}
}
