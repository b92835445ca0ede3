// Package hugepage has the kernel back the process's fully used anonymous
// memory with transparent huge pages, which hosts in THP's "madvise" mode
// (Debian's and Ubuntu's default) give only to memory that asks for them,
// and the Go runtime never asks (docs/architecture.md#huge-pages).
//
// Why: a cold query reads one index block per prompt block at a random
// place in a heap of a hundred MiB or more. On 4 KiB pages nearly every one
// of those reads also misses the TLB, and under a hypervisor's nested
// paging a TLB miss costs about as much as the read; on 2 MiB pages the
// whole index is a few dozen TLB entries.
//
// How: a pass reads /proc/self/maps and, in every private anonymous
// read-write mapping, asks madvise(MADV_COLLAPSE) (Linux 6.1) for each
// 2 MiB-aligned chunk whose 512 pages are all resident (mincore, a GiB
// per call) and, read again just before the chunk is asked for, present
// and the process's own (/proc/self/pagemap).
// Only such chunks: collapsing one with holes, or with pages that are the
// kernel's shared zero page (memory read but never written), would give
// it memory nobody uses, so RSS would grow; this is also why the heap is
// never marked MADV_HUGEPAGE, which would let khugepaged fill the holes
// the Go runtime leaves when it returns memory. Between the check and the
// collapse only microseconds pass, in which the runtime could return part
// of the chunk; that is the one way a pass can add to RSS, by at most the
// pages returned in that moment.
//
// Cost: a collapse copies its chunk under the process's mmap write lock,
// about 2.5 ms per chunk on the development VM, during which page faults
// in that mapping and mmap calls wait. A pass therefore pauses after each
// chunk that took real work, stops at the first chunk the kernel has no
// huge page for, and runs only after resident memory has grown and then
// held still (an ingest burst is over), plus once per Refresh for chunks
// the runtime has filled again since. A chunk already on a huge page costs
// the kernel a microsecond.
package hugepage

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/rs/zerolog"

	"github.com/mooncake-conductor-go/conductor/internal/procmem"
)

// ChunkBytes is the size of one huge page on x86-64 and of the chunks a
// pass collapses.
const ChunkBytes = 2 << 20

const (
	pageBytes     = 4096
	chunkPages    = ChunkBytes / pageBytes
	madvCollapse  = 25 // MADV_COLLAPSE, Linux 6.1
	pagePresent   = 1 << 63
	pageExclusive = 1 << 56 // mapped by this process only: not the zero page, not shared
)

// Options configure a Collapser; zero fields take the defaults.
type Options struct {
	// Interval is how often the collapser reads the process's resident
	// memory (default 500 ms): a pass starts at the first tick after it
	// grew by MinGrowth since the last pass and then held still for one
	// interval, or held still Refresh after the last pass.
	Interval time.Duration
	// MinGrowth is the growth worth a pass (default 8 MiB).
	MinGrowth uint64
	// Refresh is the longest time between passes while the process runs
	// (default 10 min): chunks the Go runtime split by returning part of
	// them and has filled again are collapsed again.
	Refresh time.Duration
	// Pause is how long a pass sleeps after a chunk the kernel had to copy
	// (default 1 ms), so that other threads' page faults and mappings do
	// not wait for a whole pass.
	Pause time.Duration
	// ModePath is the kernel's THP mode file (default
	// /sys/kernel/mm/transparent_hugepage/enabled); tests point it
	// elsewhere.
	ModePath string
	// MapsPath lists the mappings a pass looks at (default
	// /proc/self/maps); tests name only their own.
	MapsPath string
	// Resident reads the memory growth is measured on (default: the
	// process's resident set less its shared pages, from
	// /proc/self/statm); tests drive the loop with it.
	Resident func() uint64
	Logger   zerolog.Logger
}

