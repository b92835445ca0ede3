//go:build linux && cgo

package zmqx

// #include <malloc.h>
import "C"

// TrimCHeap returns free memory in the C heap to the OS. libzmq buffers
// received messages there (up to the high-water mark per source), and
// glibc keeps freed arenas after a burst; the service calls this after it
// drops a context so that RSS falls back instead of staying at the peak.
func TrimCHeap() { C.malloc_trim(0) }
