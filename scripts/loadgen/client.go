package main

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"time"

	"github.com/mooncake-conductor-go/conductor/internal/bearer"
	"github.com/valyala/fasthttp"
	"github.com/vmihailenco/msgpack/v5"
)

// api talks to the server under test. It refuses anything but a loopback
// address: the load generator floods whatever it is pointed at and must not
// be aimed at a shared host by accident.
type api struct {
	base    string
	token   string
	hc      *fasthttp.HostClient
	timeout time.Duration // for control requests; queries use requestTimeout
}

// requestTimeout bounds every HTTP exchange, so a hung server fails the run
// instead of hanging it.
const requestTimeout = 30 * time.Second

func newAPI(base, token string, maxConns int) (*api, error) {
	u, err := url.Parse(base)
	if err != nil {
		return nil, fmt.Errorf("base URL: %w", err)
	}
	if u.Scheme != "http" {
		return nil, fmt.Errorf("base URL %q: only http is supported", base)
	}
	host := u.Hostname()
	if host != "localhost" {
		ip := net.ParseIP(host)
		if ip == nil || !ip.IsLoopback() {
			return nil, fmt.Errorf("base URL %q: only loopback addresses are allowed", base)
		}
	}
	if u.Port() == "" {
		return nil, fmt.Errorf("base URL %q: port required", base)
	}
	return &api{
		base:    "http://" + u.Host,
		token:   token,
		timeout: requestTimeout,
		hc: &fasthttp.HostClient{
			Addr:                u.Host,
			MaxConns:            maxConns,
			ReadTimeout:         requestTimeout,
			WriteTimeout:        requestTimeout,
			MaxIdleConnDuration: 10 * time.Second,
			MaxConnWaitTimeout:  5 * time.Second,
		},
	}, nil
}

func (a *api) close() { a.hc.CloseIdleConnections() }

