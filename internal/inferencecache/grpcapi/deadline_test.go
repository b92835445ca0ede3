package grpcapi

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/mooncake-conductor-go/conductor/internal/inferencecache/proto/inferencecache/v1alpha1"
)

// rawLookup sends one LookupRoute call as a gRPC client does on the wire
// (HTTP/2 without TLS, a length-prefixed message), with the grpc-timeout
// header given, and returns the answer and its grpc-status. grpc-go's
// client never sends a call whose deadline has already passed (it fails it
// itself), so the server side of a tiny timeout is only reached this way;
// other clients do send it.
func rawLookup(t *testing.T, c *http.Client, addr, timeout string, req *pb.LookupRouteRequest) (*pb.LookupRouteResponse, string) {
	t.Helper()
	msg, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	body := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(msg)))
	body = append(body, msg...)
	hr, err := http.NewRequest(http.MethodPost, "http://"+addr+pb.InferenceCache_LookupRoute_FullMethodName, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	hr.Header.Set("Content-Type", "application/grpc")
	hr.Header.Set("TE", "trailers")
	hr.Header.Set("Grpc-Timeout", timeout)
	res, err := c.Do(hr)
	if err != nil {
		return nil, "reset: " + err.Error()
	}
	defer res.Body.Close()
	out, err := io.ReadAll(res.Body)
	if err != nil {
		return nil, "reset: " + err.Error()
	}
	code := res.Trailer.Get("Grpc-Status")
	if code == "" {
		code = res.Header.Get("Grpc-Status") // trailers-only answer
	}
	if len(out) == 0 {
		return nil, code
	}
	if len(out) < 5 || int(binary.BigEndian.Uint32(out[1:5])) != len(out)-5 {
		t.Fatalf("answer frame %x", out)
	}
	var resp pb.LookupRouteResponse
	if err := proto.Unmarshal(out[5:], &resp); err != nil {
		t.Fatal(err)
	}
	return &resp, code
}

// pendingDeadline is a context in the state a 1 µs timeout is in between
// its deadline and its timer running: the deadline has passed, Err is
// still nil and Done is open. Under load that state lasts longer than a
// lookup, which then answered with scores.
type pendingDeadline struct{ context.Context }

func (pendingDeadline) Deadline() (time.Time, bool) { return time.Now().Add(-time.Microsecond), true }

// TestDeadlinePassedBeforeItsTimer: the deadline decides, not whether the
// context's timer has run yet.
func TestDeadlinePassedBeforeItsTimer(t *testing.T) {
	f := newFixture(t, nil)
	f.mustReport(update("a", chainEntry(t1, 16, 1, 2, 3, 4)))
	req := chainReq("vllm", 16, 1, 2, 3, 4)
	if got, err := f.srv.LookupRoute(context.Background(), req); err != nil || got.ReasonCode != PrefixMatch {
		t.Fatalf("no deadline: %v %v", got, err)
	}
	c := pendingDeadline{context.Background()}
	if c.Err() != nil {
		t.Fatal("the context must look alive")
	}
	got, err := f.srv.LookupRoute(c, req)
	if err != nil || got.ReasonCode != Timeout || len(got.ReplicaScores) != 0 || got.AdapterId != "" {
		t.Fatalf("deadline passed, timer pending: %v %v", got, err)
	}
}

// TestExpiredDeadlineOverTheWire: callers whose deadline is 1 µs, over a
// real loopback connection, never get scores: the answer is TIMEOUT with
// none, or grpc-go's server ends the call itself (DEADLINE_EXCEEDED or a
// reset stream), which callers take as fail-open too; the server computes
// no PREFIX_MATCH for them. With a deadline it can meet, the same request
// matches.
func TestExpiredDeadlineOverTheWire(t *testing.T) {
	f := newFixture(t, nil)
	f.mustReport(update("a", chainEntry(t1, 16, 1, 2, 3, 4)))
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &protos}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	req := chainReq("vllm", 16, 1, 2, 3, 4)
	if got, code := rawLookup(t, c, f.addr, "20S", req); code != "0" || got == nil || got.ReasonCode != PrefixMatch {
		t.Fatalf("20 s deadline: status %s, %v", code, got)
	}
	outcomes := map[string]int{}
	for i := range 100 {
		got, code := rawLookup(t, c, f.addr, "1u", req)
		switch {
		case got == nil && code == "4":
			outcomes["DEADLINE_EXCEEDED"]++
		case got == nil && strings.HasPrefix(code, "reset: "):
			outcomes["reset"]++
		case got != nil && code == "0" && got.ReasonCode == Timeout && len(got.ReplicaScores) == 0:
			outcomes[Timeout]++
		default:
			t.Fatalf("call %d, 1 µs deadline: status %s, %v", i, code, got)
		}
	}
	t.Logf("1 µs callers: %v", outcomes)
	if n := counterValue(t, f.reg, "conductor_grpc_lookup_reasons_total", "reason", PrefixMatch); n != 1 {
		t.Errorf("the server computed %v PREFIX_MATCH answers, want the one of the 20 s call", n)
	}
}
