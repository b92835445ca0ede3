package main

import (
	"testing"

	"github.com/mooncake-conductor-go/conductor/internal/membudget"
)

// TestBudgetedSources: under a bounded budget each subscriber's
// verification backlog is an eighth of the links' part (the receive path
// is the receive part's, subscriber.Resources); unbounded, the subscribers
// keep their defaults.
func TestBudgetedSources(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    membudget.Budget
		want sourceLimits
	}{
		{"unbounded", membudget.Split(0, 0, "", nil), sourceLimits{}},
		{"256 MiB limit", membudget.Split(192<<20, 256<<20, "GOMEMLIMIT", nil), sourceLimits{linkDefer: 3 << 20}},
		{"links overridden", membudget.Split(192<<20, 0, "--memory-mib", map[membudget.Part]int64{membudget.Links: 64 << 20}), sourceLimits{linkDefer: 8 << 20}},
	} {
		if got := budgetedSources(tc.b); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}
