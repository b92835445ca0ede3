package subscriber

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
	zmq "github.com/pebbe/zmq4"
)

// logged returns the log lines of level whose message starts with prefix.
func logged(t *testing.T, l *eventtest.LogBuffer, level, prefix string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, m := range l.Lines(t) {
		if m["level"] == level && strings.HasPrefix(fmt.Sprint(m["message"]), prefix) {
			out = append(out, m)
		}
	}
	return out
}

const (
	lostMsg   = "the publisher connection is lost"
	notZMQMsg = "the endpoint is not a ZMQ publisher"
	againMsg  = "connected to the publisher again"
)

// TestLinkTransitions follows the monitor's event sequences as libzmq 4.3
// reports them (checked against it on loopback) through the link: the
// state it ends in, and one log line per transition, none for an event
// that changes nothing.
func TestLinkTransitions(t *testing.T) {
	const (
		connected = zmq.EVENT_CONNECTED
		handshake = zmq.EVENT_HANDSHAKE_SUCCEEDED
		lost      = zmq.EVENT_DISCONNECTED
		retried   = zmq.EVENT_CONNECT_RETRIED
		closed    = zmq.EVENT_CLOSED
		protocol  = zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
		noDetail  = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
	)
	for _, tc := range []struct {
		name         string
		events       []zmq.Event
		want         linkState
		warns, infos int
		detail       string
	}{
		{"publisher up", []zmq.Event{connected, handshake}, linkUp, 0, 0, ""},
		{"tcp only", []zmq.Event{connected}, linkUnknown, 0, 0, ""},
		{"publisher exits", []zmq.Event{connected, handshake, lost, retried, closed, retried, closed, retried}, linkDown, 1, 0, "lost"},
		{"publisher back", []zmq.Event{connected, handshake, lost, retried, closed, retried, connected, handshake}, linkUp, 1, 1, ""},
		{"exits twice", []zmq.Event{connected, handshake, lost, connected, handshake, lost, retried}, linkDown, 2, 1, "lost"},
		{"protocol error", []zmq.Event{connected, protocol, lost}, linkNotZMQ, 1, 0, "protocol error"},
		{"handshake timeout, then again", []zmq.Event{connected, noDetail, lost, retried, connected, noDetail, lost}, linkNotZMQ, 1, 0, "did not complete"},
		{"not ZMQ, then a publisher", []zmq.Event{connected, protocol, lost, connected, handshake}, linkUp, 1, 1, ""},
		{"lost before any handshake", []zmq.Event{connected, lost, retried}, linkUnknown, 0, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := &eventtest.LogBuffer{}
			s := &Subscriber{log: zerolog.New(logs), tuning: Tuning{}.withDefaults()}
			now := time.Unix(1e9, 0)
			for _, ev := range tc.events {
				now = now.Add(time.Millisecond)
				s.onLinkEvent(ev, now)
			}
			if got := s.conn.link.load(); got != tc.want {
				t.Errorf("link %d, want %d", got, tc.want)
			}
			warns := len(logged(t, logs, "warn", lostMsg)) + len(logged(t, logs, "warn", notZMQMsg))
			if infos := len(logged(t, logs, "info", againMsg)); warns != tc.warns || infos != tc.infos {
				t.Errorf("%d WARN, %d INFO, want %d and %d:\n%s", warns, infos, tc.warns, tc.infos, logs)
			}
			d := s.conn.link.detail.Load()
			switch {
			case tc.detail == "" && d != nil:
				t.Errorf("detail %q, want none", *d)
			case tc.detail != "" && (d == nil || !strings.Contains(*d, tc.detail)):
				t.Errorf("detail %v, want one saying %q", d, tc.detail)
			}
		})
	}
}

// TestHandshakeWait: a TCP connection without a handshake is named as not
// ZMQ once HandshakeWarnAfter has passed, not before, and only once.
func TestHandshakeWait(t *testing.T) {
	logs := &eventtest.LogBuffer{}
	s := &Subscriber{log: zerolog.New(logs), tuning: Tuning{HandshakeWarnAfter: 10 * time.Second}.withDefaults()}
	t0 := time.Unix(1e9, 0)
	s.onLinkEvent(zmq.EVENT_CONNECTED, t0)
	if at := s.conn.link.handshakeDeadline(s.tuning.HandshakeWarnAfter); !at.Equal(t0.Add(10 * time.Second)) {
		t.Fatalf("deadline %v", at)
	}
	s.checkHandshake(t0.Add(9 * time.Second))
	if s.conn.link.load() != linkUnknown {
		t.Fatal("named before the wait")
	}
	s.checkHandshake(t0.Add(10 * time.Second))
	s.checkHandshake(t0.Add(20 * time.Second))
	if s.conn.link.load() != linkNotZMQ || len(logged(t, logs, "warn", notZMQMsg)) != 1 {
		t.Fatalf("link %d, logs:\n%s", s.conn.link.load(), logs)
	}
	if !s.conn.link.handshakeDeadline(time.Second).IsZero() {
		t.Error("still waiting for a handshake after naming the peer")
	}
}

// publisherProcessEnv names the endpoint a re-executed test binary
// publishes on (TestPublisherProcess).
const publisherProcessEnv = "CONDUCTOR_TEST_PUBLISHER_ENDPOINT"

