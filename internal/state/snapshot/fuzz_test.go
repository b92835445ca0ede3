package snapshot

import (
	"bytes"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/mooncake-conductor-go/conductor/index"
)

// FuzzRead: any bytes read as a snapshot either fail with a FormatError or
// decode to a snapshot that writes back to a file reading the same; never a
// panic, never a half-read result.
func FuzzRead(f *testing.F) {
	small := &Snapshot{Sources: []StreamPosition{{Key: "a|default|0", Type: "vLLM", Seq: 3, HasSeq: true}}, Contexts: []TableSection{{
		Owners: []index.Owner{{Instance: "a"}}, Entries: []byte{1, 0, 0, 0, 0, 0, 0, 0, 1, 1}, Blocks: 1, Pairs: 1}}}
	var seed bytes.Buffer
	if err := Write(&seed, small); err != nil {
		f.Fatal(err)
	}
	f.Add(seed.Bytes())
	f.Add(encode(f, sample(f))) // with producer-fed scopes and replicas
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Read(data)
		if err != nil {
			if s != nil {
				t.Fatalf("a result with the error %v", err)
			}
			return
		}
		var buf bytes.Buffer
		if err := Write(&buf, s); err != nil {
			t.Fatal(err)
		}
		again, err := Read(buf.Bytes())
		if err != nil {
			t.Fatalf("re-read: %v", err)
		}
		if diff := cmp.Diff(s, again, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("re-read differs (-first +second):\n%s", diff)
		}
	})
}
