package index

import (
	"sync"
	"testing"
)

// TestCowMap: ensure creates a value once and keeps it, remove takes it
// out, and a version already loaded does not change under either.
func TestCowMap(t *testing.T) {
	var mu sync.Mutex
	var c cowMap[string, *int]
	if c.get("a") != nil || len(c.load()) != 0 {
		t.Fatal("the zero map is not empty")
	}
	created := 0
	mk := func() *int { created++; v := created; return &v }
	a := c.ensure(&mu, "a", mk)
	if again := c.ensure(&mu, "a", mk); again != a || created != 1 {
		t.Fatalf("ensure created %d values for one key", created)
	}
	before := c.load()
	b := c.ensure(&mu, "b", mk)
	if len(before) != 1 || c.get("b") != b {
		t.Fatalf("an earlier version changed (%d keys) or b is missing", len(before))
	}
	if got := c.remove(&mu, "a"); got != a {
		t.Fatalf("remove gave %v, want a's value", got)
	}
	if c.get("a") != nil || c.get("b") != b || len(c.load()) != 1 {
		t.Fatal("remove took the wrong key")
	}
	if got := c.remove(&mu, "a"); got != nil {
		t.Fatal("removing an absent key returned a value")
	}
}
