package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/mooncake-conductor-go/conductor/internal/hashing"
)

// vllmRemoved and sglangRemoved are BlockRemoved events
// (docs/events.md#vllm-events, docs/events.md#sglang-events); cleared is
// AllBlocksCleared, the same for both engines.
type vllmRemoved struct {
	Type        string   `msgpack:"type"`
	BlockHashes []uint64 `msgpack:"block_hashes"`
	Medium      string   `msgpack:"medium"`
}

type sglangRemoved struct {
	Type        string  `msgpack:"type"`
	BlockHashes []int64 `msgpack:"block_hashes"`
	Medium      string  `msgpack:"medium"`
}

type cleared struct {
	Type string `msgpack:"type"`
}

// storedEvent builds a BlockStored event in the engine's shape.
func storedEvent(eng engine, blockSize int, keys []uint64, parent *uint64, tokens []int32) any {
	if eng == engineSGLang {
		h := make([]int64, len(keys))
		for i, k := range keys {
			h[i] = int64(k)
		}
		var p *int64
		if parent != nil {
			v := int64(*parent)
			p = &v
		}
		return sglangStored{Type: "BlockStored", BlockHashes: h, Parent: p, TokenIDs: tokens, BlockSize: blockSize, Medium: "GPU"}
	}
	v := vllmStored{Type: "BlockStored", BlockHashes: keys, Parent: parent, TokenIDs: tokens, BlockSize: blockSize, Medium: "GPU"}
	if eng == engineVLLMStd {
		v.ExtraKeys = make([]any, len(keys))
	}
	return v
}

func removedEvent(eng engine, keys []uint64) any {
	if eng == engineSGLang {
		h := make([]int64, len(keys))
		for i, k := range keys {
			h[i] = int64(k)
		}
		return sglangRemoved{Type: "BlockRemoved", BlockHashes: h, Medium: "GPU"}
	}
	return vllmRemoved{Type: "BlockRemoved", BlockHashes: keys, Medium: "GPU"}
}

// batchPayload encodes the envelope [ts, events, dp_rank=0].
func (e *encoder) batchPayload(events []any) ([]byte, error) {
	ts := float64(time.Now().UnixNano()) / 1e9
	return e.encode([]any{ts, events, 0})
}

// restartMode says how a churned publisher comes back.
type restartMode uint8

const (
	// restartNewPort: the new engine process binds another port, so the
	// registration names a new endpoint.
	restartNewPort restartMode = iota
	// restartSamePort: the new process binds the old port again, so the
	// server sees the same endpoint with a sequence that restarts at 0.
	restartSamePort
	// restartInPlace: the process restarts on the same port without being
	// unregistered. The server's subscription reconnects by itself, sees
	// the sequence go back and takes it as a new epoch: the old entries
	// are dropped and the new stream indexed, with no re-registration
	// (docs/events.md#restarts).
	restartInPlace
	numRestartModes
)

// soakPublisher is one fake engine of the soak. Unlike the benchmark's
// publisher it runs for the whole soak in its own goroutine, which alone
// uses its socket: storing new prompts, evicting old ones, clearing now and
// then, and, when the churn worker asks, unregistering, "restarting" (a new
// socket, sequence from 0, empty cache) and registering again.
type soakPublisher struct {
	r        *soakRun
	idx      int
	instance string
	sock     *zmq.Socket
	endpoint string
	seq      uint64
	model    *pubModel
	// step is the last step started; query workers pick contents around it.
	step atomic.Int64
	// restart carries the churn worker's requests; pending counts requests
	// not yet completed, so the churn worker can tell when all is done.
	restart chan restartMode
	pending atomic.Int32

	enc   *encoder
	chain *hashing.Chain
	keys  map[contentKey][]uint64 // chain keys of held contents
	probe []int32
	rng   *rand.Rand

	// Counters for the report, read after the goroutine ended.
	ops, stored, removed, clears, restarts int
}

func (r *soakRun) newSoakPublisher(idx int) (*soakPublisher, error) {
	p := &soakPublisher{
		r: r, idx: idx, instance: fmt.Sprintf("%s-e%d", r.o.model, idx),
		model:   newPubModel(r.shape.groups),
		restart: make(chan restartMode, 1),
		enc:     newEncoder(),
		keys:    map[contentKey][]uint64{},
		probe:   probeTokens(idx, r.shape.bs, r.shape.vocab),
		rng:     rand.New(rand.NewPCG(r.o.corpus.Seed, uint64(idx))),
	}
	if err := p.bind("tcp://127.0.0.1:*"); err != nil {
		return nil, fmt.Errorf("%s: %w", p.instance, err)
	}
	return p, nil
}

