package subscriber

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/events"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/hashing/hashcheck"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
	"github.com/rs/zerolog"
)

// benchBlocks is the number of blocks per BlockStored batch in the
// benchmarks; benchBlockSize tokens per block (vLLM's default page).
const (
	benchBlocks    = 16
	benchBlockSize = 16
)

// vllmBatchTemplate hand-encodes [ts, [BlockStored{16 hashes, 256 tokens}],
// 0] exactly as vLLM lays it out, with every hash as a 9-byte uint64 so the
// hashes can be patched in place; it returns the payload and the offsets of
// the hash values.
func vllmBatchTemplate() ([]byte, []int) { return vllmBatchTemplateOf(false) }

// vllmBatchTemplateOf is vllmBatchTemplate's batch with its event as a map
// or, arrays set, as the array a vLLM release before v0.26.0 sends (the same
// fields in declaration order, docs/engines.md#event-layouts).
func vllmBatchTemplateOf(arrays bool) ([]byte, []int) {
	var b []byte
	str := func(s string) {
		if len(s) < 32 {
			b = append(b, 0xa0|byte(len(s)))
		} else {
			b = append(b, 0xd9, byte(len(s)))
		}
		b = append(b, s...)
	}
	key := func(s string) {
		if !arrays {
			str(s)
		}
	}
	b = append(b, 0x93, 0xcb)
	b = binary.BigEndian.AppendUint64(b, math.Float64bits(1789095808.5))
	if arrays {
		b = append(b, 0x91, 0x9b)
	} else {
		b = append(b, 0x91, 0x8b)
	}
	key("type")
	str("BlockStored")
	key("block_hashes")
	b = append(b, 0xdc, 0, benchBlocks)
	var offs []int
	for range benchBlocks {
		b = append(b, 0xcf)
		offs = append(offs, len(b))
		b = append(b, 0, 0, 0, 0, 0, 0, 0, 0)
	}
	key("parent_block_hash")
	b = append(b, 0xc0)
	key("token_ids")
	n := benchBlocks * benchBlockSize
	b = append(b, 0xdc, byte(n>>8), byte(n))
	for i := range n {
		tok := 1000 + i*97
		b = append(b, 0xcd, byte(tok>>8), byte(tok))
	}
	key("block_size")
	b = append(b, benchBlockSize)
	key("lora_id")
	b = append(b, 0xc0)
	key("medium")
	str("GPU")
	key("lora_name")
	b = append(b, 0xc0)
	key("extra_keys")
	b = append(b, 0xdc, 0, benchBlocks)
	for range benchBlocks {
		b = append(b, 0xc0)
	}
	key("group_idx")
	b = append(b, 0)
	key("kv_cache_spec_kind")
	str("full_attention")
	b = append(b, 0)
	return b, offs
}

func patchHashes(p []byte, offs []int, seq uint64) {
	for i, o := range offs {
		// spread keys over the whole range like real digests
		binary.BigEndian.PutUint64(p[o:], (seq*benchBlocks+uint64(i)+1)*0x9e3779b97f4a7c15)
	}
}

// benchChecker is the hash checker a service gets in production (default
// sampling), so the benchmarks include the check's cost. The benchmark
// hashes are not real digests: every sampled chain start mismatches, which
// costs what a match does (one block hashed) and warns once, to nobody.
func benchChecker(key string, p *hashing.Profile) *hashcheck.Checker {
	return hashcheck.NewSet(hashcheck.Options{Logger: zerolog.Nop()}).Add(key, p, benchBlockSize, "")
}

type nopSink struct{}

func (nopSink) Store(index.OwnerID, index.Put) (uint32, bool) { return 0, true }
func (nopSink) Remove(index.OwnerID, index.Put) bool          { return true }
func (nopSink) ClearOwner(index.OwnerID, index.TierMask)      {}

