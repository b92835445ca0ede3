package regstore

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// FuzzDecode: any bytes read as a registration record either give a
// reason or registrations that encode back to the same set; never a panic.
func FuzzDecode(f *testing.F) {
	f.Add(Encode(services(f)))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		svcs, reason := Decode(data)
		if reason != "" {
			return
		}
		again, reason := Decode(Encode(svcs))
		if reason != "" {
			t.Fatalf("re-decode: %s", reason)
		}
		if diff := cmp.Diff(svcs, again, cmpServices, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("re-decode differs (-first +second):\n%s", diff)
		}
	})
}
