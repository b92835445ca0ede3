//go:build !amd64

package index

// prefetch is a no-op where no assembly hint is provided.
func prefetch(addr uintptr) {}