// BenchmarkDecodeVLLMBatch measures decoding and dispatch of one 16-block
// BlockStored batch, without sockets; it must not allocate.
func BenchmarkDecodeVLLMBatch(b *testing.B) {
	m := eventtest.LoadManifest(b)
	e := newEnv(b, m, "vllm-a", nil, "inproc://unused", "")
	e.cfg.Index.Context.BlockSize = benchBlockSize
	e.cfg.Index.Engine = nopSink{}
	e.cfg.test.onEvent, e.cfg.test.onApply, e.cfg.Resources = nil, nil, NewResources(ResourcesOptions{})
	e.cfg.Verify.HashCheck = benchChecker(e.cfg.Source.Key, &e.cfg.Index.Profile)
	s, err := newSubscriber(e.cfg)
	if err != nil {
		b.Fatal(err)
	}
	p, offs := vllmBatchTemplate()
	b.SetBytes(int64(len(p)))
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := processCPU()
	for i := range b.N {
		patchHashes(p, offs, uint64(i))
		s.applyBatch(uint64(i), p)
	}
	cpu := processCPU() - cpu0
	b.StopTimer()
	if got := e.cfg.Resources.Counters().Value(MetricApplied, sourcetype.VLLM, events.ReasonNone); got != uint64(b.N) {
		b.Fatalf("applied %d of %d", got, b.N)
	}
	b.ReportMetric(float64(b.N*benchBlocks)/b.Elapsed().Seconds(), "blocks/s")
	// CPU time, unlike wall time, is not inflated by other load on the host.
	b.ReportMetric(float64(b.N*benchBlocks)/cpu.Seconds(), "blocks/cpu-s")
}

// BenchmarkIngestVLLM measures end-to-end ingestion: a local PUB sends
// 16-block BlockStored batches at full speed over loopback TCP and the
// subscriber decodes them and stores every block in a real index table.
// The figure of merit is blocks/s.
func BenchmarkIngestVLLM(b *testing.B) {
	for _, sinkName := range []string{"index", "nop"} {
		b.Run(sinkName, func(b *testing.B) { benchIngest(b, sinkName) })
	}
}

func benchIngest(b *testing.B, sinkName string) {
	m := eventtest.LoadManifest(b)
	reg := m.Registration(b, "vllm-a")
	reg.BlockSize = benchBlockSize
	prof := eventtest.ResolveProfile(b, reg)
	ctx := eventtest.ContextOf(reg)
	var sink events.EngineSink = nopSink{}
	var owner index.OwnerID
	if sinkName == "index" {
		tb := index.New(index.Options{}).EnsureTable(ctx)
		owner = tb.AddEngineOwner("bench", 0)
		sink = tb
	}
	pub := newPublisher(b, "tcp://127.0.0.1:*")
	counters := NewCounters()
	s, err := Start(Config{
		Source:    SourceConfig{Key: "bench|default|0", Type: sourcetype.VLLM, Endpoint: pub.endpoint},
		Index:     IndexConfig{Context: ctx, Profile: prof, Engine: sink, Owner: owner},
		Verify:    VerifyConfig{HashCheck: benchChecker("bench|default|0", &prof)},
		Report:    ReportConfig{Logger: eventtest.Logger(b)},
		Resources: NewResources(ResourcesOptions{Counters: counters}),
	})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Stop()
	pub.waitSubscribed()
	p, offs := vllmBatchTemplate()
	seqb := make([]byte, 8)
	topic := []byte{}
	b.SetBytes(int64(len(p)))
	b.ResetTimer()
	cpu0 := processCPU()
	start := time.Now()
	for i := range b.N {
		patchHashes(p, offs, uint64(i))
		binary.BigEndian.PutUint64(seqb, uint64(i))
		pub.sendFrames(topic, seqb, p)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		if last, ok := s.LastSeq(); ok && last == uint64(b.N-1) {
			break
		}
		if s.Stale() || time.Now().After(deadline) {
			b.Fatalf("ingest did not finish: state %v, counters %v", s.State(), counters.Snapshot())
		}
		time.Sleep(50 * time.Microsecond)
	}
	el := time.Since(start)
	cpu := processCPU() - cpu0
	b.StopTimer()
	if got := counters.Value(MetricApplied, sourcetype.VLLM, events.ReasonNone); got != uint64(b.N) {
		b.Fatalf("applied %d events of %d", got, b.N)
	}
	b.ReportMetric(float64(b.N*benchBlocks)/el.Seconds(), "blocks/s")
	// Process CPU includes the publisher and libzmq's I/O threads, so this
	// is a conservative per-core figure that load on the host cannot inflate.
	b.ReportMetric(float64(b.N*benchBlocks)/cpu.Seconds(), "blocks/cpu-s")
}

// processCPU is the user+system CPU time consumed by the process so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkIngestVLLMLinks is BenchmarkIngestVLLM/index with verified
// links: real sha256_cbor chains (prompts of 512 blocks, events of 16
// chained by key), so that every block is verified. It reports the rate
// until the last batch is applied (visible) and until every block is
// verified, with process CPU for each; defer=false verifies each event as
// it is applied. Run it with -benchtime Nx, N at most linkBenchMessages.
func BenchmarkIngestVLLMLinks(b *testing.B) {
	for _, deferred := range []bool{false, true} {
		b.Run(fmt.Sprintf("defer=%v", deferred), func(b *testing.B) { benchIngestLinks(b, deferred) })
	}
}

