package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mooncake-conductor-go/conductor/internal/membudget"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/racebuild"
)

// TestMemoryLimitUnderFlood is issue 38's flood, scaled to half: the real
// binary runs under GOMEMLIMIT=128MiB (how a container's limit is commonly
// passed) while four vLLM publishers on real ZMQ sockets store 3,000
// distinct prompts of 8,192 tokens with their token ids, 1.5 M block
// placements, more than the budget holds. The process's peak resident
// size (VmHWM) stays under the limit, the index evicts, every metric of
// the budget is exported, the most recent prompts are fully reported and
// a prompt that diverges is never reported past the divergence.
//
// CONDUCTOR_FLOOD_MIB and CONDUCTOR_FLOOD_PROMPTS change the limit and the
// prompts (the issue's own figures: 256 and 6000), for measurements.
func TestMemoryLimitUnderFlood(t *testing.T) {
	if racebuild.Enabled {
		t.Skip("the race detector's shadow memory is outside any budget")
	}
	conductorBinary(t) // built before GOMEMLIMIT is set for the child
	limitMiB, prompts := 128, 3000
	if v, err := strconv.Atoi(os.Getenv("CONDUCTOR_FLOOD_MIB")); err == nil {
		limitMiB = v
	}
	if v, err := strconv.Atoi(os.Getenv("CONDUCTOR_FLOOD_PROMPTS")); err == nil {
		prompts = v
	}
	const pubs, tokens = 4, 8192
	// The child reads it at start; this process's runtime read its own
	// before the test began.
	// CONDUCTOR_FLOOD_MIB=0 runs without a limit, for the unlimited rate:
	// it only logs.
	if limitMiB > 0 {
		t.Setenv("GOMEMLIMIT", fmt.Sprintf("%dMiB", limitMiB))
	} else {
		t.Setenv("GOMEMLIMIT", "")
	}
	t.Setenv("GOGC", "") // the service's own GC target
	p := startConductor(t, "", "--hash-check-every", "0")

	engines := make([]*publisher, pubs)
	names := make([]string, pubs)
	for i := range engines {
		engines[i] = newPublisher(t)
		_ = engines[i].sock.SetSndhwm(0) // paced below: never drops
		names[i] = fmt.Sprint("flood-", i)
		if status, out := p.do("POST", "/register", vllmRegistration(names[i], engines[i].endpoint)); status != 200 {
			t.Fatalf("register %s: %d %v", names[i], status, out)
		}
	}
	// prompt q of publisher i: distinct from its first token on.
	prompt := func(i, q int) []int32 {
		tk := make([]int32, tokens)
		tk[0] = int32(i<<24 | q)
		for j := 1; j < tokens; j++ {
			tk[j] = int32(j*7 + q%13)
		}
		return tk
	}
	stored := func(tk []int32) map[string]any {
		return map[string]any{"type": "BlockStored", "block_hashes": vllmKeys(t, tk), "parent_block_hash": nil,
			"token_ids": tk, "block_size": 16, "lora_id": nil, "medium": "GPU", "lora_name": nil}
	}
	// The first messages are lost until the subscriptions are up; the
	// probe is prompt 0.
	for i, e := range engines {
		probe := stored(prompt(i, 0))
		eventtest.Eventually(t, names[i]+" subscribed", func() bool {
			e.send(0, probe)
			_, a := p.do("POST", "/query", map[string]any{"model": "deepseek", "block_size": 16, "token_ids": prompt(i, 0), "instance_id": names[i]})
			return device(a, names[i]) == tokens
		})
	}
	applied := func() float64 { return metricSum(p.scrape(), "conductor_events_applied_total{") }
	base := applied()

	// Each publisher encodes and sends its prompts in order, keeping at
	// most window of them unapplied (over all publishers, 4 window
	// events), so the receive queues stay short and nothing is dropped.
	const window = 64
	perPub := prompts / pubs
	start := time.Now()
	var sent sync.WaitGroup
	var mu sync.Mutex
	total := 0
	errs := make(chan error, pubs)
	for i, e := range engines {
		sent.Add(1)
		go func() {
			defer sent.Done()
			for q := 1; q <= perPub; q++ {
				e.send(0, stored(prompt(i, q)))
				mu.Lock()
				total++
				n := total
				mu.Unlock()
				if q%window == 0 {
					deadline := time.Now().Add(time.Minute)
					for applied()-base < float64(n-pubs*window) {
						if time.Now().After(deadline) {
							errs <- fmt.Errorf("%s: %d events sent, %v applied after a minute", names[i], n, applied()-base)
							return
						}
						time.Sleep(5 * time.Millisecond)
					}
				}
			}
		}()
	}
	sent.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	eventtest.Eventually(t, "every prompt applied", func() bool { return applied()-base >= float64(pubs*perPub) })
	elapsed := time.Since(start)

	hwm, err := procStatusBytes(p.cmd.Process.Pid, "VmHWM:")
	if err != nil {
		t.Fatal(err)
	}
	text := p.scrape()
	t.Logf("GOMEMLIMIT=%dMiB: %d placements in %v (%.0f blocks/s), VmHWM %d MiB, %v evicted, RSS now %d MiB",
		limitMiB, pubs*perPub*tokens/16, elapsed.Round(time.Millisecond), float64(pubs*perPub*tokens/16)/elapsed.Seconds(),
		hwm>>20, metricValue(text, `conductor_index_evictions_total{kind="context"}`), int64(metricValue(text, `conductor_memory_used_bytes{part="total"}`))>>20)
	if limitMiB == 0 {
		return
	}
	limit := int64(limitMiB) << 20
	if hwm > limit {
		t.Errorf("peak resident size %d MiB over the %d MiB limit", hwm>>20, limitMiB)
	}
	if v := metricValue(text, `conductor_index_evictions_total{kind="context"}`); v <= 0 {
		t.Errorf("no evictions under a budget the flood exceeds: %v", v)
	}
	wantTotal := limit - membudget.Headroom(limit)
	// The start-up log gives the split, the total among its fields.
	if log := p.logText(); !strings.Contains(log, fmt.Sprintf(`"memory_budget_bytes":%d`, wantTotal)) || !strings.Contains(log, "parts: index") {
		t.Errorf("no start-up line with the budget's split:\n%s", log)
	}
	if v := metricValue(text, `conductor_memory_budget_bytes{part="total"}`); v != float64(wantTotal) {
		t.Errorf(`conductor_memory_budget_bytes{part="total"} %v, want %d`, v, wantTotal)
	}
	for _, part := range membudget.Parts {
		b := metricValue(text, fmt.Sprintf(`conductor_memory_budget_bytes{part=%q}`, part))
		u := metricValue(text, fmt.Sprintf(`conductor_memory_used_bytes{part=%q}`, part))
		if b <= 0 || u < 0 || u > b {
			t.Errorf("part %s: used %v of a %v budget", part, u, b)
		}
	}
	// Lower than the truth when evicted, never higher: the latest prompts
	// are whole, and a prompt that diverges from a stored one at token
	// 4,000 is reported up to its last whole block before that at most.
	for i := range engines {
		_, a := p.do("POST", "/query", map[string]any{"model": "deepseek", "block_size": 16, "token_ids": prompt(i, perPub), "instance_id": names[i]})
		if got := device(a, names[i]); got != tokens {
			t.Errorf("%s's latest prompt: %d of %d tokens", names[i], got, tokens)
		}
		for _, q := range []int{1, perPub / 2, perPub} {
			tk := prompt(i, q)
			tk[4000] = -1
			_, a := p.do("POST", "/query", map[string]any{"model": "deepseek", "block_size": 16, "token_ids": tk, "instance_id": names[i]})
			if got := device(a, names[i]); got > 4000/16*16 {
				t.Errorf("%s's prompt %d diverging at token 4000: %d tokens reported", names[i], q, got)
			}
		}
	}
}

// procStatusBytes reads a kB field of /proc/<pid>/status in bytes.
func procStatusBytes(pid int, field string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field); ok {
			var kb int64
			if _, err := fmt.Sscan(rest, &kb); err != nil {
				return 0, fmt.Errorf("%s %q: %w", field, rest, err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}