// TestPublisherProcess is not a test: run by startPublisherProcess with
// publisherProcessEnv set, it is a publisher process that binds the
// endpoint, prints what it bound, and publishes an empty vLLM batch every
// few milliseconds until it is killed.
func TestPublisherProcess(t *testing.T) {
	ep := os.Getenv(publisherProcessEnv)
	if ep == "" {
		t.Skip("a helper process for TestPublisherExitDisconnects")
	}
	pub, err := zmq.NewSocket(zmq.PUB)
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	if err := bindWhenFree(pub, ep); err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	bound, _ := pub.GetLastEndpoint()
	fmt.Println(bound)
	for seq := uint64(0); ; seq++ {
		_, _ = pub.SendMessage("kv-events", seqFrame(seq), emptyBatch("vLLM"))
		time.Sleep(5 * time.Millisecond) // a publisher's pace; the process ends by being killed
	}
}

// startPublisherProcess runs a publisher process on endpoint and returns
// the endpoint it bound and the process, which the caller kills.
func startPublisherProcess(t *testing.T, endpoint string) (string, *exec.Cmd) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestPublisherProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), publisherProcessEnv+"="+endpoint)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "tcp://") {
		t.Fatalf("publisher process: %q, %v", line, err)
	}
	return strings.TrimSpace(line), cmd
}

// TestPublisherExitDisconnects: a publisher process that exits leaves its
// live source disconnected (one WARN), and the source is live again, with
// one INFO, when a publisher binds the endpoint again.
func TestPublisherExitDisconnects(t *testing.T) {
	reg, prof, tb := vllmTable(t, index.Options{})
	ep, first := startPublisherProcess(t, "tcp://127.0.0.1:*")
	logs := &eventtest.LogBuffer{}
	s := mustStart(t, Config{
		Source:    SourceConfig{Key: "svc|default|0", Type: sourcetype.VLLM, Endpoint: ep},
		Index:     IndexConfig{Context: eventtest.ContextOf(reg), Profile: prof, Engine: tb, Owner: tb.AddEngineOwner("svc", 0)},
		Session:   SessionConfig{WatchConnection: true},
		Report:    ReportConfig{Logger: zerolog.New(logs)},
		Resources: NewResources(ResourcesOptions{Counters: NewCounters()}),
	})
	defer s.Stop()
	eventtest.WaitFor(t, "live", 10*time.Second, func() bool { return s.State() == Live })
	if d := s.StateDetail(); d != "" {
		t.Errorf("live with detail %q", d)
	}

	_ = first.Process.Kill()
	_ = first.Wait()
	eventtest.WaitFor(t, "disconnected after the publisher exited", 10*time.Second, func() bool { return s.State() == Disconnected })
	if d := s.StateDetail(); !strings.Contains(d, "lost") {
		t.Errorf("detail %q", d)
	}
	if w := logged(t, logs, "warn", lostMsg); len(w) != 1 || w[0]["endpoint"] != ep {
		t.Errorf("loss warnings %v", w)
	}

	startPublisherProcess(t, ep)
	eventtest.WaitFor(t, "live again", 10*time.Second, func() bool { return s.State() == Live && s.StateDetail() == "" })
	eventtest.WaitFor(t, "the reconnection's INFO", 10*time.Second, func() bool { return len(logged(t, logs, "info", againMsg)) == 1 })
	if w := logged(t, logs, "warn", lostMsg); len(w) != 1 {
		t.Errorf("%d loss warnings after the reconnection, want still 1", len(w))
	}
}

// TestNotZMQPeerNamed: a peer at the endpoint that is not a ZMQ publisher
// (a TCP service writing its own protocol, an HTTP server, a ZMTP peer
// with a mechanism libzmq lacks) makes the source disconnected with a
// detail saying so and one WARN naming the endpoint, never connected.
func TestNotZMQPeerNamed(t *testing.T) {
	for _, tc := range []struct {
		name  string
		serve func(t *testing.T) (endpoint string)
	}{
		{"tcp garbage", func(t *testing.T) string {
			return eventtest.NewRawPeer(t, []byte("HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n")).Endpoint()
		}},
		{"http server", func(t *testing.T) string {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv := &http.Server{Handler: http.NotFoundHandler(), ReadHeaderTimeout: time.Minute}
			done := make(chan struct{})
			go func() { defer close(done); _ = srv.Serve(ln) }()
			t.Cleanup(func() { _ = srv.Close(); <-done })
			return "tcp://" + ln.Addr().String()
		}},
		{"zmtp with another mechanism", func(t *testing.T) string {
			return eventtest.NewRawPeer(t, eventtest.BogusZMTPGreeting()).Endpoint()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg, prof, tb := vllmTable(t, index.Options{})
			ep := tc.serve(t)
			logs := &eventtest.LogBuffer{}
			s := mustStart(t, Config{
				Source:    SourceConfig{Key: "svc|default|0", Type: sourcetype.VLLM, Endpoint: ep},
				Index:     IndexConfig{Context: eventtest.ContextOf(reg), Profile: prof, Engine: tb, Owner: tb.AddEngineOwner("svc", 0)},
				Session:   SessionConfig{WatchConnection: true},
				Tuning:    Tuning{HandshakeWarnAfter: 300 * time.Millisecond},
				Report:    ReportConfig{Logger: zerolog.New(logs)},
				Resources: NewResources(ResourcesOptions{Counters: NewCounters()}),
			})
			defer s.Stop()
			eventtest.WaitFor(t, "named as not a ZMQ publisher", 10*time.Second, func() bool {
				return s.State() == Disconnected && strings.Contains(s.StateDetail(), "not a ZMQ publisher")
			})
			if s.Connected() {
				t.Error("a peer that is not a ZMQ publisher counts as connected")
			}
			if w := logged(t, logs, "warn", notZMQMsg); len(w) != 1 || w[0]["endpoint"] != ep {
				t.Errorf("warnings %v\n%s", w, logs)
			}
		})
	}
}
