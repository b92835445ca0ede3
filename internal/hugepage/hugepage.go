// Package hugepage has the kernel back the process's dense anonymous
// memory with transparent huge pages, which hosts in THP's "madvise" mode
// (Debian's and Ubuntu's default) give only to memory that asks for them,
// and the Go runtime never asks (docs/architecture.md#huge-pages).
//
// Why: a cold query reads one index block per prompt block at a random
// place in a heap of a hundred MiB or more. On 4 KiB pages nearly every one
// of those reads also misses the TLB, and under a hypervisor's nested
// paging a TLB miss costs about as much as the read; on 2 MiB pages the
// whole index is a few dozen TLB entries (BENCHMARKS.md#huge-pages).
//
// How: a pass reads /proc/self/maps and, in every private anonymous
// read-write mapping, asks madvise(MADV_COLLAPSE) (Linux 6.1) for each
// 2 MiB-aligned chunk whose 512 pages are all resident (mincore). Only
// full chunks: collapsing a partly resident one would fill its holes, and
// RSS would grow by memory nobody uses, which is why the whole heap is
// not simply marked MADV_HUGEPAGE (khugepaged would refill what the Go
// runtime returns to the system). A chunk already on a huge page costs the
// kernel a page-table check; the Go runtime returning part of one to the
// system splits it, and a later pass collapses it again once it is full.
// Passes run after the process's memory has grown and then held still for
// an interval, so they follow an ingest burst rather than race it.
package hugepage

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/rs/zerolog"
)

// ChunkBytes is the size of one huge page on x86-64 and of the chunks a
// pass collapses.
const ChunkBytes = 2 << 20

const (
	pageBytes    = 4096
	madvCollapse = 25 // MADV_COLLAPSE, Linux 6.1
)

// Options configure a Collapser; zero fields take the defaults.
type Options struct {
	// Interval is how often the collapser reads how much memory the Go
	// runtime holds (default 500 ms): a pass starts at the first tick
	// after that grew by MinGrowth and then held still for one interval.
	Interval time.Duration
	// MinGrowth is the growth worth a pass (default 8 MiB).
	MinGrowth uint64
	// ModePath is the kernel's THP mode file (default
	// /sys/kernel/mm/transparent_hugepage/enabled); tests point it
	// elsewhere.
	ModePath string
	// MapsPath is the process's mappings (default /proc/self/maps).
	MapsPath string
	Logger   zerolog.Logger
}

func (o *Options) defaults() {
	if o.Interval <= 0 {
		o.Interval = 500 * time.Millisecond
	}
	if o.MinGrowth == 0 {
		o.MinGrowth = 8 << 20
	}
	if o.ModePath == "" {
		o.ModePath = "/sys/kernel/mm/transparent_hugepage/enabled"
	}
	if o.MapsPath == "" {
		o.MapsPath = "/proc/self/maps"
	}
}

// Collapser runs passes in a goroutine of its own until Stop. Safe for
// concurrent use.
type Collapser struct {
	opts Options
	mode string

	// passMu serializes passes (the loop's and Pass's callers').
	passMu sync.Mutex
	// vec is mincore's residency vector, reused across passes (under
	// passMu).
	vec []byte

	passes, failed atomic.Uint64
	everCollapsed  atomic.Bool // some chunk was collapsed: the kernel knows the advice
	unsupported    atomic.Bool // the kernel refused MADV_COLLAPSE itself

	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
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
	return &Collapser{opts: opts, mode: Mode(opts.ModePath), stop: make(chan struct{}), done: make(chan struct{})}
}

// Wanted says whether passes would change anything: only in "madvise"
// mode. In "always" the kernel gives huge pages at fault time already,
// and "never" (or no THP) is the operator's, or the kernel's, choice.
func (c *Collapser) Wanted() bool { return c.mode == "madvise" }

// Start runs the loop when Wanted, and does nothing otherwise; Stop ends
// it either way.
func (c *Collapser) Start() {
	if !c.Wanted() {
		close(c.done)
		c.opts.Logger.Info().Str("thp_mode", c.mode).Msg("huge pages: nothing to do in this THP mode")
		return
	}
	c.opts.Logger.Info().Str("thp_mode", c.mode).Msg("huge pages: collapsing dense memory after it grows")
	go c.loop(retained())
}

// Stop ends the loop, waiting for a pass under way to reach its next
// chunk. Idempotent.
func (c *Collapser) Stop() {
	c.stopOnce.Do(func() { close(c.stop) })
	<-c.done
}

// loop runs passes; last is what the runtime held at Start, and then at
// the last pass.
func (c *Collapser) loop(last uint64) {
	defer close(c.done)
	t := time.NewTicker(c.opts.Interval)
	defer t.Stop()
	prev := last
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		now := retained()
		if now+c.opts.MinGrowth/8 > prev && now < prev+c.opts.MinGrowth/8 && now >= last+c.opts.MinGrowth {
			if _, err := c.Pass(); err != nil {
				c.opts.Logger.Info().Err(err).Msg("huge pages: stopping")
				return
			}
			last = now
		}
		last = min(last, now) // memory handed back: growth counts from here
		prev = now
	}
}

