package durable

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/rs/zerolog"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/contexts"
	"github.com/mooncake-conductor-go/conductor/registry"
)

// BenchmarkPeerBootstrap2M times a replica's warm start from a peer whose
// index holds 2 M (block, owner) entries (8 engines of 250 k blocks): the
// peer cuts and streams its snapshot over loopback HTTP, the new replica
// reads and checks it whole, registers the services and restores their
// entries. What follows is the catch-up of each source from the
// snapshot's sequence numbers, as after a restart.
func BenchmarkPeerBootstrap2M(b *testing.B) {
	const engines, perEngine = 8, 250_000
	peer := mustOpen(b, "")
	svcs := make([]registry.Service, engines)
	for e := range svcs {
		svcs[e] = service(b, "e", e, "tcp://h:"+string(rune('a'+e)))
		if _, err := peer.reg.Register(svcs[e]); err != nil {
			b.Fatal(err)
		}
		keys := make([]uint64, perEngine)
		for i := range keys {
			keys[i] = uint64(e)<<32 | uint64(i+1)
		}
		peer.apply(svcs[e].Key(), 7, keys...)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		if err := peer.st.WriteSnapshot(rw); err != nil {
			b.Error(err)
		}
	}))
	defer srv.Close()
	b.ResetTimer()
	for b.Loop() {
		st, err := Open(Options{Peers: []string{srv.URL}, Logger: zerolog.Nop()})
		if err != nil {
			b.Fatal(err)
		}
		ix := index.New(index.Options{})
		cat := contexts.New(ix)
		reg := registry.New(registry.Options{Contexts: cat, Start: func(svc registry.Service, owner index.OwnerID) (registry.Source, error) {
			st.Resume(svc, cat.Get(svc.Context()).Table, owner)
			return &fakeSource{}, nil
		}})
		for _, s := range svcs {
			if _, err := reg.Register(s); err != nil {
				b.Fatal(err)
			}
		}
		st.Start(reg, ix, nil)
		b.StopTimer()
		if got := st.stats.restoredPairs.Load(); got != engines*perEngine {
			b.Fatalf("restored %d entries", got)
		}
		st.Close()
		reg.Close()
		ix.Close()
		b.StartTimer()
	}
}
