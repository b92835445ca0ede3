package events

import (
	"bytes"
	"testing"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/hashing/hashcheck"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
	"github.com/rs/zerolog"
)

// The decoders are tested here without sockets: a tester feeds payloads to
// a Decoder the way the subscriber does (decode, check the batch dp_rank,
// apply) and records every sink call and outcome.

// ---- tester ----------------------------------------------------------------

// tester is one decoder under test with recording sinks.
type tester struct {
	reg      eventtest.Registration
	dec      Decoder
	engine   *eventtest.Recorder
	shared   *eventtest.Recorder // the table bound by also_registered engines
	seq      uint64              // the batch being applied
	outcomes map[uint64][]Outcome
	// envRejected and batchRejected count envelopes the decoder rejected
	// and engine batches whose dp_rank is not the registration's.
	envRejected, batchRejected int
	lastEnvReason              Reason
	// check is an engine registration's hash checker, which checks every
	// block; checkLog holds its warnings.
	check    *hashcheck.Checker
	checkLog *bytes.Buffer
}

// newTester builds the decoder of a manifest registration with recording
// sinks. Mooncake registrations get a lookup that knows the contexts of
// also.
func newTester(t testing.TB, m *eventtest.Manifest, regName string, also ...string) *tester {
	t.Helper()
	reg := m.Registration(t, regName)
	x := &tester{reg: reg, engine: &eventtest.Recorder{}, shared: &eventtest.Recorder{}, outcomes: map[uint64][]Outcome{}}
	tables := m.Profiles(t, also)
	typ, ok := sourcetype.Parse(reg.Type)
	if !ok {
		t.Fatalf("registration type %q", reg.Type)
	}
	cfg := Config{Type: typ, Profile: eventtest.ResolveProfile(t, reg), Context: eventtest.ContextOf(reg), Owner: eventtest.Owner, Logger: eventtest.Logger(t)}
	if typ == sourcetype.Mooncake {
		cfg.Lookup = func(ctx index.ContextKey) (SharedSink, *hashing.Profile, bool) {
			p, ok := tables[ctx]
			if !ok {
				return nil, nil, false
			}
			return x.shared, p, true
		}
	} else {
		cfg.Engine = x.engine
		x.checkLog = &bytes.Buffer{}
		set := hashcheck.NewSet(hashcheck.Options{Warmup: 1 << 30, Logger: zerolog.New(x.checkLog)})
		x.check = set.Add(reg.InstanceID, &cfg.Profile, reg.BlockSize, reg.LoraName)
		cfg.Check = x.check
	}
	dec, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	x.dec = dec
	return x
}

// applyBatch decodes and applies one payload as the subscriber does.
func (x *tester) applyBatch(seq uint64, payload []byte) {
	if rej := x.dec.Decode(payload); rej != ReasonNone {
		x.envRejected++
		x.lastEnvReason = rej
		return
	}
	if dp, ok := x.dec.DPRank(); ok && x.reg.Type != "Mooncake" && dp != uint64(x.reg.DPRank) {
		x.batchRejected++
		return
	}
	x.seq = seq
	applyTo(x.dec, x)
	x.dec.Forget()
}

func (x *tester) Report(i int, res Result, why Reason) {
	x.outcomes[x.seq] = append(x.outcomes[x.seq], Outcome{Index: i, Result: res, Reason: why})
}

func (x *tester) retract() { x.dec.Retract() }

// reporter is told the outcome of every event of a batch (test helpers).
type reporter interface {
	Report(i int, res Result, why Reason)
}

// applyTo applies d's decoded batch and tells r every outcome, in order, as
// the subscriber reads them.
func applyTo(d Decoder, r reporter) {
	for i := range d.Apply() {
		res, why := d.Outcome(i)
		r.Report(i, res, why)
	}
}
