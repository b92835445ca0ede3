// Command pagefault measures what this machine charges for the first touch
// of fresh anonymous memory, the cost every byte the server grows by pays
// once: it maps --mib of memory, writes one byte per 4 KiB page, unmaps it,
// and reports, per page, the wall time and the thread's user and system
// CPU, over --rounds rounds (each row one round; the median last). With
// --huge it first asks for transparent huge pages on the mapping
// (MADV_HUGEPAGE), to compare.
//
// On a virtual machine whose host backs guest memory lazily, a fault costs
// the guest kernel's work (system time) and the host's (which the guest
// sees as time in the faulting instruction, user time). The load
// generator reports the server's faults per ingested block; their product
// with this figure is the machine's part of ingest's CPU (BENCHMARKS.md).
//
//	go run ./scripts/pagefault --mib 256 --rounds 5
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"syscall"
	"time"
)

// madvHugePage is MADV_HUGEPAGE from <linux/mman.h>.
const madvHugePage = 14

const pageBytes = 4096

func main() {
	mib := flag.Int("mib", 256, "memory mapped and touched per round")
	rounds := flag.Int("rounds", 5, "rounds")
	huge := flag.Bool("huge", false, "ask for transparent huge pages (MADV_HUGEPAGE) before touching")
	flag.Parse()
	if *mib < 1 || *mib > 16<<10 || *rounds < 1 || *rounds > 1000 {
		fmt.Fprintln(os.Stderr, "pagefault: --mib must be in [1, 16384] and --rounds in [1, 1000]")
		os.Exit(2)
	}
	runtime.LockOSThread() // RUSAGE_THREAD is this thread's
	size := *mib << 20
	var walls []float64
	for r := range *rounds {
		m, err := touch(size, *huge)
		if err != nil {
			fmt.Fprintln(os.Stderr, "pagefault:", err)
			os.Exit(1)
		}
		pages := float64(size / pageBytes)
		wall := float64(m.wall.Nanoseconds()) / 1e3 / pages
		walls = append(walls, wall)
		fmt.Printf("round %d: %d pages, %d faults, per page: %.2f µs wall, %.2f µs user, %.2f µs system\n",
			r+1, size/pageBytes, m.faults, wall, float64(m.user.Nanoseconds())/1e3/pages, float64(m.system.Nanoseconds())/1e3/pages)
	}
	slices.Sort(walls)
	fmt.Printf("median: %.2f µs per 4 KiB page first touched (huge pages asked: %v)\n", walls[len(walls)/2], *huge)
}

type measure struct {
	wall, user, system time.Duration
	faults             int64
}

// touch maps size bytes, writes a byte to each page and unmaps them.
func touch(size int, huge bool) (measure, error) {
	b, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return measure{}, fmt.Errorf("mmap %d bytes: %w", size, err)
	}
	defer syscall.Munmap(b)
	if huge {
		if err := syscall.Madvise(b, madvHugePage); err != nil {
			return measure{}, fmt.Errorf("madvise(MADV_HUGEPAGE): %w", err)
		}
	}
	var r0, r1 syscall.Rusage
	if err := syscall.Getrusage(1, &r0); err != nil { // RUSAGE_THREAD
		return measure{}, fmt.Errorf("getrusage: %w", err)
	}
	start := time.Now()
	for i := 0; i < size; i += pageBytes {
		b[i] = 1
	}
	wall := time.Since(start)
	if err := syscall.Getrusage(1, &r1); err != nil {
		return measure{}, fmt.Errorf("getrusage: %w", err)
	}
	return measure{
		wall:   wall,
		user:   time.Duration(r1.Utime.Nano() - r0.Utime.Nano()),
		system: time.Duration(r1.Stime.Nano() - r0.Stime.Nano()),
		faults: r1.Minflt - r0.Minflt,
	}, nil
}