// do sends one request; body is raw MessagePack (nil for GET). It returns
// the status and a copy of the response body.
func (a *api) do(method, path string, body []byte, auth bool) (int, []byte, error) {
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(a.base + path)
	req.Header.SetMethod(method)
	// Every answer is read as MessagePack; the health routes answer JSON
	// to a client that does not say so.
	req.Header.Set("Accept", "application/msgpack")
	if body != nil {
		req.Header.SetContentType("application/msgpack")
		req.SetBodyRaw(body)
	}
	if auth && a.token != "" {
		req.Header.Set("Authorization", bearer.Header(a.token))
	}
	if err := a.hc.DoTimeout(req, resp, a.timeout); err != nil {
		return 0, nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	return resp.StatusCode(), append([]byte(nil), resp.Body()...), nil
}

func (a *api) postMsgpack(path string, v any, auth bool) (int, []byte, error) {
	b, err := msgpack.Marshal(v)
	if err != nil {
		return 0, nil, err
	}
	return a.do(fasthttp.MethodPost, path, b, auth)
}

// describe renders an error body for a message.
func describe(body []byte) string {
	var m map[string]any
	if msgpack.Unmarshal(body, &m) == nil {
		return fmt.Sprint(m)
	}
	return fmt.Sprintf("%d bytes", len(body))
}

func (a *api) register(reg map[string]any) error {
	status, body, err := a.postMsgpack("/register", reg, true)
	if err != nil {
		return err
	}
	if status != 200 {
		return fmt.Errorf("register %v: %d %s", reg["instance_id"], status, describe(body))
	}
	return nil
}

func (a *api) unregister(instance string) error {
	status, body, err := a.postMsgpack("/unregister", map[string]any{"instance_id": instance, "dp_rank": 0}, true)
	if err != nil {
		return err
	}
	if status != 200 {
		return fmt.Errorf("unregister %s: %d %s", instance, status, describe(body))
	}
	return nil
}

// globalView is the part of GET /global_view the load generator reads.
type globalView struct {
	Contexts []struct {
		ModelName   string `msgpack:"model_name"`
		LoraName    string `msgpack:"lora_name"`
		BlockSize   int    `msgpack:"block_size"`
		TenantID    string `msgpack:"tenant_id"`
		PrefixCount int    `msgpack:"prefix_count"`
	} `msgpack:"contexts"`
}

// prefixCount returns our context's prefix_count; found is false when the
// context does not exist (nothing registered for it).
func (a *api) prefixCount(model string, blockSize int) (n int, found bool, err error) {
	status, body, err := a.do(fasthttp.MethodGet, "/global_view", nil, false)
	if err != nil {
		return 0, false, err
	}
	if status != 200 {
		return 0, false, fmt.Errorf("global_view: %d %s", status, describe(body))
	}
	var gv globalView
	if err := msgpack.Unmarshal(body, &gv); err != nil {
		return 0, false, fmt.Errorf("global_view: %w", err)
	}
	for _, c := range gv.Contexts {
		if c.ModelName == model && c.BlockSize == blockSize && c.LoraName == "" && (c.TenantID == "default" || c.TenantID == "") {
			return c.PrefixCount, true, nil
		}
	}
	return 0, false, nil
}

// staleSources reads /readyz's stale_sources: a publisher that lost a
// message goes stale and its entries vanish, which would otherwise look
// like a slow ingest.
func (a *api) staleSources() (int, error) {
	_, body, err := a.do(fasthttp.MethodGet, "/readyz", nil, false)
	if err != nil {
		return 0, err
	}
	var r struct {
		Stale int `msgpack:"stale_sources"`
	}
	if err := msgpack.Unmarshal(body, &r); err != nil {
		return 0, fmt.Errorf("readyz: %w", err)
	}
	return r.Stale, nil
}

// healthy reports whether GET /healthz answers 200.
func (a *api) healthy() bool {
	status, _, err := a.do(fasthttp.MethodGet, "/healthz", nil, false)
	return err == nil && status == 200
}

// queryBody encodes a /query request. Tokens go as a MessagePack array of
// integers, as a Python router packs a list, unless bin is set (the
// contract's little-endian int32 binary form).
func queryBody(model string, blockSize int, tokens []int32, instance string, bin bool) ([]byte, error) {
	m := map[string]any{"model": model, "block_size": blockSize}
	if bin {
		b := make([]byte, 4*len(tokens))
		for i, t := range tokens {
			u := uint32(t)
			b[4*i], b[4*i+1], b[4*i+2], b[4*i+3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
		}
		m["token_ids"] = b
	} else {
		m["token_ids"] = tokens
	}
	if instance != "" {
		m["instance_id"] = instance
	}
	e := newEncoder()
	return e.encode(m)
}

// tiers are the four cumulative tier counts.
type tiers struct {
	Device   int64 `msgpack:"device"`
	CPULocal int64 `msgpack:"cpu_local"`
	CPUShare int64 `msgpack:"cpu_share"`
	Disk     int64 `msgpack:"disk"`
}

type instanceHits struct {
	LongestMatched int64            `msgpack:"longest_matched"`
	DP             map[string]int64 `msgpack:"dp"`
	RankMatches    map[string]tiers `msgpack:"rank_matches"`
	Device         int64            `msgpack:"device"`
	CPULocal       int64            `msgpack:"cpu_local"`
	CPUShare       int64            `msgpack:"cpu_share"`
	Disk           int64            `msgpack:"disk"`
}

type queryResponse struct {
	Instances map[string]instanceHits `msgpack:"instances"`
}

// presence says what an instance's entry in an answer may look like.
type presence uint8

const (
	mustMatch  presence = iota // registered throughout: exact expected counts
	mayVanish                  // being unregistered: absent, or a consistent subset
	mustBeGone                 // unregistered before the query started
)

var errMismatch = errors.New("wrong answer")

// checkAnswer compares a decoded /query answer with the expectation. Every
// publisher stores on the device tier only (vLLM GPU, SGLang GPU) on DP rank
// 0, so all four tiers, dp["0"] and rank_matches["0"] must equal the
// expected longest match.
func checkAnswer(r *queryResponse, expect []int, ids []string, pres func(i int) presence) error {
	seen := 0
	for i, id := range ids {
		h, ok := r.Instances[id]
		p := pres(i)
		switch {
		case p == mustBeGone && ok:
			return fmt.Errorf("%w: %s answered after its unregistration", errMismatch, id)
		case p == mustMatch && !ok:
			return fmt.Errorf("%w: %s missing", errMismatch, id)
		case !ok:
			continue
		}
		seen++
		want := int64(expect[i])
		if p == mayVanish {
			// A removal in progress may show a shorter prefix, never a
			// longer one, and tiers must stay cumulative.
			if h.Device > want || h.Device != h.LongestMatched || h.Device != h.Disk || h.Device != h.CPULocal || h.Device != h.CPUShare {
				return fmt.Errorf("%w: %s during unregistration: %+v, expected at most %d", errMismatch, id, h, want)
			}
			continue
		}
		if h.LongestMatched != want || h.Device != want || h.CPULocal != want || h.CPUShare != want || h.Disk != want {
			return fmt.Errorf("%w: %s: longest_matched=%d device=%d cpu_local=%d cpu_share=%d disk=%d, expected %d",
				errMismatch, id, h.LongestMatched, h.Device, h.CPULocal, h.CPUShare, h.Disk, want)
		}
		if len(h.DP) != 1 || h.DP["0"] != want {
			return fmt.Errorf("%w: %s: dp=%v, expected {0: %d}", errMismatch, id, h.DP, want)
		}
		rm, ok := h.RankMatches["0"]
		if len(h.RankMatches) != 1 || !ok || rm != (tiers{want, want, want, want}) {
			return fmt.Errorf("%w: %s: rank_matches=%v, expected all %d on rank 0", errMismatch, id, h.RankMatches, want)
		}
	}
	if seen != len(r.Instances) {
		return fmt.Errorf("%w: %d instances in the answer, %d expected", errMismatch, len(r.Instances), seen)
	}
	return nil
}

// memoStats is what the server's /metrics says of its two memos: lookups
// by result and the memory they hold. A level's hit shares come from the
// difference of two readings; a pool of queries cycled at a steady state
// should be served almost wholly from both, and a share that stays low
// while the bytes sit at the budget is a memo thrashing.
type memoStats struct {
	prefixHits, prefixMisses float64 // blocks
	tokenHits, tokenMisses   float64 // token ids
	answerHits, answerMisses float64 // long queries
	answerBytes              float64
	prefixBytes, tokenBytes  float64
	// linkHits and linkBytes are the verified links' (-1 on a server
	// without them).
	linkHits, linkBytes float64
}

// metrics fetches and parses GET /metrics. status is the response's (0
// when none came back), so callers can count a 5xx.
func (a *api) metrics() (m promText, status int, err error) {
	status, body, err := a.do(fasthttp.MethodGet, "/metrics", nil, false)
	if err != nil {
		return nil, 0, err
	}
	if status != 200 {
		return nil, status, fmt.Errorf("metrics: status %d", status)
	}
	m, err = parsePromText(body)
	return m, status, err
}

// memoStats reads the server's memo counters from /metrics.
func (a *api) memoStats() (memoStats, error) {
	m, _, err := a.metrics()
	if err != nil {
		return memoStats{}, err
	}
	hit, miss := map[string]string{"result": "hit"}, map[string]string{"result": "miss"}
	return memoStats{
		prefixHits:   m.value("conductor_hash_memo_lookups_total", hit),
		prefixMisses: m.value("conductor_hash_memo_lookups_total", miss),
		tokenHits:    m.value("conductor_token_memo_tokens_total", hit),
		tokenMisses:  m.value("conductor_token_memo_tokens_total", miss),
		prefixBytes:  m.value("conductor_hash_memo_bytes", nil),
		tokenBytes:   m.value("conductor_token_memo_bytes", nil),
		answerHits:   m.value("conductor_answer_cache_lookups_total", hit),
		answerMisses: m.value("conductor_answer_cache_lookups_total", miss),
		answerBytes:  m.value("conductor_answer_cache_bytes", nil),
		linkHits:     m.value("conductor_link_memo_hits_total", nil),
		linkBytes:    m.value("conductor_link_memo_bytes", nil),
	}, nil
}

// hitPct is the percentage of lookups between readings a and b that hit,
// or -1 when there were none or a reading is missing.
func hitPct(hitsA, missesA, hitsB, missesB float64) float64 {
	if hitsA < 0 || missesA < 0 || hitsB < 0 || missesB < 0 {
		return -1
	}
	h, n := hitsB-hitsA, hitsB-hitsA+missesB-missesA
	if n <= 0 {
		return -1
	}
	return 100 * h / n
}