func (o *Options) defaults() {
	if o.Interval <= 0 {
		o.Interval = 500 * time.Millisecond
	}
	if o.MinGrowth == 0 {
		o.MinGrowth = 8 << 20
	}
	if o.Refresh <= 0 {
		o.Refresh = 10 * time.Minute
	}
	if o.Pause <= 0 {
		o.Pause = time.Millisecond
	}
	if o.ModePath == "" {
		o.ModePath = "/sys/kernel/mm/transparent_hugepage/enabled"
	}
	if o.MapsPath == "" {
		o.MapsPath = "/proc/self/maps"
	}
	if o.Resident == nil {
		o.Resident = anonResident
	}
}

// Collapser runs passes in a goroutine of its own between Start and Stop.
// Safe for concurrent use.
type Collapser struct {
	opts      Options
	mode      string
	supported bool // the kernel knows MADV_COLLAPSE

	// passMu serializes passes (the loop's and Pass's callers'); buf is
	// one chunk's pagemap entries, vec mincore's answer for the window
	// [winLo, winHi), all under it.
	passMu       sync.Mutex
	buf          [chunkPages * 8]byte
	vec          []byte
	winLo, winHi uintptr

	passes, failed atomic.Uint64

	startOnce, stopOnce sync.Once
	started             atomic.Bool
	stop                chan struct{}
	done                chan struct{}
}

// Mode reads the kernel's THP mode ("always", "madvise" or "never"), ""
// when the file is missing (no THP support).
func Mode(path string) string {
	raw, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	// The file reads like "always [madvise] never": the bracketed word.
	s := string(raw)
	i, j := strings.IndexByte(s, '['), strings.IndexByte(s, ']')
	if i < 0 || j < i {
		return ""
	}
	return s[i+1 : j]
}

// New returns a collapser that has not started; Start runs it.
func New(opts Options) *Collapser {
	opts.defaults()
	return &Collapser{opts: opts, mode: Mode(opts.ModePath), supported: collapseKnown(),
		stop: make(chan struct{}), done: make(chan struct{})}
}

// collapseKnown asks the kernel whether it knows MADV_COLLAPSE: it checks
// the advice before it returns early for an empty range, so an empty
// range is a free probe (EINVAL before Linux 6.1, success after).
func collapseKnown() bool {
	_, _, e := syscall.Syscall(syscall.SYS_MADVISE, 0, 0, madvCollapse)
	return e == 0
}

// Wanted says whether passes would change anything: only in "madvise"
// mode, on a kernel that knows MADV_COLLAPSE. In "always" the kernel gives
// huge pages at fault time already, and "never" (or no THP) is the
// operator's, or the kernel's, choice.
func (c *Collapser) Wanted() bool { return c.mode == "madvise" && c.supported }

// Start runs the loop when Wanted, and does nothing otherwise. Only the
// first call counts; Stop ends the loop.
func (c *Collapser) Start() {
	c.startOnce.Do(func() {
		if !c.Wanted() {
			c.opts.Logger.Info().Str("thp_mode", c.mode).Bool("collapse_supported", c.supported).Msg("huge pages: nothing to do here")
			return
		}
		c.opts.Logger.Info().Str("thp_mode", c.mode).Msg("huge pages: collapsing fully used memory after it grows")
		c.started.Store(true)
		// From zero: what the process holds at start (a restored
		// snapshot) is the first pass's work.
		go c.loop(0)
	})
}

// Stop ends the loop, waiting for a pass under way to reach its next
// chunk. Idempotent, and a no-op without Start.
func (c *Collapser) Stop() {
	c.startOnce.Do(func() {}) // a Start after Stop starts nothing
	c.stopOnce.Do(func() { close(c.stop) })
	if c.started.Load() {
		<-c.done
	}
}

