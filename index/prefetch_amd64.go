package index

// prefetch asks the CPU to start loading the cache line holding addr. An
// address outside the process's mappings is ignored by the hardware, so
// stale hints are harmless.
//
//go:noescape
func prefetch(addr uintptr)
