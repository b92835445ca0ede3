// Command jitter measures how long this machine keeps busy threads off the
// CPU: each of --threads goroutines, locked to its own OS thread, spins on
// the clock for --duration and reports the longest gap between two
// consecutive readings. On a two-core machine, two spinning threads show
// the scheduling stalls any busy server thread suffers there, which bounds
// what a latency target can mean on it (BENCHMARKS.md, unregistration).
//
//	go run ./scripts/jitter --threads 2 --duration 5s
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"sync"
	"time"
)

func main() {
	threads := flag.Int("threads", 2, "spinning threads")
	duration := flag.Duration("duration", 5*time.Second, "how long each thread spins")
	flag.Parse()
	if *threads < 1 || *duration <= 0 || *duration > time.Hour {
		fmt.Fprintln(os.Stderr, "jitter: --threads must be positive and --duration in (0, 1h]")
		os.Exit(2)
	}
	worst := make([]time.Duration, *threads)
	over := make([]int, *threads)
	var wg sync.WaitGroup
	for i := range *threads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			end := time.Now().Add(*duration)
			last := time.Now()
			for last.Before(end) {
				now := time.Now()
				gap := now.Sub(last)
				worst[i] = max(worst[i], gap)
				if gap > time.Millisecond {
					over[i]++
				}
				last = now
			}
		}()
	}
	wg.Wait()
	for i := range worst {
		fmt.Printf("thread %d: longest gap %v, gaps over 1 ms: %d\n", i, worst[i].Round(time.Microsecond), over[i])
	}
}