// loop runs passes; last is the resident memory at the last pass.
func (c *Collapser) loop(last uint64) {
	defer close(c.done)
	t := time.NewTicker(c.opts.Interval)
	defer t.Stop()
	tol := max(c.opts.MinGrowth/8, 1<<20)
	prev, lastAt := c.opts.Resident(), time.Now()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		now := c.opts.Resident()
		still := now <= prev+tol && prev <= now+tol
		grown := now >= last+c.opts.MinGrowth
		if still && (grown || time.Since(lastAt) >= c.opts.Refresh) {
			if _, err := c.Pass(); err != nil {
				// A missing /proc or a refused read is worth saying;
				// the next pass may do better.
				c.opts.Logger.Warn().Err(err).Msg("huge pages: pass failed")
			}
			last, lastAt = now, time.Now()
		}
		last = min(last, now) // memory handed back: growth counts from here
		prev = now
	}
}

// anonResident is the process's resident memory less its shared pages,
// 0 when unreadable.
func anonResident() uint64 {
	rss, shared, ok := procmem.Resident()
	if !ok || shared > rss {
		return 0
	}
	return uint64(rss - shared)
}

// PassResult is what one pass did.
type PassResult struct {
	// Full is how many chunks were fully present and the process's own,
	// Collapsed how many of them the kernel now backs with a huge page
	// (including those it already did), Failed how many it could not.
	Full, Collapsed, Failed int
	// OutOfHugePages says the pass stopped at a chunk the kernel had no
	// huge page for (ENOMEM).
	OutOfHugePages bool
}

// ErrUnsupported is Pass's error when the kernel does not know
// MADV_COLLAPSE (before Linux 6.1).
var ErrUnsupported = errors.New("the kernel does not support MADV_COLLAPSE")

// Pass collapses every fully used 2 MiB chunk of the process's private
// anonymous read-write mappings, stopping early when Stop is called or
// the kernel has no huge page left.
func (c *Collapser) Pass() (PassResult, error) {
	c.passMu.Lock()
	defer c.passMu.Unlock()
	var r PassResult
	if !c.supported {
		return r, ErrUnsupported
	}
	ranges, err := anonymousRanges(c.opts.MapsPath)
	if err != nil {
		return r, err
	}
	pm, err := os.Open("/proc/self/pagemap")
	if err != nil {
		return r, fmt.Errorf("huge pages: %w", err)
	}
	defer pm.Close()
	c.winLo, c.winHi = 0, 0
	defer func() {
		c.passes.Add(1)
		c.failed.Add(uint64(r.Failed))
		c.opts.Logger.Debug().Int("full_chunks", r.Full).Int("collapsed", r.Collapsed).Int("failed", r.Failed).
			Bool("out_of_huge_pages", r.OutOfHugePages).Msg("huge pages: pass")
	}()
	for _, m := range ranges {
		for addr := (m.lo + ChunkBytes - 1) &^ (ChunkBytes - 1); addr+ChunkBytes <= m.hi; addr += ChunkBytes {
			select {
			case <-c.stop:
				return r, nil
			default:
			}
			if !c.resident(addr, m.hi) || !c.fullyOwned(pm, addr) {
				continue
			}
			r.Full++
			t0 := time.Now()
			_, _, e := syscall.Syscall(syscall.SYS_MADVISE, addr, ChunkBytes, madvCollapse)
			took := time.Since(t0)
			switch e {
			case 0:
				r.Collapsed++
			case syscall.ENOMEM:
				// No huge page to be had: compaction is failing, and
				// every further chunk would only wait for it too.
				r.Failed++
				r.OutOfHugePages = true
				return r, nil
			default:
				// EAGAIN (pages briefly locked), EINVAL (a page the
				// kernel will not move, a mapping it will not
				// collapse): the next pass asks again.
				r.Failed++
			}
			if took > 100*time.Microsecond {
				time.Sleep(c.opts.Pause)
			}
		}
	}
	return r, nil
}

// window is how much address space one mincore call covers (its vector
// is a byte per page: 256 KiB), so a large mapping mostly unused, such as
// a reservation, costs a call per GiB rather than a read per chunk.
const window = 1 << 30

