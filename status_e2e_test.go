package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/valyala/fasthttp"

	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
)

// servicesJSON returns the JSON form of /services (what `conductor
// services` prints) as instance id → service.
func (e *e2e) servicesJSON() map[string]map[string]any {
	e.t.Helper()
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(e.base + "/services")
	req.Header.Set("Accept", "application/json")
	if err := e.c.DoTimeout(req, resp, 10*time.Second); err != nil || resp.StatusCode() != 200 {
		e.t.Fatalf("GET /services: %d %v", resp.StatusCode(), err)
	}
	r := resp.Body()
	var body struct {
		Services []map[string]any `json:"services"`
	}
	if err := json.Unmarshal(r, &body); err != nil {
		e.t.Fatalf("/services: %v: %s", err, r)
	}
	out := map[string]map[string]any{}
	for _, s := range body.Services {
		out[s["InstanceID"].(string)] = s
	}
	return out
}

// TestServicesShowDisconnected: /services says what became of a source's
// publisher. A publisher that goes away leaves its live source
// disconnected, with a StateDetail saying so, and conductor_subscriber_state
// has the state as its own series; a publisher binding the endpoint again
// makes it live again. A peer at an endpoint that is not a ZMQ publisher
// is named as such.
func TestServicesShowDisconnected(t *testing.T) {
	e := startApp(t)
	pub := newPublisher(t)
	if st, body := e.post("/register", vllmRegistration("p0", pub.endpoint)); st != 200 {
		t.Fatalf("register: %d %v", st, body)
	}
	state := func(id string) (string, string) {
		s := e.servicesJSON()[id]
		return s["State"].(string), s["StateDetail"].(string)
	}
	eventtest.Eventually(t, "live", func() bool {
		pub.send(0)
		st, _ := state("p0")
		return st == "live"
	})

	// The publisher goes away.
	_ = pub.sock.SetLinger(0)
	_ = pub.sock.Close()
	eventtest.WaitFor(t, "disconnected", 10*time.Second, func() bool {
		st, detail := state("p0")
		return st == "disconnected" && strings.Contains(detail, "connection is lost")
	})
	if v := metricValue(e.scrape(), `conductor_subscriber_state{service="p0|default|0",state="disconnected",type="vLLM"}`); v != 1 {
		t.Errorf("subscriber_state disconnected = %v, want 1", v)
	}

	// A publisher binds the endpoint again.
	again, err := zmq.NewSocket(zmq.PUB)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	_ = again.SetLinger(0)
	eventtest.Eventually(t, "the endpoint free again", func() bool { return again.Bind(pub.endpoint) == nil })
	eventtest.WaitFor(t, "live again", 10*time.Second, func() bool {
		st, detail := state("p0")
		return st == "live" && detail == ""
	})

	// A TCP service that is not ZMQ at another endpoint: it answers the
	// greeting with a ZMTP-looking one offering a mechanism nobody has.
	peer := eventtest.NewRawPeer(t, eventtest.BogusZMTPGreeting())
	if st, body := e.post("/register", vllmRegistration("p1", peer.Endpoint())); st != 200 {
		t.Fatalf("register: %d %v", st, body)
	}
	eventtest.WaitFor(t, "named as not a ZMQ publisher", 10*time.Second, func() bool {
		st, detail := state("p1")
		return st == "disconnected" && strings.Contains(detail, "not a ZMQ publisher")
	})
	if st, body := e.post("/unregister", map[string]any{"instance_id": "p1", "dp_rank": 0}); st != 200 {
		t.Fatalf("unregister: %d %v", st, body)
	}
}
