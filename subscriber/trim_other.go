//go:build !linux || !cgo

package subscriber

// TrimCHeap is a no-op where glibc's malloc_trim is unavailable.
func TrimCHeap() {}