// resident says every page of the chunk at addr is in memory, from
// mincore over the window of the mapping (which ends at hi) that starts
// at addr; it reads a window only when addr leaves the last one. A first
// filter: fullyOwned, just before the collapse, has the last word.
func (c *Collapser) resident(addr, hi uintptr) bool {
	if addr < c.winLo || addr+ChunkBytes > c.winHi {
		end := min(addr+window, hi&^(ChunkBytes-1))
		pages := int((end - addr) / pageBytes)
		if cap(c.vec) < pages {
			c.vec = make([]byte, pages)
		}
		c.vec = c.vec[:pages]
		if _, _, e := syscall.Syscall(syscall.SYS_MINCORE, addr, end-addr, uintptr(unsafe.Pointer(&c.vec[0]))); e != 0 {
			c.winLo, c.winHi = 0, 0
			return false // unmapped since the maps were read
		}
		c.winLo, c.winHi = addr, end
	}
	off := int((addr - c.winLo) / pageBytes)
	for _, v := range c.vec[off : off+chunkPages] {
		if v&1 == 0 {
			return false
		}
	}
	return true
}

// fullyOwned says every page of the chunk at addr is present and the
// process's own (pagemap's present and exclusively-mapped bits, which
// unprivileged processes read too): no hole, no swapped page, no shared
// zero page.
func (c *Collapser) fullyOwned(pm *os.File, addr uintptr) bool {
	if _, err := pm.ReadAt(c.buf[:], int64(addr/pageBytes)*8); err != nil {
		return false
	}
	for i := 0; i < len(c.buf); i += 8 {
		if v := binary.LittleEndian.Uint64(c.buf[i:]); v&(pagePresent|pageExclusive) != pagePresent|pageExclusive {
			return false
		}
	}
	return true
}

type addrRange struct{ lo, hi uintptr }

// anonymousRanges lists the private anonymous read-write mappings of at
// least one chunk: the Go heap's arenas, the C heap's, and thread stacks
// (which are never fully used).
func anonymousRanges(path string) ([]addrRange, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("huge pages: %w", err)
	}
	defer f.Close()
	var out []addrRange
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if r, ok := parseMapsLine(sc.Bytes()); ok && r.hi-r.lo >= ChunkBytes {
			out = append(out, r)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("huge pages: reading %s: %w", path, err)
	}
	return out, nil
}

// parseMapsLine takes "lo-hi perms offset dev inode [name]" and keeps
// private read-write mappings of no file: inode 0 and no name, the brk
// heap's "[heap]", or a name the process gave (the Go runtime names its
// mappings "[anon: Go: heap]" and so on where the kernel keeps names).
func parseMapsLine(line []byte) (addrRange, bool) {
	f := bytes.Fields(line)
	if len(f) < 5 || string(f[1]) != "rw-p" || string(f[4]) != "0" {
		return addrRange{}, false
	}
	if len(f) > 5 && string(f[5]) != "[heap]" && !bytes.HasPrefix(f[5], []byte("[anon:")) {
		return addrRange{}, false
	}
	a, b, ok := bytes.Cut(f[0], []byte{'-'})
	if !ok {
		return addrRange{}, false
	}
	lo, err1 := strconv.ParseUint(string(a), 16, 64)
	hi, err2 := strconv.ParseUint(string(b), 16, 64)
	if err1 != nil || err2 != nil || hi <= lo {
		return addrRange{}, false
	}
	return addrRange{uintptr(lo), uintptr(hi)}, true
}

// Stats are the collapser's counters: passes run, and chunks the kernel
// could not put on a huge page when a pass asked.
func (c *Collapser) Stats() (passes, failed uint64) {
	return c.passes.Load(), c.failed.Load()
}

// Mode is the THP mode read at New.
func (c *Collapser) Mode() string { return c.mode }

// AnonHugeBytes reads how much of the process's anonymous memory is on
// huge pages now (AnonHugePages of /proc/self/smaps_rollup, which walks
// the page tables: about a millisecond per GiB), -1 when it cannot be
// read.
func AnonHugeBytes() int64 { return procmem.Rollup("AnonHugePages:") }
