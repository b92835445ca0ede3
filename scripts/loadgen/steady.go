package main

// Steady ingest (--steady-ingest N): while the query levels run, every
// publisher keeps storing new prompts, N a second each, as engines do
// while a router asks: one batch at a time at an even pace (an engine
// publishes the blocks each step stored, a few tens of milliseconds
// apart), the publishers' paces staggered, so the context changes
// continuously rather than in bursts with quiet time between. The new prompts share no block with the corpus
// (their tokens lie above its vocabulary), so every pool answer stays what
// the corpus alone gives and is still checked exactly, but every store
// changes the context, as continuous ingest does in production (what
// showed the former answer cache useless, docs/architecture.md). Their hashing and
// encoding run here, paced, on the load generator's CPU.

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mooncake-conductor-go/conductor/internal/hashing"
)

// steadyIngest publishes new prompts from every publisher until stop is
// called, which returns how many blocks were sent.
func (s *session) steadyIngest(ctx context.Context, prof *hashing.Profile, perSec float64) (stop func() int64) {
	if perSec <= 0 {
		return func() int64 { return 0 }
	}
	cfg := s.o.corpus
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var blocks atomic.Int64
	for i, p := range s.pubs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(cfg.Seed, uint64(i)+1<<32))
			enc := newEncoder()
			ch := hashing.AcquireChain()
			defer hashing.ReleaseChain(ch)
			perPrompt := (cfg.PromptTokens/cfg.BlockSize + s.o.batch - 1) / s.o.batch
			every := time.Duration(float64(time.Second) / (perSec * float64(perPrompt)))
			select {
			case <-ctx.Done():
				return
			case <-time.After(every * time.Duration(i) / time.Duration(len(s.pubs))):
			}
			tick := time.NewTicker(every)
			defer tick.Stop()
			tokens := make([]int32, cfg.PromptTokens)
			for {
				// Above the corpus's vocabulary and the probes' ids.
				for j := range tokens {
					tokens[j] = cfg.Vocab + 1<<16 + rng.Int32N(1<<20)
				}
				keys := chainKeys(ch, prof, cfg.BlockSize, tokens)
				for b := 0; b < len(keys); b += s.o.batch {
					select {
					case <-ctx.Done():
						return
					case <-tick.C:
					}
					end := min(b+s.o.batch, len(keys))
					var parent *uint64
					if b > 0 {
						parent = &keys[b-1]
					}
					msg, err := enc.storedPayload(s.o.engine, cfg.BlockSize, keys[b:end], parent, tokens[b*cfg.BlockSize:end*cfg.BlockSize])
					if err != nil || p.send(msg) != nil {
						return
					}
					blocks.Add(int64(end - b))
				}
			}
		}()
	}
	return func() int64 {
		cancel()
		wg.Wait()
		return blocks.Load()
	}
}
