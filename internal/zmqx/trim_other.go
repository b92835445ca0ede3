//go:build !linux || !cgo

package zmqx

// TrimCHeap is a no-op where glibc's malloc_trim is unavailable.
func TrimCHeap() {}
