package registry

import (
	"errors"
	"slices"
	"testing"
)

// TestEnginesFirst: engines before the rest, each kind in its given order,
// and the first error stops the walk.
func TestEnginesFirst(t *testing.T) {
	isEngine := func(s string) bool { return s[0] == 'e' }
	for _, tc := range []struct {
		name   string
		items  []string
		failAt string
		want   []string
	}{
		{"empty", nil, "", nil},
		{"mixed", []string{"m1", "e1", "m2", "e2", "e3"}, "", []string{"e1", "e2", "e3", "m1", "m2"}},
		{"only streams", []string{"m2", "m1"}, "", []string{"m2", "m1"}},
		{"stops at an engine's error", []string{"m1", "e1", "e2"}, "e1", []string{"e1"}},
		{"stops at a stream's error", []string{"m1", "e1", "m2"}, "m1", []string{"e1", "m1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			boom := errors.New("boom")
			err := EnginesFirst(tc.items, isEngine, func(s string) error {
				got = append(got, s)
				if s == tc.failAt {
					return boom
				}
				return nil
			})
			if !slices.Equal(got, tc.want) {
				t.Errorf("order %v, want %v", got, tc.want)
			}
			if (tc.failAt != "") != errors.Is(err, boom) {
				t.Errorf("error %v", err)
			}
		})
	}
}
