package subscriber

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/contexts"
	"github.com/mooncake-conductor-go/conductor/internal/events"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
)

type scStep struct {
	Live                string            `json:"live"`
	Seq                 *uint64           `json:"seq"`
	Registration        string            `json:"registration"`
	Expect              *scExpect         `json:"expect"`
	ExpectReplayRequest []string          `json:"expect_replay_request"`
	ReplayFrames        [][]string        `json:"replay_frames"`
	SilenceMS           int               `json:"silence_ms"`
	Query               *scQuery          `json:"query"`
	ExpectInstance      map[string]scHits `json:"expect_instance"`
}

type scExpect struct {
	State                string   `json:"state"`
	LastApplied          *uint64  `json:"last_applied"`
	AppliedOrder         []uint64 `json:"applied_order"`
	IndexEntriesOfSource *int     `json:"index_entries_of_source"`
	Reason               string   `json:"reason"`
}

// staleReasonFor maps a scenario's prose reason to the counter it must bump.
func staleReasonFor(text string) (events.Reason, bool) {
	switch {
	case strings.Contains(text, "deadline"):
		return events.StaleDeadline, true
	case strings.Contains(text, "skipped"), strings.Contains(text, "end marker"):
		return events.StaleReplay, true
	case strings.Contains(text, "regression"):
		return events.StaleRegression, true
	}
	return 0, false
}

type scQuery struct {
	Model     string  `json:"model"`
	BlockSize int     `json:"block_size"`
	TokenIDs  []int32 `json:"token_ids"`
}

type scHits struct {
	Device         *int           `json:"device"`
	CPULocal       *int           `json:"cpu_local"`
	CPUShare       *int           `json:"cpu_share"`
	Disk           *int           `json:"disk"`
	LongestMatched *int           `json:"longest_matched"`
	DP             map[string]int `json:"dp"`
}

type scenario struct {
	ID            string   `json:"id"`
	Registration  string   `json:"registration"`
	Registrations []string `json:"registrations"`
	Steps         []scStep `json:"steps"`
}

func loadScenarios(t *testing.T) []scenario {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(eventtest.FixtureDir(t), "scenarios.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Scenarios []scenario `json:"scenarios"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	return doc.Scenarios
}

var stateNames = map[string]State{"live": Live, "stale": Stale, "recovering": Recovering}

// scenarioTuning shortens replay timeouts so the 30 s silence scenario runs
// in well under a second; the rules exercised are the same.
var scenarioTuning = Tuning{ReplayReceiveTimeout: 150 * time.Millisecond, ReplayTotalTimeout: 600 * time.Millisecond}

// TestScenarios runs every scenario of scenarios.json over loopback TCP:
// sequence handling and replay exchanges against a recording sink, and the
// ingest-to-query checks against the real index and hash chains.
func TestScenarios(t *testing.T) {
	m := eventtest.LoadManifest(t)
	scs := loadScenarios(t)
	if len(scs) < 13 {
		t.Fatalf("only %d scenarios", len(scs))
	}
	for _, sc := range scs {
		t.Run(sc.ID, func(t *testing.T) {
			t.Parallel()
			if sc.Registration != "" {
				runSequenceScenario(t, m, sc)
			} else {
				runQueryScenario(t, m, sc)
			}
		})
	}
}

func decodeHexFrame(t *testing.T, m *eventtest.Manifest, s string) []byte {
	t.Helper()
	if strings.HasPrefix(s, "<payload") {
		id := strings.TrimSuffix(strings.TrimPrefix(strings.TrimPrefix(s, "<payload"), " "), ">")
		if id == "" {
			return emptyBatch("vLLM")
		}
		return eventtest.Payload(t, m.Fixture(t, id))
	}
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatalf("bad hex frame %q", s)
	}
	return b
}