// bind opens a PUB socket on endpoint. The send high-water mark is
// unlimited for the reason newPublisher gives; a publisher sends its next
// batch only after the server showed the previous one, so the queue stays
// short anyway.
func (p *soakPublisher) bind(endpoint string) error {
	s, err := p.r.zctx.NewSocket(zmq.PUB)
	if err != nil {
		return err
	}
	if err := errors.Join(s.SetLinger(0), s.SetSndhwm(0), s.Bind(endpoint)); err != nil {
		s.Close()
		return err
	}
	ep, err := s.GetLastEndpoint()
	if err != nil {
		s.Close()
		return err
	}
	p.sock, p.endpoint, p.seq = s, ep, 0
	return nil
}

func (p *soakPublisher) close() {
	if p.sock != nil {
		_ = p.sock.Close()
		p.sock = nil
	}
}

func (p *soakPublisher) send(payload []byte) error {
	var seq [8]byte
	binary.BigEndian.PutUint64(seq[:], p.seq)
	p.seq++
	_, err := p.sock.SendMessage("loadgen", seq[:], payload)
	return err
}

// run is the publisher's goroutine: join, then one step per interval until
// ctx ends. Any error is fatal to the soak: the model no longer describes
// what the server was told.
func (p *soakPublisher) run(ctx context.Context, joined chan<- struct{}) error {
	if err := p.join(ctx); err != nil {
		return err
	}
	joined <- struct{}{}
	next := time.Now()
	for step := 1; step < maxLoop; step++ {
		if ctx.Err() != nil {
			return nil
		}
		select {
		case mode := <-p.restart:
			err := p.restartAs(ctx, mode)
			p.pending.Add(-1)
			if err != nil || ctx.Err() != nil {
				return err // a restart cut short may have left no socket
			}
		default:
		}
		p.step.Store(int64(step))
		if err := p.op(ctx, step); err != nil {
			return err
		}
		next = next.Add(p.r.cfg.opInterval)
		if d := time.Until(next); d > 0 {
			if !sleepCtx(ctx, d) {
				return nil
			}
		} else {
			next = time.Now() // fell behind: do not burst to catch up
		}
	}
	return nil
}

// maxLoop bounds the soak's worker loops by count as well as by time.
const maxLoop = 1 << 40

// sleepCtx sleeps for d and reports false if ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// join registers the current endpoint and waits for the probe.
func (p *soakPublisher) join(ctx context.Context) error {
	p.model.setPhase(phaseJoining)
	if err := p.register(); err != nil {
		return err
	}
	if err := p.awaitProbe(ctx); err != nil {
		return err
	}
	p.model.setPhase(phaseLive)
	return nil
}

func (p *soakPublisher) register() error {
	return p.r.api.register(p.r.o.engine.registration(p.endpoint, p.r.o.model, p.instance, p.r.shape.bs))
}

// awaitProbe publishes the probe until a query shows it: the SUB socket
// joins asynchronously, and a batch sent before it would be lost. The first
// probe the server receives is its sequence baseline, so lost probes do no
// harm.
func (p *soakPublisher) awaitProbe(ctx context.Context) error {
	probe := p.probePayload()
	body, err := queryBody(p.r.o.model, p.r.shape.bs, p.probe, p.instance, false)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(probeTimeout)
	for time.Now().Before(deadline) {
		if err := p.send(probe); err != nil {
			return fmt.Errorf("%s: probe: %w", p.instance, err)
		}
		if !sleepCtx(ctx, 10*time.Millisecond) {
			return nil
		}
		n, err := p.r.instanceMatch(body, p.instance)
		if err != nil {
			return err
		}
		if n == p.r.shape.bs {
			return nil
		}
	}
	return fmt.Errorf("%s: probe not visible after %v", p.instance, probeTimeout)
}

func (p *soakPublisher) probePayload() []byte {
	keys := chainKeys(p.chain, &p.r.prof, p.r.shape.bs, p.probe)
	b, err := p.enc.batchPayload([]any{storedEvent(p.r.o.engine, p.r.shape.bs, keys, nil, p.probe)})
	if err != nil {
		panic(err) // encoding fixed Go values cannot fail
	}
	return b
}

// op performs one step: it plans the step's batch, records the new
// versions, sends the batch and waits until the server shows the step's
// prompt. Storing last is what makes the wait a fence: batches apply in
// order, so seeing the new prompt means the eviction or clear before it was
// applied too.
func (p *soakPublisher) op(ctx context.Context, step int) error {
	pl, err := p.plan(step)
	if err != nil {
		return err
	}
	payload, err := p.enc.batchPayload(pl.events)
	if err != nil {
		return err
	}
	// Record before sending: a query must never see an effect the model
	// does not yet allow.
	p.model.push(pl.versions...)
	if err := p.send(payload); err != nil {
		return fmt.Errorf("%s: send: %w", p.instance, err)
	}
	p.ops++
	body, err := queryBody(p.r.o.model, p.r.shape.bs, pl.tokens, p.instance, false)
	if err != nil {
		return err
	}
	if err := p.await(ctx, body, len(pl.tokens), fmt.Sprintf("step %d", step)); err != nil {
		return err
	}
	p.model.markApplied()
	return nil
}

