package main

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat.
// The kernel fixes it at 100 for user space on every architecture Go runs
// Linux on, whatever CONFIG_HZ is.
const clockTicks = 100

// procCPU returns the CPU time (user plus system) process pid has used.
// It reads the process's CPU-time clock, which the scheduler keeps to the
// nanosecond for all its threads, dead ones included; utime and stime in
// /proc/<pid>/stat, the fallback, count whole ticks of 10 ms, too coarse
// for a pass of a hundred queries of a few hundred µs each (the figure
// could only move in steps of 10 ms over the pass).
func procCPU(pid int) (time.Duration, error) {
	if d, err := processClock(pid); err == nil {
		return d, nil
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStatCPU(b)
}

// processClock reads the CPU-time clock of process pid, the clock id
// clock_getcpuclockid(3) gives: the pid's complement shifted over the
// clock's type bits, CPUCLOCK_SCHED (2), with the per-thread bit clear.
func processClock(pid int) (time.Duration, error) {
	return clockTime(uintptr(int32((^pid)<<3 | 2)))
}

// clockThreadCPUTime is CLOCK_THREAD_CPUTIME_ID, the calling thread's
// CPU-time clock.
const clockThreadCPUTime = 3

// clockTime reads clock id with clock_gettime(2).
func clockTime(id uintptr) (time.Duration, error) {
	var ts syscall.Timespec
	if _, _, e := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, id, uintptr(unsafe.Pointer(&ts)), 0); e != 0 {
		return 0, e
	}
	return time.Duration(ts.Nano()), nil
}

// parseStatCPU reads utime and stime (fields 14 and 15) from a
// /proc/<pid>/stat line. The command name (field 2) is in parentheses and
// may contain spaces and parentheses, so fields are counted from the last
// ')'.
func parseStatCPU(b []byte) (time.Duration, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("stat: no command name")
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state), so field n is f[n-3].
	if len(f) < 13 {
		return 0, fmt.Errorf("stat: %d fields", len(f)+2)
	}
	utime, err1 := strconv.ParseUint(f[11], 10, 64)
	stime, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("stat: bad utime/stime %q %q", f[11], f[12])
	}
	return time.Duration(utime+stime) * time.Second / clockTicks, nil
}

// statFaults is what /proc/<pid>/stat says of a process's memory faults
// and its time in the kernel.
type statFaults struct {
	minor  uint64        // minor faults (field 10): first touches of anonymous pages, mostly
	system time.Duration // stime (field 15), in whole ticks
}

// procFaults reads process pid's minor faults and system time.
func procFaults(pid int) (statFaults, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return statFaults{}, err
	}
	return parseStatFaults(b)
}

// parseStatFaults reads minflt (field 10) and stime (field 15) from a
// /proc/<pid>/stat line, counting fields from the last ')' as
// parseStatCPU does.
func parseStatFaults(b []byte) (statFaults, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return statFaults{}, fmt.Errorf("stat: no command name")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return statFaults{}, fmt.Errorf("stat: %d fields", len(f)+2)
	}
	minor, err1 := strconv.ParseUint(f[7], 10, 64)
	stime, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return statFaults{}, fmt.Errorf("stat: bad minflt/stime %q %q", f[7], f[12])
	}
	return statFaults{minor: minor, system: time.Duration(stime) * time.Second / clockTicks}, nil
}

// procRSS returns process pid's resident set size in bytes.
func procRSS(pid int) (int64, error) { return procStatusKB(pid, "VmRSS:") }

// procPeakRSS returns process pid's peak resident set size (VmHWM) in
// bytes.
func procPeakRSS(pid int) (int64, error) { return procStatusKB(pid, "VmHWM:") }

// procAnonRSS returns the anonymous part of process pid's resident set in
// bytes: what the process allocated, without the pages of its binary and
// shared libraries that it has touched.
func procAnonRSS(pid int) (int64, error) { return procStatusKB(pid, "RssAnon:") }

// procAnonHuge returns how much of process pid's anonymous memory is on
// transparent huge pages (AnonHugePages of its smaps_rollup).
func procAnonHuge(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, err
	}
	return parseStatusKB(b, "AnonHugePages:")
}

// procStatusKB reads one "<key>   1234 kB" figure of /proc/<pid>/status.
func procStatusKB(pid int, key string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	return parseStatusKB(b, key)
}

// parseStatusKB returns the byte count of the "<key>   1234 kB" line of
// /proc/<pid>/status.
func parseStatusKB(b []byte, key string) (int64, error) {
	for _, line := range strings.Split(string(b), "\n") {
		rest, ok := strings.CutPrefix(line, key)
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("status: odd %s line %q", key, line)
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("status: %w", err)
		}
		return kb * 1024, nil
	}
	return 0, fmt.Errorf("status: no %s", key)
}

// loadAverage returns the 1-minute load average, or -1.
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return -1
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return -1
	}
	return v
}

// selfCPU returns the CPU time the load generator itself has used. On a
// small machine the client competes with the server for cores, and its
// share explains a throughput ceiling that is not the server's.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return -1
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
