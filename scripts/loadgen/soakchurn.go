package main

// The soak's registration churn: publishers restarted in turn and
// short-lived services registered at endpoints with nothing behind them.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// churn is the registration-churn worker: it restarts the churned
// publishers in turn and keeps up to cfg.transients short-lived services
// registered, each pointing at an endpoint with nothing behind it (a closed
// loopback port or a missing ipc path, half of them in our context so they
// show up in answers, half in a context of their own that appears and
// vanishes with them, some with a dead replay endpoint too).
type churn struct {
	r       *soakRun
	pause   chan chan struct{}
	resumed chan struct{}
	exited  chan struct{} // closed when run returns
	live    []transient
	next    int // transient serial
	turn    int // churned publisher to restart next
	rng     *rand.Rand
}

type transient struct {
	id      string
	expires time.Time
}

func newChurn(r *soakRun) *churn {
	return &churn{r: r, pause: make(chan chan struct{}), resumed: make(chan struct{}, 1), exited: make(chan struct{}),
		rng: rand.New(rand.NewPCG(r.o.corpus.Seed, 0xc4)),
	}
}

// quiesce asks the churn worker to finish what it started (every
// transient unregistered, every restarted publisher live again) and waits
// until it has. The worker then waits for resume.
func (c *churn) quiesce(ctx context.Context) error {
	ack := make(chan struct{})
	select {
	case c.pause <- ack:
	case <-c.exited:
		return errors.New("the churn worker stopped before quiescing")
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	select {
	case <-ack:
		return nil
	case <-c.exited:
		return errors.New("the churn worker stopped before quiescing")
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// resume lets a quiesced churn worker continue. The channel has room for
// one, so this never blocks even if the worker has already exited.
func (c *churn) resume() {
	select {
	case c.resumed <- struct{}{}:
	default:
	}
}

func (c *churn) run(ctx context.Context) error {
	defer close(c.exited)
	defer c.dropTransients(true)
	for i := 0; i < maxLoop; i++ {
		jitter := time.Duration(c.rng.Int64N(int64(c.r.cfg.churnInterval)/2 + 1))
		select {
		case <-ctx.Done():
			return nil
		case ack := <-c.pause:
			c.dropTransients(true)
			if err := c.awaitPublishers(ctx); err != nil {
				return err
			}
			close(ack)
			select {
			case <-c.resumed:
			case <-ctx.Done():
				return nil
			}
			continue
		case <-time.After(c.r.cfg.churnInterval*3/4 + jitter):
		}
		c.dropTransients(false)
		if i%2 == 0 && c.r.cfg.churned > 0 {
			c.restartNext()
		} else if len(c.live) < c.r.cfg.transients {
			if err := c.addTransient(); err != nil {
				return err
			}
		}
	}
	return nil
}

// restartNext asks the next churned publisher (the last cfg.churned ones)
// to restart, going round the restart modes. A publisher
// still busy with its previous restart is skipped this turn.
func (c *churn) restartNext() {
	n := c.r.cfg.churned
	p := c.r.pubs[len(c.r.pubs)-n+c.turn%n]
	mode := restartMode((c.turn / n) % int(numRestartModes))
	c.turn++
	p.pending.Add(1)
	select {
	case p.restart <- mode:
	default:
		p.pending.Add(-1)
	}
}

// awaitPublishers waits until every restart asked for has completed.
func (c *churn) awaitPublishers(ctx context.Context) error {
	deadline := time.Now().Add(2*probeTimeout + requestTimeout)
	for {
		busy := 0
		for _, p := range c.r.pubs {
			if p.pending.Load() != 0 || p.model.getPhase() != phaseLive {
				busy++
			}
		}
		if busy == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d publisher(s) still restarting after %v", busy, 2*probeTimeout+requestTimeout)
		}
		if !sleepCtx(ctx, 20*time.Millisecond) {
			return nil
		}
	}
}

// addTransient registers one short-lived service with a dead endpoint.
func (c *churn) addTransient() error {
	r := c.r
	n := c.next
	c.next++
	id := fmt.Sprintf("%s%d", r.prefix, n)
	model := r.o.model
	if n%2 == 1 {
		model = r.o.model + "-transient"
	}
	var endpoint string
	if n%3 == 2 {
		endpoint = "ipc://" + filepath.Join(r.ipcDir, fmt.Sprintf("dead-%d", n))
	} else {
		port, err := deadPort(c.rng)
		if err != nil {
			return err
		}
		endpoint = fmt.Sprintf("tcp://127.0.0.1:%d", port)
	}
	reg := r.o.engine.registration(endpoint, model, id, r.shape.bs)
	if n%4 == 1 {
		port, err := deadPort(c.rng)
		if err != nil {
			return err
		}
		reg["replay_endpoint"] = fmt.Sprintf("tcp://127.0.0.1:%d", port)
	}
	if err := r.api.register(reg); err != nil {
		r.counts.transientFailures.Add(1)
		return err
	}
	r.counts.transients.Add(1)
	life := r.cfg.churnInterval + time.Duration(c.rng.Int64N(int64(4*r.cfg.churnInterval)))
	c.live = append(c.live, transient{id: id, expires: time.Now().Add(life)})
	return nil
}

// dropTransients unregisters expired transients, or all of them.
func (c *churn) dropTransients(all bool) {
	keep := c.live[:0]
	for _, t := range c.live {
		if !all && time.Now().Before(t.expires) {
			keep = append(keep, t)
			continue
		}
		w := c.r.windows.open()
		err := c.r.api.unregister(t.id)
		c.r.windows.close(w)
		if err != nil {
			c.r.counts.transientFailures.Add(1)
			c.r.fails.add("transient: %v", err)
			continue
		}
		c.r.gone.add(t.id)
	}
	c.live = keep
}

// deadPort returns a loopback port below the kernel's ephemeral range with
// nothing listening on it. Below the range matters: our publishers bind
// ephemeral ports, and a transient service must never find one of them
// behind its endpoint.
func deadPort(rng *rand.Rand) (int, error) {
	lo := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil && v > 2048 {
				lo = v
			}
		}
	}
	for range 100 {
		port := 1024 + rng.IntN(lo-1024)
		if err := canListen(port); err == nil {
			return port, nil
		}
	}
	return 0, errors.New("no free port below the ephemeral range")
}

// canListen reports whether nothing listens on the loopback port.
func canListen(port int) error {
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return err
	}
	return ln.Close()
}