// stepPlan is one step's batch and the model versions it leads through.
type stepPlan struct {
	events   []any
	versions []*heldState // the state after each event, in order
	tokens   []int32      // the stored prompt, whose visibility confirms the batch
}

// plan builds step's batch from the current state: evict the oldest
// prompt if the window is full (or clear everything every clearEvery
// steps), then store the step's prompt. It updates p.keys and the counters
// but neither the model nor the socket, so tests can replay it.
func (p *soakPublisher) plan(step int) (stepPlan, error) {
	var pl stepPlan
	sh := p.r.shape
	cur := p.model.current()
	next := &heldState{contents: slices.Clone(cur.contents), sysRef: slices.Clone(cur.sysRef)}
	if ce := p.r.cfg.clearEvery; ce > 0 && step%ce == 0 {
		pl.events = append(pl.events, cleared{Type: "AllBlocksCleared"})
		next = emptyState(sh.groups)
		clear(p.keys)
		// Between the clear and the store the server holds nothing for us;
		// that state must count as one the server may show.
		pl.versions = append(pl.versions, emptyState(sh.groups))
		p.clears++
	} else if len(next.contents) >= p.r.cfg.window {
		old := next.contents[0]
		next.contents = next.contents[1:]
		g := sh.group(old)
		next.sysRef[g]--
		oldKeys := p.keys[old]
		delete(p.keys, old)
		// Leaf first, as an LRU evicts; the system prompt goes only with the
		// last prompt that uses it.
		first := sh.sysBlocks
		if next.sysRef[g] == 0 {
			first = 0
		}
		rm := slices.Clone(oldKeys[first:])
		slices.Reverse(rm)
		pl.events = append(pl.events, removedEvent(p.r.o.engine, rm))
		p.removed += len(rm)
		// The state between the removal and the store is one the server
		// may show too. It matters when the evicted prompt took the last
		// reference to a system prompt the new one stores again: both
		// ends hold that system prompt, the moment between does not.
		pl.versions = append(pl.versions, &heldState{contents: slices.Clone(next.contents), sysRef: slices.Clone(next.sysRef)})
	}
	x := contentAt(p.idx, step)
	g := sh.group(x)
	pl.tokens = sh.tokens(x)
	keys := chainKeys(p.chain, &p.r.prof, sh.bs, pl.tokens)
	if len(keys) != sh.blocks {
		return pl, fmt.Errorf("%s: %d keys for %d blocks", p.instance, len(keys), sh.blocks)
	}
	first := 0
	if next.sysRef[g] > 0 {
		first = sh.sysBlocks // already cached: an engine announces new blocks only
	}
	var parent *uint64
	if first > 0 {
		parent = &keys[first-1]
	}
	pl.events = append(pl.events, storedEvent(p.r.o.engine, sh.bs, keys[first:], parent, pl.tokens[first*sh.bs:]))
	p.stored += sh.blocks - first
	next.contents = append(next.contents, x)
	next.sysRef[g]++
	p.keys[x] = keys
	pl.versions = append(pl.versions, next)
	return pl, nil
}

// confirmTimeout bounds the wait for one batch to show. The server applies
// a batch in microseconds; seconds mean it was lost (the source then goes
// stale) or the server is stuck.
const confirmTimeout = 15 * time.Second

// await polls an instance-restricted query until it matches want tokens.
func (p *soakPublisher) await(ctx context.Context, body []byte, want int, what string) error {
	deadline := time.Now().Add(confirmTimeout)
	pause := 200 * time.Microsecond
	last := -1
	for {
		n, err := p.r.instanceMatch(body, p.instance)
		if err != nil {
			return err
		}
		if n == want {
			return nil
		}
		last = n
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %s not visible after %v (longest_matched %d of %d)", p.instance, what, confirmTimeout, last, want)
		}
		if !sleepCtx(ctx, pause) {
			return nil
		}
		pause = min(2*pause, 10*time.Millisecond)
	}
}

