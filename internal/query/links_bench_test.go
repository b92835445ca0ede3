package query

import (
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	"github.com/mooncake-conductor-go/conductor/internal/hashing"
)

// coldCorpus is issue 28's realistic index in process: 4 instances, prompts
// of 512 blocks of 16 tokens in 16 groups sharing their first 64 blocks,
// each prompt stored by one instance in events of 16 blocks, through the
// real vLLM decoder, with links on; the instances' event streams
// interleave.
type coldCorpus struct {
	r       *linkRig
	prompts [][]int32
	events  int
}

func newColdCorpus(b *testing.B, prompts, blocks, shared, groups int) *coldCorpus {
	const bs = 16
	r := newRig(b, hashing.AlgorithmSHA256CBOR, "", 4, bs, true)
	rng := rand.New(rand.NewPCG(1, 2))
	opening := make([][]int32, groups)
	for g := range opening {
		opening[g] = make([]int32, shared*bs)
		for i := range opening[g] {
			opening[g][i] = rng.Int32N(32000)
		}
	}
	c := &coldCorpus{r: r}
	// Each instance publishes its prompts' events in order, and the four
	// streams interleave, as four engines' do at the service's
	// subscriber.
	streams := make([][]store, 4)
	for p := range prompts {
		toks := make([]int32, blocks*bs)
		copy(toks, opening[p%groups])
		for i := shared * bs; i < len(toks); i++ {
			toks[i] = rng.Int32N(32000)
		}
		c.prompts = append(c.prompts, toks)
		keys, digs := r.chain(toks, "", -1)
		for from := 0; from < len(keys); from += 16 {
			to := min(from+16, len(keys))
			s := store{owner: p % 4, keys: keys[from:to], digests: digs[from:to], tokens: toks[from*bs : to*bs]}
			if from > 0 {
				s.parent = &keys[from-1]
			}
			streams[s.owner] = append(streams[s.owner], s)
			c.events++
		}
	}
	for i := 0; ; i++ {
		applied := false
		for _, st := range streams {
			if i < len(st) {
				r.apply(st[i])
				applied = true
			}
		}
		if !applied {
			return c
		}
	}
}

// BenchmarkColdLookup is a cold 8K- or 64K-token lookup (every prompt asked once,
// the prefix memo on as in the service) on that index, following links or
// hashing, against the bare chain of the same prompts.
func BenchmarkColdLookup(b *testing.B) {
	for _, size := range []struct {
		name                            string
		prompts, blocks, shared, groups int
	}{{"8k", 1000, 512, 64, 16}, {"64k", 96, 4096, 256, 4}} {
		b.Run(size.name, func(b *testing.B) {
			c := newColdCorpus(b, size.prompts, size.blocks, size.shared, size.groups)
			coldLookups(b, c)
		})
	}
}

func coldLookups(b *testing.B, c *coldCorpus) {
	for _, mode := range []string{"chain", "links", "hashing"} {
		b.Run(mode, func(b *testing.B) {
			// The service's caches: every prompt is new to the memo
			// (reset each round).
			e := New(Options{Contexts: c.r.on.opts.Contexts, Memo: hashing.NewMemo(64 << 20), Links: c.r.links})
			if mode == "hashing" {
				e.opts.Links = nil
			}
			res := &Result{}
			p := c.r.p
			// The service decodes a request's tokens just before its
			// lookup, so they are in the CPU's caches; a corpus of
			// prompts is not. Each lookup reads a fresh copy.
			toks := make([]int32, len(c.prompts[0]))
			b.ResetTimer()
			c0 := processCPU()
			defer func() {
				b.ReportMetric(float64((processCPU()-c0).Nanoseconds())/float64(b.N), "cpu-ns/op")
			}()
			for i := range b.N {
				copy(toks, c.prompts[i%len(c.prompts)])
				if mode == "chain" {
					ch := hashing.AcquireChain()
					ch.Reset(&p, 16, toks, "", "")
					for {
						if _, _, ok := ch.Next(); !ok {
							break
						}
					}
					hashing.ReleaseChain(ch)
					continue
				}
				if i%len(c.prompts) == 0 {
					e.opts.Memo.Reset()
				}
				if _, err := e.Lookup(&Request{Context: c.r.ctx, Tokens: toks}, res); err != nil {
					b.Fatal(err)
				}
				if len(res.Instances) == 0 {
					b.Fatal("no owner matched")
				}
			}
		})
	}
}

// BenchmarkIngestVerified is ingest through the vLLM decoder into the
// index, per block, with links verifying every new block or without: 256
// prompts of 512 blocks, 4 instances, events of 16 blocks chained by key.
func BenchmarkIngestVerified(b *testing.B) {
	for _, links := range []bool{false, true} {
		b.Run(fmt.Sprintf("links=%v", links), func(b *testing.B) {
			r := newRig(b, hashing.AlgorithmSHA256CBOR, "", 4, 16, links)
			rng := rand.New(rand.NewPCG(3, 4))
			var owners []int
			var payloads [][]byte
			for p := range 256 {
				toks := make([]int32, 512*16)
				for i := range toks {
					toks[i] = rng.Int32N(32000)
				}
				keys, digs := r.chain(toks, "", -1)
				for from := 0; from < len(keys); from += 16 {
					s := store{owner: p % 4, keys: keys[from : from+16], digests: digs[from : from+16], tokens: toks[from*16 : (from+16)*16]}
					if from > 0 {
						s.parent = &keys[from-1]
					}
					owners = append(owners, s.owner)
					payloads = append(payloads, r.encode(s))
				}
			}
			var blocks int
			var cpu time.Duration
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				r = newRig(b, hashing.AlgorithmSHA256CBOR, "", 4, 16, links)
				b.StartTimer()
				c0 := processCPU()
				for i, pl := range payloads {
					r.applyPayload(owners[i], pl)
				}
				cpu += processCPU() - c0
				blocks += len(payloads) * 16
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(blocks), "ns/block")
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(blocks), "cpu-ns/block")
		})
	}
}

// processCPU is the process's user and system CPU time so far: on a shared
// machine the wall clock also counts time other processes took.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