// retained is the memory the Go runtime holds from the system and has not
// handed back.
func retained() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64() - s[1].Value.Uint64()
}

// PassResult is what one pass did.
type PassResult struct {
	// Dense is how many chunks were fully resident, Collapsed how many of
	// them the kernel now backs with a huge page (including those it
	// already did), Failed how many it could not (no free huge page, a
	// page the kernel would not move).
	Dense, Collapsed, Failed int
}

// ErrUnsupported is Pass's error when the kernel does not know
// MADV_COLLAPSE (before Linux 6.1).
var ErrUnsupported = errors.New("the kernel does not support MADV_COLLAPSE")

// Pass collapses every fully resident 2 MiB chunk of the process's private
// anonymous read-write mappings, stopping early when Stop is called.
func (c *Collapser) Pass() (PassResult, error) {
	c.passMu.Lock()
	defer c.passMu.Unlock()
	var r PassResult
	if c.unsupported.Load() {
		return r, ErrUnsupported
	}
	ranges, err := anonymousRanges(c.opts.MapsPath)
	if err != nil {
		return r, err
	}
	for _, m := range ranges {
		lo := (m.lo + ChunkBytes - 1) &^ (ChunkBytes - 1)
		hi := m.hi &^ (ChunkBytes - 1)
		if hi <= lo {
			continue
		}
		pages := int((hi - lo) / pageBytes)
		if cap(c.vec) < pages {
			c.vec = make([]byte, pages)
		}
		vec := c.vec[:pages]
		if _, _, e := syscall.Syscall(syscall.SYS_MINCORE, lo, hi-lo, uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
			continue // unmapped since the maps were read
		}
		for off := 0; off < pages; off += ChunkBytes / pageBytes {
			if !resident(vec[off : off+ChunkBytes/pageBytes]) {
				continue
			}
			select {
			case <-c.stop:
				return r, nil
			default:
			}
			r.Dense++
			addr := lo + uintptr(off)*pageBytes
			switch _, _, e := syscall.Syscall(syscall.SYS_MADVISE, addr, ChunkBytes, madvCollapse); e {
			case 0:
				r.Collapsed++
			case syscall.EINVAL:
				// Also what an old kernel says of the advice itself;
				// a chunk of a mapping it cannot collapse (none of
				// the private anonymous ones) would say it too, so
				// only a refusal of the first dense chunk ends the
				// passes.
				if r.Collapsed == 0 && r.Failed == 0 && !c.everCollapsed.Load() {
					c.unsupported.Store(true)
					return r, ErrUnsupported
				}
				r.Failed++
			default: // EAGAIN, ENOMEM, EBUSY: try again next pass
				r.Failed++
			}
		}
	}
	c.passes.Add(1)
	c.failed.Add(uint64(r.Failed))
	if r.Collapsed > 0 {
		c.everCollapsed.Store(true)
	}
	c.opts.Logger.Debug().Int("dense_chunks", r.Dense).Int("collapsed", r.Collapsed).Int("failed", r.Failed).Msg("huge pages: pass")
	return r, nil
}

// resident says every page of a chunk is in memory (mincore's low bit).
func resident(vec []byte) bool {
	for _, v := range vec {
		if v&1 == 0 {
			return false
		}
	}
	return true
}

type addrRange struct{ lo, hi uintptr }

// anonymousRanges lists the private anonymous read-write mappings of at
// least one chunk: the Go heap's arenas, the C heap's, and thread stacks
// (which are never dense enough to collapse).
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

// parseMapsLine takes "lo-hi perms offset dev inode [path]" and keeps
// private read-write mappings of no file (inode 0, and no path or the
// brk heap's "[heap]").
func parseMapsLine(line []byte) (addrRange, bool) {
	f := bytes.Fields(line)
	if len(f) < 5 || string(f[1]) != "rw-p" || string(f[4]) != "0" {
		return addrRange{}, false
	}
	if len(f) > 5 && string(f[5]) != "[heap]" {
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

// Stats are the collapser's counters: passes run, and dense chunks the
// kernel could not put on a huge page when a pass asked.
func (c *Collapser) Stats() (passes, failed uint64) {
	return c.passes.Load(), c.failed.Load()
}

// Mode is the THP mode read at New.
func (c *Collapser) Mode() string { return c.mode }

// AnonHugeBytes reads how much of the process's anonymous memory is on
// huge pages now (AnonHugePages of /proc/self/smaps_rollup), -1 when it
// cannot be read.
func AnonHugeBytes() int64 {
	raw, err := os.ReadFile("/proc/self/smaps_rollup")
	if err != nil {
		return -1
	}
	return smapsField(raw, "AnonHugePages:")
}

// smapsField reads a "Name:   N kB" line of an smaps file, in bytes; -1
// when it is missing.
func smapsField(raw []byte, name string) int64 {
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