func runSequenceScenario(t *testing.T, m *eventtest.Manifest, sc scenario) {
	reg := m.Registration(t, sc.Registration)
	pub := newPublisher(t, "tcp://127.0.0.1:*")
	var rs *replayServer
	replayEP := ""
	if reg.ReplayEndpoint != "" && reg.Type != "Mooncake" {
		rs = newReplayServer(t, "tcp://127.0.0.1:*")
		replayEP = rs.endpoint
	}
	also := []string(nil)
	if reg.Type == "Mooncake" {
		also = []string{"vllm-a"}
	}
	e := newEnv(t, m, sc.Registration, also, pub.endpoint, replayEP)
	e.cfg.Tuning = scenarioTuning
	s := mustStart(t, e.cfg)
	defer s.Stop()
	pub.waitSubscribed()
	var identity []byte
	var lastLive uint64
	for i, st := range sc.Steps {
		switch {
		case st.Live != "":
			lastLive = *st.Seq
			pub.send(*st.Seq, eventtest.Payload(t, m.Fixture(t, st.Live)))
		case st.ExpectReplayRequest != nil:
			if rs == nil {
				t.Fatalf("step %d: no replay endpoint", i)
			}
			var frames [][]byte
			identity, frames = rs.request(5 * time.Second)
			var got []string
			for _, f := range frames {
				got = append(got, hex.EncodeToString(f))
			}
			if !slices.Equal(got, st.ExpectReplayRequest) {
				t.Fatalf("step %d: replay request %v, want %v", i, got, st.ExpectReplayRequest)
			}
		case st.ReplayFrames != nil:
			for _, reply := range st.ReplayFrames {
				var frames [][]byte
				for _, f := range reply {
					frames = append(frames, decodeHexFrame(t, m, f))
				}
				rs.reply(identity, frames...)
			}
		case st.SilenceMS > 0:
			// nothing is sent; the next expectation waits for the deadline
		case st.Expect != nil:
			want, ok := stateNames[st.Expect.State]
			if !ok {
				t.Fatalf("step %d: unknown state %q", i, st.Expect.State)
			}
			restart := strings.Contains(st.Expect.Reason, "new publisher process")
			eventtest.WaitFor(t, "state "+st.Expect.State, 5*time.Second, func() bool {
				if s.State() != want {
					return false
				}
				if restart {
					// Live before and after: wait for the restart
					// and the new stream's last message.
					last, ok := s.LastSeq()
					return s.Restarts() == 1 && ok && last == lastLive
				}
				if st.Expect.LastApplied != nil {
					last, ok := s.LastSeq()
					return ok && last == *st.Expect.LastApplied
				}
				return true
			})
			if st.Expect.AppliedOrder != nil {
				// The order of the current epoch: a restart starts over.
				if got := e.epochOrder(); !slices.Equal(got, st.Expect.AppliedOrder) {
					t.Errorf("step %d: applied order %v, want %v", i, got, st.Expect.AppliedOrder)
				}
			}
			if restart {
				assertDroppedThenIndexed(t, e)
			}
			if r, ok := staleReasonFor(st.Expect.Reason); ok && want == Stale {
				typ, _ := sourcetype.Parse(reg.Type)
				if e.counters.Value(MetricStale, typ, r) != 1 {
					t.Errorf("step %d: stale reason counters %v, want %v", i, e.counters.Snapshot(), r)
				}
			}
			if st.Expect.IndexEntriesOfSource != nil && *st.Expect.IndexEntriesOfSource == 0 {
				assertRetracted(t, e)
			}
		default:
			t.Fatalf("step %d: unhandled step %+v", i, st)
		}
	}
}

// assertDroppedThenIndexed checks an engine source's old entries were
// cleared (every tier) and the new stream stored after that.
func assertDroppedThenIndexed(t *testing.T, e *env) {
	t.Helper()
	ops := e.engine.Snapshot()
	clear := slices.IndexFunc(ops, func(o eventtest.Op) bool { return o.Kind == "clear" && o.Mask == index.AllEngineTiers })
	if clear < 1 || !slices.ContainsFunc(ops[:clear], func(o eventtest.Op) bool { return o.Kind == "store" }) ||
		!slices.ContainsFunc(ops[clear:], func(o eventtest.Op) bool { return o.Kind == "store" }) {
		t.Errorf("want stores, a clear of every tier, then stores; got %v", ops)
	}
}

// assertRetracted checks the source holds nothing: engines end with a clear
// of every tier, Mooncake references balance out.
func assertRetracted(t *testing.T, e *env) {
	t.Helper()
	if e.cfg.Index.Engine != nil {
		ops := e.engine.Snapshot()
		if len(ops) == 0 {
			return
		}
		last := ops[len(ops)-1]
		if last.Kind != "clear" || last.Mask != index.AllEngineTiers {
			t.Errorf("engine source not retracted; last op %v", last)
		}
		return
	}
	if bal := eventtest.SharedBalance(e.shared.Snapshot()); len(bal) != 0 {
		t.Errorf("shared references left: %v", bal)
	}
}

