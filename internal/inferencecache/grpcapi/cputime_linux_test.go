package grpcapi

import (
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	pb "github.com/mooncake-conductor-go/conductor/internal/inferencecache/proto/inferencecache/v1alpha1"
)

// threadCPU is this OS thread's CPU time: unlike a benchmark's wall clock
// it leaves out time the thread was descheduled, so figures taken on a
// shared, loaded machine stay comparable.
func threadCPU() time.Duration {
	const rusageThread = 1
	var ru syscall.Rusage
	_ = syscall.Getrusage(rusageThread, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuPerOp runs f b.N times on one locked OS thread and reports its thread
// CPU time per call as cpu-ns/op beside the wall clock's ns/op.
func cpuPerOp(b *testing.B, f func()) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.ResetTimer()
	t0 := threadCPU()
	for range b.N {
		f()
	}
	b.ReportMetric(float64((threadCPU()-t0).Nanoseconds())/float64(b.N), "cpu-ns/op")
}

// BenchmarkDoorCPU gives the figures the gRPC door is held to in thread CPU
// time: LookupRoute against /query on one 8K-token prompt (with the memos
// and without), a 512-block chain lookup, and ReportCacheState ingest of
// 1,024-block updates. Thread CPU time is counted in scheduler ticks, so
// give each run at least a second: -benchtime 1s or more.
func BenchmarkDoorCPU(b *testing.B) {
	for _, mode := range []string{"memos", "no-memos"} {
		hs, gs, body, req := benchServersWith(b, 8192, mode != "no-memos")
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.SetMethod("POST")
		ctx.Request.SetRequestURI("/query")
		ctx.Request.Header.SetContentType("application/msgpack")
		b.Run("query-8k/"+mode, func(b *testing.B) {
			cpuPerOp(b, func() {
				ctx.Request.SetBody(body)
				ctx.Response.Reset()
				hs.Handle(&ctx)
			})
		})
		var out []byte
		b.Run("lookup-8k/"+mode, func(b *testing.B) {
			cpuPerOp(b, func() { out = lookupOnce(b, gs, req, out) })
		})
	}
	s, raw := chain512(b)
	var out []byte
	b.Run("lookup-chain512", func(b *testing.B) {
		cpuPerOp(b, func() { out = lookupOnce(b, s, raw, out) })
	})
	const perUpdate = 1024
	var raws [][]byte
	for r := range 256 {
		ks := make([]uint64, perUpdate)
		for i := range ks {
			ks[i] = uint64(r*perUpdate+i)*0x9e3779b97f4a7c15 + 7
		}
		m, err := proto.Marshal(update(fmt.Sprintf("r%d", r%32), chainEntry(t1, 16, ks...)))
		if err != nil {
			b.Fatal(err)
		}
		raws = append(raws, m)
	}
	i := 0
	b.Run("report-ingest-1024", func(b *testing.B) {
		cpuPerOp(b, func() {
			var u pb.CacheStateUpdate
			if err := s.codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(raws[i%len(raws)])}, &u); err != nil {
				b.Fatal(err)
			}
			s.applyUpdate(&u)
			i++
		})
	})
}