const linkBenchMessages = 16384

var linkBenchCorpus struct {
	once     sync.Once
	payloads [][]byte
}

func linkBenchPayloads(b *testing.B, prof *hashing.Profile) [][]byte {
	c := &linkBenchCorpus
	c.once.Do(func() {
		rng := rand.New(rand.NewPCG(5, 6))
		const prompt = 512
		toks := make([]int32, prompt*benchBlockSize)
		for len(c.payloads) < linkBenchMessages {
			for i := range toks {
				toks[i] = rng.Int32N(32000)
			}
			keys := eventtest.ChainKeys(prof, benchBlockSize, toks)
			for from := 0; from < len(keys); from += benchBlocks {
				var parent any
				if from > 0 {
					parent = keys[from-1]
				}
				ev := map[string]any{"type": "BlockStored", "block_hashes": keys[from : from+benchBlocks], "parent_block_hash": parent,
					"token_ids": toks[from*benchBlockSize : (from+benchBlocks)*benchBlockSize], "block_size": benchBlockSize,
					"lora_id": nil, "medium": "GPU", "lora_name": nil}
				p, err := msgpack.Marshal([]any{1789095808.5, []any{ev}, 0})
				if err != nil {
					b.Fatal(err)
				}
				c.payloads = append(c.payloads, p)
			}
		}
	})
	return c.payloads
}

func benchIngestLinks(b *testing.B, deferred bool) {
	if b.N > linkBenchMessages {
		b.Skipf("-benchtime %dx: at most %d messages", b.N, linkBenchMessages)
	}
	m := eventtest.LoadManifest(b)
	reg := m.Registration(b, "vllm-a")
	reg.BlockSize = benchBlockSize
	prof := eventtest.ResolveProfile(b, reg)
	ctx := eventtest.ContextOf(reg)
	payloads := linkBenchPayloads(b, &prof)[:b.N]
	tb := index.New(index.Options{}).EnsureTable(ctx)
	owner := tb.AddEngineOwner("bench", 0)
	links := hashing.NewLinks(256 << 20)
	linkDefer := -1
	if deferred {
		linkDefer = 0
	}
	pub := newPublisher(b, "tcp://127.0.0.1:*")
	counters := NewCounters()
	s, err := Start(Config{
		Source:    SourceConfig{Key: "bench|default|0", Type: sourcetype.VLLM, Endpoint: pub.endpoint},
		Index:     IndexConfig{Context: ctx, Profile: prof, Engine: tb, Owner: owner},
		Verify:    VerifyConfig{HashCheck: benchChecker("bench|default|0", &prof), Links: links, LinkDefer: linkDefer},
		Report:    ReportConfig{Logger: eventtest.Logger(b)},
		Resources: NewResources(ResourcesOptions{Counters: counters}),
	})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Stop()
	pub.waitSubscribed()
	seqb := make([]byte, 8)
	topic := []byte{}
	b.ResetTimer()
	cpu0 := processCPU()
	start := time.Now()
	for i, p := range payloads {
		binary.BigEndian.PutUint64(seqb, uint64(i))
		pub.sendFrames(topic, seqb, p)
	}
	deadline := time.Now().Add(time.Minute)
	wait := func(done func() bool) {
		for !done() {
			if s.Stale() || time.Now().After(deadline) {
				b.Fatalf("ingest did not finish: state %v, counters %v", s.State(), counters.Snapshot())
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
	wait(func() bool { last, ok := s.LastSeq(); return ok && last == uint64(b.N-1) })
	visible, cpuVisible := time.Since(start), processCPU()-cpu0
	wait(func() bool { return links.Pending() == 0 })
	verified, cpuVerified := time.Since(start), processCPU()-cpu0
	b.StopTimer()
	blocks := b.N * benchBlocks
	if got := links.Len(); got != blocks {
		b.Fatalf("%d links for %d blocks", got, blocks)
	}
	b.ReportMetric(float64(blocks)/visible.Seconds(), "visible-blocks/s")
	b.ReportMetric(float64(blocks)/verified.Seconds(), "verified-blocks/s")
	b.ReportMetric(float64(cpuVisible.Nanoseconds())/float64(blocks), "visible-cpu-ns/block")
	b.ReportMetric(float64(cpuVerified.Nanoseconds())/float64(blocks), "verified-cpu-ns/block")
}