// runQueryScenario wires real index tables and subscribers for several
// registrations and checks query answers after ingestion.
func runQueryScenario(t *testing.T, m *eventtest.Manifest, sc scenario) {
	cat := contexts.New(index.New(index.Options{}))
	type src struct {
		pub     *publisher
		sub     *Subscriber
		profile hashing.Profile
	}
	sources := map[string]*src{}
	// engines first: they bind the contexts Mooncake events name
	regs := slices.Clone(sc.Registrations)
	slices.SortStableFunc(regs, func(a, b string) int {
		ma, mb := m.Registrations[a].Type == "Mooncake", m.Registrations[b].Type == "Mooncake"
		switch {
		case ma == mb:
			return 0
		case ma:
			return 1
		}
		return -1
	})
	for _, name := range regs {
		reg := m.Registration(t, name)
		prof := eventtest.ResolveProfile(t, reg)
		pub := newPublisher(t, ipcEndpoint(t, name))
		typ, _ := sourcetype.Parse(reg.Type)
		cfg := Config{
			Source: SourceConfig{Key: name, Type: typ, Endpoint: pub.endpoint, DPRank: reg.DPRank},
			Index:  IndexConfig{Context: eventtest.ContextOf(reg), Profile: prof},
			Report: ReportConfig{Logger: eventtest.Logger(t)},
		}
		if reg.Type == "Mooncake" {
			cfg.Index.Lookup = ContextLookup(func(ctx index.ContextKey) (*contexts.Entry, bool) {
				c := cat.Get(ctx)
				return c, c != nil
			})
		} else {
			tb := cat.Ensure(cfg.Index.Context, prof).Table
			cfg.Index.Engine = tb
			cfg.Index.Owner = tb.AddEngineOwner(reg.InstanceID, reg.DPRank)
		}
		s, err := Start(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Stop)
		pub.waitSubscribed()
		sources[name] = &src{pub: pub, sub: s, profile: prof}
	}
	only := ""
	if len(sc.Registrations) == 1 {
		only = sc.Registrations[0]
	}
	for i, st := range sc.Steps {
		switch {
		case st.Live != "":
			name := st.Registration
			if name == "" {
				name = only
			}
			src := sources[name]
			src.pub.send(*st.Seq, eventtest.Payload(t, m.Fixture(t, st.Live)))
			waitSeq(t, src.sub, *st.Seq)
		case st.Query != nil:
			ctx := index.ContextKey{Tenant: "default", Model: st.Query.Model, BlockSize: st.Query.BlockSize}
			c := cat.Get(ctx)
			if c == nil {
				t.Fatalf("step %d: no table for %+v", i, ctx)
			}
			tb := c.Table
			chain := hashing.AcquireChain()
			chain.Reset(&c.Profile, st.Query.BlockSize, st.Query.TokenIDs, "", "")
			var res index.QueryResult
			tb.Query(chain, "", &res)
			hashing.ReleaseChain(chain)
			for inst, want := range st.ExpectInstance {
				var got *index.InstanceHits
				for j := range res.Instances {
					if res.Instances[j].Instance == inst {
						got = &res.Instances[j]
					}
				}
				if got == nil {
					t.Fatalf("step %d: instance %s missing from %+v", i, inst, res)
				}
				check := func(name string, w *int, g int) {
					if w != nil && *w != g {
						t.Errorf("step %d: %s %s = %d, want %d", i, inst, name, g, *w)
					}
				}
				check("device", want.Device, got.Max.Device)
				check("cpu_local", want.CPULocal, got.Max.CPULocal)
				check("cpu_share", want.CPUShare, got.Max.CPUShare)
				check("disk", want.Disk, got.Max.Disk)
				check("longest_matched", want.LongestMatched, got.Max.Disk)
				for rank, dev := range want.DP {
					found := false
					for _, rh := range got.Ranks {
						if rank == itoa(rh.Rank) {
							found = true
							check("dp "+rank, &dev, rh.Device)
						}
					}
					if !found {
						t.Errorf("step %d: %s has no rank %s", i, inst, rank)
					}
				}
			}
		default:
			t.Fatalf("step %d: unhandled step %+v", i, st)
		}
	}
}

func itoa(i int) string {
	b, _ := json.Marshal(i)
	return string(b)
}
