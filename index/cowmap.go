package index

import (
	"maps"
	"sync"
	"sync/atomic"
)

// cowMap is a copy-on-write map: readers load the current version without
// a lock (every query and every event looks a table up), writers, rare
// (contexts and scopes come and go on registration), build the next
// version under the writers' lock and publish it whole. The zero cowMap is
// empty and ready.
type cowMap[K comparable, V comparable] struct {
	p atomic.Pointer[map[K]V]
}

// load is the current version; it must not be modified.
func (c *cowMap[K, V]) load() map[K]V {
	if m := c.p.Load(); m != nil {
		return *m
	}
	return nil
}

// get is k's value in the current version (the zero V when absent).
func (c *cowMap[K, V]) get(k K) V { return c.load()[k] }

// ensure returns k's value, publishing create's under mu when k is absent;
// create runs at most once per call, under mu.
func (c *cowMap[K, V]) ensure(mu *sync.Mutex, k K, create func() V) V {
	var zero V
	if v := c.get(k); v != zero {
		return v
	}
	mu.Lock()
	defer mu.Unlock()
	old := c.load()
	if v := old[k]; v != zero {
		return v
	}
	v := create()
	m := make(map[K]V, len(old)+1)
	maps.Copy(m, old)
	m[k] = v
	c.p.Store(&m)
	return v
}

// remove publishes a version without k, under mu, and returns what k
// held (the zero V when it was absent, and nothing is published).
func (c *cowMap[K, V]) remove(mu *sync.Mutex, k K) V {
	mu.Lock()
	defer mu.Unlock()
	old := c.load()
	v, ok := old[k]
	if !ok {
		return v
	}
	m := maps.Clone(old)
	delete(m, k)
	c.p.Store(&m)
	return v
}