// restartAs plays an engine restart: unregister, close the socket, stay
// away briefly (queries must then not show the instance), open a new
// socket whose sequence starts at 0 with an empty cache, register again.
// An in-place restart skips the unregistration (see restartInPlace) and
// falls back to it if the server never noticed the restart.
func (p *soakPublisher) restartAs(ctx context.Context, mode restartMode) error {
	if mode == restartInPlace {
		done, err := p.restartInPlace(ctx)
		if err != nil || ctx.Err() != nil {
			return err
		}
		if done {
			p.r.counts.restartMode[mode].Add(1)
			p.restarts++
			return nil
		}
		mode = restartNewPort
	}
	p.model.setPhase(phaseLeaving)
	w := p.r.windows.open()
	err := p.r.api.unregister(p.instance)
	p.r.windows.close(w)
	if err != nil {
		return err
	}
	p.model.setPhase(phaseGone)
	old := p.endpoint
	p.close()
	clear(p.keys)
	sleepCtx(ctx, time.Duration(50+p.rng.IntN(250))*time.Millisecond)
	if ctx.Err() != nil {
		return nil
	}
	// The new process has an empty cache; nothing is in flight, since the
	// server keeps nothing of an unregistered service.
	p.model.push(emptyState(p.r.shape.groups))
	p.model.markApplied()
	var berr error
	if mode == restartSamePort {
		berr = p.rebind(ctx, old)
	}
	if p.sock == nil {
		if err := p.bind("tcp://127.0.0.1:*"); err != nil {
			return fmt.Errorf("%s: rebind: %w (same port: %v)", p.instance, err, berr)
		}
		mode = restartNewPort
	}
	p.r.counts.restartMode[mode].Add(1)
	p.restarts++
	return p.join(ctx)
}

// rebind binds endpoint again, retrying briefly: closing a ZMQ socket
// releases its port asynchronously.
func (p *soakPublisher) rebind(ctx context.Context, endpoint string) error {
	var err error
	for range 50 {
		if err = p.bind(endpoint); err == nil {
			return nil
		}
		sleepCtx(ctx, 10*time.Millisecond)
	}
	return err
}

// restartInPlace restarts the process on the same port while it stays
// registered. Until the server notices, it keeps the old entries, so the
// empty state of the new process is recorded as sent but applied only once
// the server has counted the restart and carries the probe. It reports
// false, with the registration intact, if the server never counted the
// restart (the caller then unregisters): that happens if the port could not
// be bound again, or if the reconnected subscription first received a
// sequence that happened to continue the old one, which the server cannot
// tell from a live stream without a replay endpoint.
func (p *soakPublisher) restartInPlace(ctx context.Context) (bool, error) {
	before, err := p.r.serviceRestarts(p.instance)
	if err != nil {
		return false, err
	}
	p.model.setPhase(phaseReplacing)
	old := p.endpoint
	p.close()
	clear(p.keys)
	sleepCtx(ctx, time.Duration(50+p.rng.IntN(250))*time.Millisecond)
	p.model.push(emptyState(p.r.shape.groups))
	if err := p.rebind(ctx, old); err != nil {
		if err := p.bind("tcp://127.0.0.1:*"); err != nil {
			return false, fmt.Errorf("%s: rebind: %w", p.instance, err)
		}
		return false, nil
	}
	probe := p.probePayload()
	deadline := time.Now().Add(probeTimeout)
	for {
		if err := p.send(probe); err != nil {
			return false, fmt.Errorf("%s: probe: %w", p.instance, err)
		}
		if !sleepCtx(ctx, 20*time.Millisecond) {
			return false, nil
		}
		n, err := p.r.serviceRestarts(p.instance)
		if err != nil {
			return false, err
		}
		if n > before {
			break
		}
		if time.Now().After(deadline) {
			return false, nil
		}
	}
	p.r.counts.restartsDetected.Add(1)
	if err := p.awaitProbe(ctx); err != nil || ctx.Err() != nil {
		return false, err
	}
	// The new epoch started clean and carries the probe: the old entries
	// are gone.
	p.model.markApplied()
	p.model.setPhase(phaseLive)
	return true, nil
}

// serviceRestarts reads instance's conductor_publisher_restarts_total
// from /metrics (summed over its ranks).
func (r *soakRun) serviceRestarts(instance string) (float64, error) {
	m, err := r.metrics()
	if err != nil {
		r.counts.controlErrors.Add(1)
		return 0, err
	}
	n := 0.0
	for _, s := range m["conductor_publisher_restarts_total"] {
		if strings.HasPrefix(s.labels["service"], instance+"|") {
			n += s.value
		}
	}
	return n, nil
}

// instanceMatch sends a query restricted to instance and returns its
// longest_matched (0 when the instance is absent).
func (r *soakRun) instanceMatch(body []byte, instance string) (int, error) {
	status, resp, err := r.api.do("POST", "/query", body, false)
	if err != nil {
		r.counts.controlErrors.Add(1)
		return 0, err
	}
	if status != 200 {
		if status >= 500 {
			r.counts.fiveXX.Add(1)
		}
		return 0, fmt.Errorf("%s: query: %d %s", instance, status, describe(resp))
	}
	var q queryResponse
	if err := msgpack.Unmarshal(resp, &q); err != nil {
		return 0, fmt.Errorf("%s: answer: %w", instance, err)
	}
	return int(q.Instances[instance].LongestMatched), nil
}
