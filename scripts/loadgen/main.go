// Command loadgen measures a running conductor end to end: it starts fake
// engines that publish KV-cache events over real ZMQ sockets, waits until
// the index has absorbed them, drives POST /query at several concurrency
// levels while checking every answer against expectations it computed from
// the tokens alone, then unregisters the engines under query load.
//
// Phases, in order:
//
//  1. corpus: stored prompts (a group's shared system prompt plus a private
//     suffix) until the publishers together publish --blocks blocks, and a
//     pool of queries (full, partial, system-only, cold) with the expected
//     longest_matched per instance, computed from tokens alone;
//  2. registration: one PUB socket per engine on 127.0.0.1, POST /register,
//     then a probe block is published until /query shows it, because a SUB
//     joins asynchronously and anything sent before it would be lost (and
//     the resulting sequence gap would make the source stale);
//  3. ingest: every publisher sends its BlockStored batches (--batch blocks
//     each) at once; /global_view's prefix_count reaching the number of
//     distinct blocks ends the phase and gives blocks/s;
//  4. one checked pass over the pool, then each --concurrency level for
//     --duration: queries/s, latency percentiles, server and client CPU;
//  5. unregistration of every engine while queries keep running.
//
// Everything stays on loopback, every phase is bounded in time and count,
// and all sockets (and a --spawn'ed server) are closed at exit. Any wrong
// answer makes the exit status non-zero. The Markdown report goes to stdout
// (JSON with --json), progress to stderr. --spawn builds the server from the
// working tree, uncommitted changes included.
//
// With --spawn --server-replicas N it starts N servers from one build (with
// --targets it drives servers already running): every publisher is
// registered on each, the verification pass asks each one the whole pool,
// and the timed queries go to them in turn (see replicas.go).
//
// With --fleet-rounds N (--preset fleet) the index is then kept at
// capacity instead of queried: every publisher replaces each prompt it
// holds by a new one, round after round, with checked queries during the
// last rounds (see fleet.go).
//
// With --soak DURATION it runs the soak test instead (see soak.go):
// ingestion with eviction and clears, checked queries and registration
// churn together, then assertions that the server reached a steady state.
//
//	go run ./scripts/loadgen --spawn --publishers 8 --blocks 200000 --concurrency 1,4,16 --duration 5s
//	scripts/loadgen.sh --publishers 8 --blocks 200000 --duration 5s   # the same, built first
//	go run ./scripts/loadgen --spawn --preset router-8k --concurrency 8 --server-replicas 3
//	go run ./scripts/loadgen --spawn --preset fleet --fleet-rounds 4 --server-memory-mib 256
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/mooncake-conductor-go/conductor/internal/hashing"
)

type options struct {
	baseURL       string
	authToken     string
	spawn         bool
	repo          string
	serverLog     string
	serverPID     int
	serverRace    bool
	restart       bool
	serverArgs    []string
	engine        engine
	model         string
	corpus        corpusConfig
	mixText       string
	batch         int
	levels        []int
	duration      time.Duration
	unregConc     int
	reclaimWindow time.Duration
	maxSamples    int
	ingestTimeout time.Duration
	binTokens     bool
	coldPass      bool
	floor         bool
	chainBaseline bool
	steadyIngest  float64
	preset        string
	json          bool
	quiet         bool
	soak          soakConfig
	fleet         fleetConfig
	// serverMemoryMiB runs spawned servers under GOMEMLIMIT (0: none).
	serverMemoryMiB int

	// serverReplicas is --server-replicas; targets and serverPIDs are
	// --targets and --server-pids (nil: --base-url and --server-pid).
	serverReplicas int
	targets        []string
	serverPIDs     []int
}

// presets are named workloads: their flags go before the command line's,
// so any flag given explicitly overrides the preset's value.
var presets = map[string][]string{
	// router-8k is the index a router sees (issue 19): 4 instances, 1,000
	// stored prompts of 8,192 tokens in 16 groups that share 1,024 tokens
	// (449,028 distinct blocks with the probes), sha256_cbor, token ids as
	// a bin, and a pool of prompts drawn at random from the stored ones, so
	// every timed query is warm. Before them, every stored prompt is asked
	// once in a random order (cold: all its blocks indexed, never queried
	// before), and the bare hash chain of the same prompts is timed in the
	// same process, so server CPU per query is reported against it.
	"router-8k": {"--engine", "vllm", "--publishers", "4", "--prompts", "1000", "--prompt-tokens", "8192",
		"--system-tokens", "1024", "--groups", "16", "--block-size", "16", "--token-encoding", "bin",
		"--mix", "full=1", "--queries", "1000", "--cold-pass", "--chain-baseline", "--concurrency", "1,8",
		"--unreg-concurrency", "1"},
	// cold-8k is router-8k's index with every stored prompt asked once
	// (cold) and the 2-block request floor measured beside it, at
	// concurrency 1 (issue 28's first target), then warm queries.
	"cold-8k": {"--engine", "vllm", "--publishers", "4", "--prompts", "1000", "--prompt-tokens", "8192",
		"--system-tokens", "1024", "--groups", "16", "--block-size", "16", "--token-encoding", "bin",
		"--mix", "full=1", "--queries", "1000", "--cold-pass", "--chain-baseline", "--floor", "--concurrency", "1",
		"--unreg-concurrency", "1"},
	// steady-8k is router-8k's index asked warm while every publisher
	// keeps storing 4 new prompts a second (issue 38: do the caches pay
	// under continuous ingest?); compare runs with a cache's MiB flag at 0
	// through --server-args.
	"steady-8k": {"--engine", "vllm", "--publishers", "4", "--prompts", "1000", "--prompt-tokens", "8192",
		"--system-tokens", "1024", "--groups", "16", "--block-size", "16", "--token-encoding", "bin",
		"--mix", "full=1", "--queries", "1000", "--steady-ingest", "4", "--concurrency", "1,8",
		"--unreg-concurrency", "1"},
	// fleet is router-8k's index at capacity (issue 43): after ingest,
	// every publisher replaces each prompt it holds by a new one, oldest
	// first, one message per prompt (BlockRemoved + BlockStored), 4 rounds
	// timed alone, then one round with checked queries at concurrency 1
	// and one at 8 (see fleet.go).
	"fleet": {"--engine", "vllm", "--publishers", "4", "--prompts", "1000", "--prompt-tokens", "8192",
		"--system-tokens", "1024", "--groups", "16", "--block-size", "16", "--token-encoding", "bin",
		"--mix", "full=1", "--queries", "1000", "--concurrency", "1,8", "--fleet-rounds", "4",
		"--unreg-concurrency", "1"},
	// cold-64k is long agent contexts: 4 instances, 96 stored prompts of
	// 65,536 tokens in 4 groups sharing 4,096, each asked once, with the
	// floor beside them.
	"cold-64k": {"--engine", "vllm", "--publishers", "4", "--prompts", "96", "--prompt-tokens", "65536",
		"--system-tokens", "4096", "--groups", "4", "--block-size", "16", "--token-encoding", "bin",
		"--mix", "full=1", "--queries", "96", "--cold-pass", "--chain-baseline", "--floor", "--concurrency", "1",
		"--unreg-concurrency", "1"},
}

// expandPreset replaces --preset NAME (or --preset=NAME) by the preset's
// flags, placed first so the rest of the command line overrides them.
func expandPreset(args []string) ([]string, string, error) {
	for i, a := range args {
		name, rest := "", []string(nil)
		switch {
		case a == "--preset" || a == "-preset":
			if i+1 >= len(args) {
				return nil, "", fmt.Errorf("--preset needs a name")
			}
			name, rest = args[i+1], append(slices.Clone(args[:i]), args[i+2:]...)
		case strings.HasPrefix(a, "--preset=") || strings.HasPrefix(a, "-preset="):
			_, name, _ = strings.Cut(a, "=")
			rest = append(slices.Clone(args[:i]), args[i+1:]...)
		default:
			continue
		}
		p, ok := presets[name]
		if !ok {
			return nil, "", fmt.Errorf("--preset %q: unknown (known: router-8k, cold-8k, steady-8k, fleet, cold-64k)", name)
		}
		return append(slices.Clone(p), rest...), name, nil
	}
	return args, "", nil
}

func parseFlags(args []string) (*options, error) {
	o := &options{}
	args, preset, err := expandPreset(args)
	if err != nil {
		return nil, err
	}
	o.preset = preset
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.String("preset", "", "named workload whose flags come before the others (router-8k: the realistic index of issue 19, with --cold-pass and --chain-baseline; cold-8k: the same index asked cold with --floor; steady-8k: the same index asked warm under --steady-ingest 4; fleet: the same index at capacity, every prompt replaced by a new one for --fleet-rounds rounds, then one round per --concurrency level with checked queries; cold-64k: 96 prompts of 64K tokens asked cold with --floor)")
	fs.IntVar(&o.corpus.Prompts, "prompts", 0, "exactly this many stored prompts (0: as many as --blocks needs)")
	fs.BoolVar(&o.coldPass, "cold-pass", false, "after ingest, ask every stored prompt once in a random order (all blocks indexed, never queried before), then once more (the warm pass), and report server CPU per query")
	fs.BoolVar(&o.floor, "floor", false, "after ingest (and the cold pass), time 2-block queries at concurrency 1: the fixed cost of one request, reported beside the levels and subtracted in their ratios; with --cold-pass, a 2-block query and the same query for a model nobody stores also follow each query of the cold and the warm pass, and that paired 2-block floor is what those passes' ratios subtract (the other is reported beside it)")
	fs.Float64Var(&o.steadyIngest, "steady-ingest", 0, "while the query levels run, every publisher stores this many new prompts a second (sharing no block with the corpus, so answers stay exact; each changes the context): caches measured under continuous ingest")
	fs.BoolVar(&o.chainBaseline, "chain-baseline", false, "time the bare hash chain of the stored prompts in this process (thread CPU) before and after the query phases, and report server CPU per query against it")
	fs.StringVar(&o.baseURL, "base-url", "http://127.0.0.1:13333", "server base URL (loopback only); ignored with --spawn")
	fs.StringVar(&o.authToken, "auth-token", "", "bearer token for /register and /unregister (with --spawn, also given to the server)")
	fs.BoolVar(&o.spawn, "spawn", false, "build the server from the repository and start it on a free loopback port")
	fs.StringVar(&o.repo, "repo", "", "repository root for --spawn (default: found from the working directory)")
	fs.StringVar(&o.serverLog, "server-log-level", "WARN", "--log-level for a spawned server")
	fs.BoolVar(&o.serverRace, "server-race", false, "build a --spawn'ed server with the race detector (slower; a data race fails the run)")
	fs.BoolVar(&o.restart, "restart", false, "with --spawn: after the first checked pass, stop the server (SIGTERM), start it again on its state directory, report restart-to-ready and check every answer again")
	serverArgs := fs.String("server-args", "", "extra command-line arguments for a --spawn'ed server, separated by spaces")
	fs.IntVar(&o.serverPID, "server-pid", 0, "server process id, for CPU and RSS figures (set automatically with --spawn)")
	fs.IntVar(&o.serverReplicas, "server-replicas", 1, "with --spawn: start this many servers (each its own process, port and state directory), register every publisher on each, check each one's answers to the whole pool, and send the timed queries to them in turn (--replicas is something else: publishers storing each prompt)")
	targets := fs.String("targets", "", "comma-separated base URLs of servers already running (loopback only), instead of --base-url: every publisher is registered on each, and the timed queries go to them in turn")
	pids := fs.String("server-pids", "", "with --targets: the servers' process ids, comma-separated in the same order, for per-server CPU figures (RSS is the first one's)")
	eng := fs.String("engine", "vllm", "publisher kind: vllm (sha256_cbor), vllm-sha256 (vLLM's defaults: sha256, PYTHONHASHSEED unset), vllm-xxhash (xxhash, PYTHONHASHSEED=0), sglang (sha256_raw) or vllm-rfc1527 (vLLM events under the standard hash, xxh3_64)")
	fs.StringVar(&o.model, "model", "", "model name of the context (default: loadgen-<random>, so runs never collide)")
	fs.IntVar(&o.corpus.Publishers, "publishers", 8, "fake engine publishers")
	fs.IntVar(&o.corpus.Blocks, "blocks", 200000, "blocks all publishers publish together (approximate, rounded up to whole prompts)")
	fs.IntVar(&o.corpus.BlockSize, "block-size", 16, "tokens per block")
	fs.IntVar(&o.corpus.PromptTokens, "prompt-tokens", 8192, "tokens per stored prompt and per query")
	fs.IntVar(&o.corpus.SystemTokens, "system-tokens", 2048, "tokens of each group's shared system prompt")
	fs.IntVar(&o.corpus.Groups, "groups", 8, "groups, each with its own system prompt")
	fs.IntVar(&o.corpus.Replicas, "replicas", 1, "publishers storing each prompt")
	fs.IntVar(&o.corpus.Queries, "queries", 512, "distinct queries in the pool the load cycles through")
	fs.StringVar(&o.mixText, "mix", "full=4,partial=3,system=2,cold=1", "query kinds by weight")
	seed := fs.Uint64("seed", 1, "corpus seed")
	fs.IntVar(&o.batch, "batch", 16, "blocks per BlockStored event")
	conc := fs.String("concurrency", "1,4,16", "comma-separated concurrency levels")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "duration of each level")
	fs.IntVar(&o.unregConc, "unreg-concurrency", 0, "query concurrency while unregistering (default: the highest level)")
	fs.DurationVar(&o.reclaimWindow, "reclaim-window", 0, "before unregistering the last publisher, keep querying this long and report those queries apart: the index reclaims the others' entries meanwhile (0: no pause)")
	fs.IntVar(&o.maxSamples, "max-queries", 5_000_000, "cap on queries per level")
	fs.DurationVar(&o.ingestTimeout, "ingest-timeout", 5*time.Minute, "give up waiting for the index after this long")
	tokEnc := fs.String("token-encoding", "array", "token_ids as a msgpack array or as bin (little-endian int32)")
	fs.BoolVar(&o.json, "json", false, "print the report as JSON on stdout (the Markdown goes to stderr)")
	fs.BoolVar(&o.quiet, "quiet", false, "no progress output")
	o.soak.addFlags(fs)
	o.fleet.addFlags(fs)
	fs.IntVar(&o.serverMemoryMiB, "server-memory-mib", 0, "run a --spawn'ed server under GOMEMLIMIT of this many MiB (0: none; a GOMEMLIMIT in the environment reaches the server too, but also limits the load generator)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	o.serverArgs = strings.Fields(*serverArgs)
	if o.targets, err = parseTargets(*targets); err != nil {
		return nil, err
	}
	if o.serverPIDs, err = parsePIDs(*pids, len(o.targets)); err != nil {
		return nil, err
	}
	if err := o.validateReplicas(); err != nil {
		return nil, err
	}
	if o.soak.duration != 0 {
		if err := o.soak.validate(); err != nil {
			return nil, err
		}
	}
	if fs.NArg() != 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.serverMemoryMiB < 0 || (o.serverMemoryMiB > 0 && !o.spawn) {
		return nil, errors.New("--server-memory-mib must not be negative and needs --spawn")
	}
	if err := o.validateFleet(); err != nil {
		return nil, err
	}
	switch engine(*eng) {
	case engineVLLM, engineVLLMDefaults, engineVLLMXXHash, engineSGLang, engineVLLMStd:
		o.engine = engine(*eng)
	default:
		return nil, fmt.Errorf("--engine %q: want vllm, vllm-sha256, vllm-xxhash, sglang or vllm-rfc1527", *eng)
	}
	switch *tokEnc {
	case "array":
	case "bin":
		o.binTokens = true
	default:
		return nil, fmt.Errorf("--token-encoding %q: want array or bin", *tokEnc)
	}
	for _, f := range strings.Split(*conc, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 4096 {
			return nil, fmt.Errorf("--concurrency %q: want positive integers up to 4096", *conc)
		}
		o.levels = append(o.levels, n)
	}
	if o.unregConc <= 0 {
		o.unregConc = slices.Max(o.levels)
	}
	if o.duration <= 0 || o.duration > time.Hour {
		return nil, fmt.Errorf("--duration must be in (0, 1h]")
	}
	if o.batch < 1 {
		return nil, fmt.Errorf("--batch must be positive")
	}
	if o.reclaimWindow < 0 || o.reclaimWindow > time.Minute {
		return nil, fmt.Errorf("--reclaim-window must be between 0 and 1m")
	}
	if o.corpus.Publishers > 4096 {
		return nil, fmt.Errorf("--publishers: at most 4096 (the server's service limit)")
	}
	if o.maxSamples < 1 {
		return nil, fmt.Errorf("--max-queries must be positive")
	}
	if o.coldPass && o.restart {
		return nil, fmt.Errorf("--cold-pass and --restart do not combine")
	}
	m, err := parseMix(o.mixText)
	if err != nil {
		return nil, err
	}
	o.corpus.Mix = m
	o.corpus.Seed = *seed
	o.corpus.Vocab = 151936
	if o.model == "" {
		o.model = fmt.Sprintf("loadgen-%08x", rand.Uint32())
	}
	return o, o.corpus.validate()
}

// validateReplicas refuses combinations of the multi-server flags that
// would silently measure something else than asked.
func (o *options) validateReplicas() error {
	switch {
	case o.serverReplicas < 1 || o.serverReplicas > maxServerReplicas:
		return fmt.Errorf("--server-replicas must be between 1 and %d", maxServerReplicas)
	case o.serverReplicas > 1 && !o.spawn:
		return errors.New("--server-replicas needs --spawn (for servers already running, use --targets)")
	case o.targets != nil && o.spawn:
		return errors.New("--targets and --spawn do not combine (--spawn --server-replicas N starts N servers)")
	case o.serverPIDs != nil && o.targets == nil:
		return errors.New("--server-pids needs --targets")
	case o.targets != nil && o.serverPID != 0:
		return errors.New("with --targets, give process ids with --server-pids")
	case o.restart && !o.spawn:
		return errors.New("--restart needs --spawn: it stops and starts the server it spawned")
	case o.servers() > 1 && o.restart:
		return errors.New("--restart restarts one server; it does not combine with several")
	case (o.serverReplicas > 1 || o.targets != nil) && o.soak.duration != 0:
		return errors.New("--soak drives one server (--base-url or --spawn); it does not combine with --server-replicas or --targets")
	}
	return nil
}

// servers is how many servers the run drives.
func (o *options) servers() int {
	if o.targets != nil {
		return len(o.targets)
	}
	return o.serverReplicas
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if o.soak.duration > 0 {
		code := soakMain(ctx, o)
		stop()
		os.Exit(code)
	}
	r, err := run(ctx, o)
	if r != nil {
		if o.json {
			r.writeMarkdown(os.Stderr)
			_ = r.writeJSON(os.Stdout)
		} else {
			r.writeMarkdown(os.Stdout)
		}
	}
	code := 0
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		code = 1
	}
	if r != nil && r.Failures > 0 {
		fmt.Fprintf(os.Stderr, "loadgen: %d wrong answers or failed queries\n", r.Failures)
		code = 1
	}
	stop()
	os.Exit(code)
}

// serverOptions are the build and start options of a spawned server. A
// soak adds its memo size (for the memos and the verified links) unless --soak-memo-mib is negative (see
// soakConfig.memoMiB).
func (o *options) serverOptions() serverOptions {
	so := serverOptions{token: o.authToken, logLevel: o.serverLog, race: o.serverRace, args: o.serverArgs}
	if l := gomemlimit(o); l != "" {
		so.env = append(so.env, "GOMEMLIMIT="+l)
	}
	if o.soak.duration > 0 && o.soak.memoMiB >= 0 {
		// First, so that --server-args can still override them.
		so.args = append([]string{fmt.Sprintf("--hash-memo-mib=%d", o.soak.memoMiB), fmt.Sprintf("--token-memo-mib=%d", o.soak.memoMiB),
			fmt.Sprintf("--link-memo-mib=%d", o.soak.memoMiB)}, so.args...)
	}
	return so
}

// session holds what must be released at exit, whatever phase failed.
type session struct {
	o          *options
	zctx       *zmq.Context // the run's own, so that runs in one process (tests) do not share one
	pubs       []*publisher
	registered []bool
	// apis are every server driven, servers every one spawned, spawnRoot
	// the directory that holds several spawned ones.
	apis      []*api
	servers   []*spawned
	spawnRoot string
}

// close unregisters whatever is still registered (best effort: the run is
// over), closes every socket and stops a spawned server.
func (s *session) close() error {
	for _, a := range s.apis {
		// Cleanup after a failure must not hang on a hung server.
		a.timeout = 3 * time.Second
		for i, p := range s.pubs {
			if s.registered[i] {
				_ = a.unregister(p.instance)
			}
		}
		a.close()
	}
	for _, p := range s.pubs {
		p.close()
	}
	termContext(s.zctx, "")
	var errs []error
	for _, srv := range s.servers {
		errs = append(errs, srv.cleanup())
	}
	if s.spawnRoot != "" {
		os.RemoveAll(s.spawnRoot)
	}
	return errors.Join(errs...)
}

// termContext terminates a run's ZMQ context (nil: none). With every
// socket closed (linger 0) that is immediate; the timeout only guards
// against a socket we missed, which it reports (what names the run).
func termContext(zctx *zmq.Context, what string) {
	if zctx == nil {
		return
	}
	termed := make(chan struct{})
	go func() { _ = zctx.Term(); close(termed) }()
	select {
	case <-termed:
	case <-time.After(2 * time.Second):
		fmt.Fprintf(os.Stderr, "loadgen: %sZMQ context did not terminate; a socket was left open\n", what)
	}
}

// logf writes a progress note on stderr.
func (s *session) logf(format string, args ...any) {
	if !s.o.quiet {
		fmt.Fprintf(os.Stderr, format+"\n", args...)
	}
}

// sampler reads the server's CPU time and RSS, or -1 without a pid.
type sampler struct{ pid int }

func (m sampler) cpu() time.Duration {
	if m.pid <= 0 {
		return -1
	}
	d, err := procCPU(m.pid)
	if err != nil {
		return -1
	}
	return d
}

// faults reads the server's minor faults and system time; ok is false
// when unknown.
func (m sampler) faults() (statFaults, bool) {
	if m.pid <= 0 {
		return statFaults{}, false
	}
	f, err := procFaults(m.pid)
	return f, err == nil
}

// peak is the server's VmHWM, -1 when unknown.
func (m sampler) peak() int64 {
	if m.pid <= 0 {
		return -1
	}
	b, err := procPeakRSS(m.pid)
	if err != nil {
		return -1
	}
	return b
}

func (m sampler) rss() int64 {
	if m.pid <= 0 {
		return -1
	}
	b, err := procRSS(m.pid)
	if err != nil {
		return -1
	}
	return b
}

// memory reads the server's RSS and its anonymous part into *rss and *anon
// (-1 when unknown). The rest is file-backed: code and shared-library pages
// the server has touched, which grow as new paths run and never return.
func (m sampler) memory(rss, anon *int64) {
	*rss, *anon = m.rss(), -1
	if m.pid > 0 {
		if b, err := procAnonRSS(m.pid); err == nil {
			*anon = b
		}
	}
}

// perUnit divides a CPU delta by a count in µs, or -1 when unknown. A zero
// delta is unknown too: /proc counts in 10 ms ticks, and a phase shorter
// than one tick of server work cannot be told apart from no work.
func perUnit(c0, c1 time.Duration, n int) float64 {
	if c0 < 0 || c1 <= c0 || n == 0 {
		return -1
	}
	return us(c1-c0) / float64(n)
}

func run(ctx context.Context, o *options) (rep *report, err error) {
	s := &session{o: o}
	defer func() {
		if cerr := s.close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	targets, pids := []string{o.baseURL}, []int{o.serverPID}
	if o.targets != nil {
		targets, pids = o.targets, o.serverPIDs
	}
	if o.spawn {
		repo := o.repo
		if repo == "" {
			if repo, err = findRepoRoot(); err != nil {
				return nil, err
			}
		}
		if o.serverReplicas > 1 {
			if s.servers, s.spawnRoot, err = spawnReplicas(ctx, repo, o.serverOptions(), o.serverReplicas); err != nil {
				return nil, err
			}
		} else {
			srv, err := spawnServer(ctx, repo, o.serverOptions())
			if err != nil {
				return nil, err
			}
			s.servers = []*spawned{srv}
		}
		targets, pids = nil, nil
		for _, srv := range s.servers {
			targets, pids = append(targets, srv.base), append(pids, srv.pid())
			s.logf("server pid %d at %s", srv.pid(), srv.base)
		}
	}
	// RSS is the first server's; CPU is every server's.
	fl := make(fleet, len(targets))
	for i := range fl {
		if i < len(pids) {
			fl[i] = sampler{pid: pids[i]}
		}
	}
	m := fl[0]
	for _, base := range targets {
		a, err := newAPI(base, o.authToken, max(slices.Max(o.levels), o.unregConc, o.corpus.Publishers)+8)
		if err != nil {
			return nil, err
		}
		s.apis = append(s.apis, a)
		if !a.healthy() {
			return nil, fmt.Errorf("%s/healthz does not answer 200", base)
		}
	}

	genStart := time.Now()
	c, err := newCorpus(o.corpus)
	if err != nil {
		return nil, err
	}
	cfg := c.cfg
	rep = &report{
		ServerReplicas: len(s.apis), Targets: targets,
		Engine: string(o.engine), Publishers: cfg.Publishers, BlockSize: cfg.BlockSize,
		PromptTokens: cfg.PromptTokens / cfg.BlockSize * cfg.BlockSize, SystemTokens: cfg.SystemTokens / cfg.BlockSize * cfg.BlockSize,
		Groups: cfg.Groups, Replicas: cfg.Replicas, StoredPrompts: len(c.prompts), PoolQueries: len(c.queries),
		PoolKinds: map[string]int{}, TokenEncoding: map[bool]string{false: "array", true: "bin"}[o.binTokens],
	}
	for k := range numKinds {
		rep.PoolKinds[k.String()] = c.kinds[k]
	}
	rep.RSS = rssResult{-1, -1, -1, -1, -1} // phases not reached stay unknown
	rep.PeakRSS = peakResult{-1, -1}
	rep.RSSAnon = rep.RSS
	rep.LoadAverage[1] = -1
	fails := &failures{}
	defer func() {
		rep.Failures = fails.count.Load()
		fails.mu.Lock()
		rep.FailureNotes = slices.Clone(fails.first)
		fails.mu.Unlock()
	}()
	m.memory(&rep.RSS.Start, &rep.RSSAnon.Start)
	rep.LoadAverage[0] = loadAverage()

	prof, err := hashing.Resolve(o.engine.hashSpec())
	if err != nil {
		return rep, fmt.Errorf("hash profile: %w", err)
	}
	ids := make([]string, cfg.Publishers)
	s.registered = make([]bool, cfg.Publishers)
	if s.zctx, err = zmq.NewContext(); err != nil {
		return rep, fmt.Errorf("ZMQ context: %w", err)
	}
	for i := range cfg.Publishers {
		ids[i] = fmt.Sprintf("%s-e%d", o.model, i)
		p, err := newPublisher(s.zctx, i, ids[i])
		if err != nil {
			return rep, fmt.Errorf("publisher %d: %w", i, err)
		}
		s.pubs = append(s.pubs, p)
	}
	// Hashing and encoding are done before anything is timed; publishers
	// are independent, so they are prepared in parallel.
	if err := parallel(s.pubs, func(p *publisher) error { return p.prepare(c, o.engine, &prof, o.batch) }); err != nil {
		return rep, err
	}
	pool := make([]preparedQuery, len(c.queries))
	for i := range c.queries {
		b, err := queryBody(o.model, cfg.BlockSize, c.queries[i].tokens, "", o.binTokens)
		if err != nil {
			return rep, err
		}
		pool[i] = preparedQuery{query: &c.queries[i], body: b}
	}
	var cold []preparedQuery
	if o.coldPass {
		if cold, err = coldPool(c, o.model, o.binTokens); err != nil {
			return rep, err
		}
	}
	for _, p := range s.pubs {
		rep.Ingest.BlocksPublished += p.blocks
		rep.Ingest.Messages += len(p.payloads)
	}
	rep.Ingest.DistinctBlocks = c.distinctBlocks()
	s.logf("corpus: %d prompts, %d blocks in %d messages (%d distinct), %d queries, prepared in %v",
		len(c.prompts), rep.Ingest.BlocksPublished, rep.Ingest.Messages, c.distinctBlocks(), len(pool), time.Since(genStart).Round(time.Millisecond))

	// Register on every server and wait for each subscription to carry a
	// probe.
	for i, p := range s.pubs {
		for _, a := range s.apis {
			if err := a.register(o.engine.registration(p.endpoint, o.model, p.instance, cfg.BlockSize)); err != nil {
				return rep, err
			}
			s.registered[i] = true
		}
	}
	if err := parallel(s.pubs, func(p *publisher) error { return s.awaitProbe(ctx, p, cfg.BlockSize) }); err != nil {
		return rep, err
	}
	s.logf("all %d subscriptions carry events", len(s.pubs))

	// Ingest.
	m.memory(&rep.RSS.BeforeIngest, &rep.RSSAnon.BeforeIngest)
	cpu0, self0 := total(fl.cpus()), selfCPU()
	faults0, faultsKnown := fl[0].faults()
	if err := s.ingest(ctx, c.distinctBlocks()+len(s.pubs), rep); err != nil {
		return rep, err
	}
	// Each server ingests every block.
	rep.Ingest.ServerCPUPerBlockUS = perUnit(cpu0, total(fl.cpus()), rep.Ingest.BlocksPublished*len(s.apis))
	// The publishers run in this process, on the same cores.
	rep.Ingest.PublisherCPUPerBlockUS = perUnit(self0, selfCPU(), rep.Ingest.BlocksPublished)
	// The blocks are visible; their verification may still wait. The
	// query phases start once it is done, so that what they measure does
	// not depend on how far it got.
	polls, err := s.awaitVerified(ctx, rep)
	if err != nil {
		return rep, err
	}
	cpuVerified := total(fl.cpus())
	if f, ok := fl[0].faults(); ok && faultsKnown {
		// The first server's: every server ingests every block.
		n := float64(rep.Ingest.BlocksPublished)
		rep.Ingest.FaultsPerBlock = float64(f.minor-faults0.minor) / n
		rep.Ingest.SystemCPUPerBlockUS = float64((f.system - faults0.system).Microseconds()) / n
	}
	// Less what reading /metrics took the servers while waiting, measured
	// on a few more reads.
	const probes = 5
	for range probes {
		if _, err := s.pendingLinks(); err != nil {
			return rep, err
		}
	}
	perPoll := (total(fl.cpus()) - cpuVerified) / probes
	rep.Ingest.ServerCPUPerBlockVerifiedUS = perUnit(cpu0, cpuVerified-time.Duration(polls)*perPoll, rep.Ingest.BlocksPublished*len(s.apis))
	s.logf("server CPU per block until verified %.2f µs (less %d reads of /metrics at %v each)", rep.Ingest.ServerCPUPerBlockVerifiedUS, polls, perPoll)
	m.memory(&rep.RSS.AfterIngest, &rep.RSSAnon.AfterIngest)
	rep.PeakRSS.AfterIngest = m.peak()

	var chainPrompts [][]int32
	if o.chainBaseline {
		for i := range c.prompts {
			chainPrompts = append(chainPrompts, c.prompts[i].tokens)
		}
		rep.Chain = &chainResult{Prompts: len(chainPrompts)}
		rep.Chain.add(chainCPUPerPrompt(&prof, cfg.BlockSize, chainPrompts))
	}
	if o.coldPass {
		// What ingest left the servers to do (a garbage collection of
		// the heap it grew) is not the cold queries' cost.
		s.waitQuiet(ctx, fl)
		rep.HugeBeforeCold = -1
		if pid := fl[0].pid; pid > 0 {
			if b, err := procAnonHuge(pid); err == nil {
				rep.HugeBeforeCold = b
			}
		}
		var paired, body []preparedQuery
		if o.floor {
			if paired, err = floorPool(c, o.model, o.binTokens); err != nil {
				return rep, err
			}
			if body, err = bodyPool(c, cold, o.model, o.binTokens); err != nil {
				return rep, err
			}
		}
		s.logf("cold pass: %d stored prompts, each asked once", len(cold))
		cr, err := s.pairedPass(ctx, "cold pass", cold, paired, body, ids, fails, fl)
		rep.Cold = cr
		if cr != nil {
			rep.Checked += int64(cr.Queries + 2*cr.FloorQueries)
		}
		if err != nil {
			return rep, err
		}
		// The same prompts again: their digests now come from the prefix memo.
		wr, err := s.pairedPass(ctx, "warm pass", cold, paired, body, ids, fails, fl)
		rep.Warm = wr
		if wr != nil {
			rep.Checked += int64(wr.Queries + 2*wr.FloorQueries)
		}
		if err != nil {
			return rep, err
		}
		if o.chainBaseline {
			rep.Chain.add(chainCPUPerPrompt(&prof, cfg.BlockSize, chainPrompts))
		}
	}
	if o.floor {
		fp, err := floorPool(c, o.model, o.binTokens)
		if err != nil {
			return rep, err
		}
		fr, err := s.floorPass(ctx, fp, ids, fails, fl)
		rep.Floor = fr
		if fr != nil {
			rep.Checked += int64(fr.Queries)
		}
		if err != nil {
			return rep, err
		}
	}

	// One pass over the pool on each server checks every answer once
	// before load: every replica must give the same, expected, answers.
	for _, a := range s.apis {
		dv := &driver{targets: []*api{a}, pool: pool, ids: ids, fails: fails, pres: func(int) presence { return mustMatch }}
		t0 := time.Now()
		verified, _ := dv.run(ctx, 1, t0, t0.Add(5*time.Minute), len(pool), nil)
		rep.Checked += int64(len(verified))
		at := ""
		if len(s.apis) > 1 {
			at = " from " + a.base
		}
		s.logf("verified %d pool answers%s in %v, %d wrong", len(verified), at, time.Since(t0).Round(time.Millisecond), fails.count.Load())
		if err := ctx.Err(); err != nil {
			return rep, err
		}
	}
	if o.fleet.rounds > 0 {
		// The pool's answers hold for the corpus only: after the fleet
		// rounds the servers hold other prompts, so the run ends here
		// (session.close unregisters).
		fr, err := s.fleetPhase(ctx, c, &prof, ids, fails, fl)
		rep.Fleet = fr
		if fr != nil {
			rep.Checked += fr.Answers
		}
		rep.PeakRSS.End = m.peak()
		rep.LoadAverage[1] = loadAverage()
		return rep, err
	}
	d := &driver{targets: s.apis, pool: pool, ids: ids, fails: fails, pres: func(int) presence { return mustMatch }}
	if o.restart { // parseFlags made sure the server is spawned
		r, err := s.restartServer(ctx, d, cfg.BlockSize)
		rep.Restart = r
		if err != nil {
			return rep, err
		}
		m = sampler{pid: s.servers[0].pid()}
		fl = fleet{m}
		rep.Checked += int64(r.Checked)
	}

	stopSteady := s.steadyIngest(ctx, &prof, o.steadyIngest)
	for _, conc := range o.levels {
		memo0, memoErr := memoStatsAll(s.apis)
		f0, cs0, self0 := fails.count.Load(), fl.cpus(), selfCPU()
		stopBar := s.bar(fmt.Sprintf("concurrency %d", conc), o.duration)
		t0 := time.Now()
		samples, elapsed := d.run(ctx, conc, t0, t0.Add(o.duration), o.maxSamples, nil)
		stopBar()
		cs1, self1 := fl.cpus(), selfCPU()
		c0, c1 := total(cs0), total(cs1)
		lat := latencies(samples)
		l := levelResult{
			Concurrency: conc, Queries: len(samples), Seconds: elapsed.Seconds(),
			QPS:   float64(len(samples)) / elapsed.Seconds(),
			P50US: us(percentile(lat, 0.50)), P99US: us(percentile(lat, 0.99)), P999US: us(percentile(lat, 0.999)),
			MaxUS: us(percentile(lat, 1)), ServerCPUPerQueryUS: perUnit(c0, c1, len(samples)),
			ClientCPUPerQueryUS: perUnit(self0, self1, len(samples)),
			ServerCPUCores:      cores(c0, c1, elapsed), ClientCPUCores: cores(self0, self1, elapsed),
			Failures:     fails.count.Load() - f0,
			AnswerHitPct: -1, PrefixMemoHitPct: -1, TokenMemoHitPct: -1, MemoBytes: -1,
		}
		for i, n := range perTarget(samples, len(s.apis)) {
			l.PerServer = append(l.PerServer, replicaLevel{Target: s.apis[i].base, Queries: n, QPS: float64(n) / elapsed.Seconds(),
				ServerCPUPerQueryUS: perUnit(cs0[i], cs1[i], n), ServerCPUCores: cores(cs0[i], cs1[i], elapsed)})
		}
		if memo1, err := memoStatsAll(s.apis); err == nil && memoErr == nil {
			l.PrefixMemoHitPct = hitPct(memo0.prefixHits, memo0.prefixMisses, memo1.prefixHits, memo1.prefixMisses)
			l.TokenMemoHitPct = hitPct(memo0.tokenHits, memo0.tokenMisses, memo1.tokenHits, memo1.tokenMisses)
			l.AnswerHitPct = hitPct(memo0.answerHits, memo0.answerMisses, memo1.answerHits, memo1.answerMisses)
			if memo1.prefixBytes >= 0 && memo1.tokenBytes >= 0 {
				l.MemoBytes = int64(memo1.prefixBytes + memo1.tokenBytes + max(0, memo1.answerBytes))
			}
		}
		rep.Levels = append(rep.Levels, l)
		rep.Checked += int64(len(samples))
		s.logf("concurrency %d: %d queries, %.0f/s, p50 %s p99 %s p999 %s, server CPU/query %s, %d wrong",
			conc, l.Queries, l.QPS, fmtUS(l.P50US), fmtUS(l.P99US), fmtUS(l.P999US), fmtUS(l.ServerCPUPerQueryUS), l.Failures)
		if err := ctx.Err(); err != nil {
			return rep, err
		}
	}
	if n := stopSteady(); o.steadyIngest > 0 {
		rep.SteadyIngest = &steadyResult{PromptsPerSecPerPublisher: o.steadyIngest, Blocks: n}
		s.logf("steady ingest: %d blocks stored during the levels", n)
	}
	if o.chainBaseline {
		rep.Chain.add(chainCPUPerPrompt(&prof, cfg.BlockSize, chainPrompts))
	}
	m.memory(&rep.RSS.AfterLoad, &rep.RSSAnon.AfterLoad)

	if err := s.unregisterUnderLoad(ctx, d, rep); err != nil {
		return rep, err
	}
	// The runtime returns freed memory in the background: RSS is read until
	// it is back within 20 % of its value before ingest, for at most 5 s
	// after the last unregistration.
	rep.AfterUnregSeconds = awaitRSS(m, rep.RSS.BeforeIngest, rep.unregEnd, 5*time.Second)
	m.memory(&rep.RSS.AfterUnreg, &rep.RSSAnon.AfterUnreg)
	rep.PeakRSS.End = m.peak()

	rep.LoadAverage[1] = loadAverage()
	return rep, nil
}

// restartServer stops the spawned server gracefully, starts it again on the
// same state directory and measures how long it takes to answer /readyz
// 200: its snapshot loaded, and every publisher's next message (a probe)
// received in order. Then every pool answer is checked again against the
// same expectations.
func (s *session) restartServer(ctx context.Context, d *driver, blockSize int) (*restartResult, error) {
	r := &restartResult{}
	t0 := time.Now()
	old := s.servers[0]
	if err := old.stop(); err != nil {
		return r, fmt.Errorf("stop for restart: %w", err)
	}
	r.StopMS = ms(time.Since(t0))
	t1 := time.Now()
	ns, err := startServer(ctx, old.dir, old.bin, old.so, 10)
	if err != nil {
		return r, fmt.Errorf("restart: %w", err)
	}
	s.servers[0] = ns
	r.ToHealthyMS = ms(time.Since(t1))
	s.apis[0].close()
	a, err := newAPI(ns.base, s.o.authToken, max(slices.Max(s.o.levels), s.o.unregConc, len(s.pubs))+8)
	if err != nil {
		return r, err
	}
	s.apis[0] = a
	d.targets = []*api{a}
	if err := parallel(s.pubs, func(p *publisher) error { return s.awaitProbe(ctx, p, blockSize) }); err != nil {
		return r, err
	}
	for deadline := time.Now().Add(time.Minute); ; {
		status, _, err := a.do("GET", "/readyz", nil, false)
		if err == nil && status == 200 {
			break
		}
		if time.Now().After(deadline) {
			return r, fmt.Errorf("not ready a minute after the restart (last %d, %v)", status, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	r.ToReadyMS = ms(time.Since(t1))
	failed := d.fails.count.Load()
	t2 := time.Now()
	verified, _ := d.run(ctx, 1, t2, t2.Add(5*time.Minute), len(d.pool), nil)
	r.Checked, r.Failures = len(verified), d.fails.count.Load()-failed
	s.logf("restart: stopped in %.0f ms, healthy after %.0f ms, ready after %.0f ms; %d answers checked again, %d wrong",
		r.StopMS, r.ToHealthyMS, r.ToReadyMS, r.Checked, r.Failures)
	return r, ctx.Err()
}

// parallel runs f for every publisher concurrently and returns the first
// error. Each publisher's socket is used by one goroutine only.
func parallel(pubs []*publisher, f func(p *publisher) error) error {
	errs := make([]error, len(pubs))
	var wg sync.WaitGroup
	for i, p := range pubs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = f(p) }()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// probeTimeout bounds the wait for one subscription to connect.
const probeTimeout = 15 * time.Second

// waitQuiet waits, up to quietTimeout, until the servers' CPU time has
// grown by less than quietIdle in each of quietWindows windows in a
// row: until they are done with background work before a phase that
// charges them its CPU: snapshots, evictions and verification that
// ingest left behind.
func (s *session) waitQuiet(ctx context.Context, fl fleet) {
	const (
		quietWindow  = 100 * time.Millisecond
		quietIdle    = 2 * time.Millisecond
		quietWindows = 12 // windows: 1.2 s
		quietTimeout = 15 * time.Second
	)
	start := time.Now()
	prev := total(fl.cpus())
	for quiet := 0; time.Since(start) < quietTimeout && prev >= 0; {
		select {
		case <-ctx.Done():
			return
		case <-time.After(quietWindow):
		}
		now := total(fl.cpus())
		if quiet++; now-prev >= quietIdle {
			quiet = 0
		}
		if quiet == quietWindows {
			s.logf("servers idle after %v", time.Since(start).Round(time.Millisecond))
			return
		}
		prev = now
	}
	s.logf("servers still busy after %v; going on", quietTimeout)
}

// awaitProbe publishes p's probe block until a /query for it, restricted
// to p's instance, shows it on the device tier of every server. A SUB
// socket joins a PUB asynchronously and messages published before that
// are lost; sending the corpus only after the probe arrived means none of
// it is lost, and the first received probe is the server's sequence
// baseline.
func (s *session) awaitProbe(ctx context.Context, p *publisher, blockSize int) error {
	body, err := queryBody(s.o.model, blockSize, p.probeTok, p.instance, false)
	if err != nil {
		return err
	}
	seen := make([]bool, len(s.apis))
	deadline := time.Now().Add(probeTimeout)
	for time.Now().Before(deadline) {
		if err := p.send(p.probe); err != nil {
			return fmt.Errorf("%s: probe: %w", p.instance, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		all := true
		for i, a := range s.apis {
			if seen[i] {
				continue
			}
			status, resp, err := a.do("POST", "/query", body, false)
			if err != nil {
				return err
			}
			if status != 200 {
				return fmt.Errorf("%s: probe query: %d %s", p.instance, status, describe(resp))
			}
			var r queryResponse
			if err := msgpack.Unmarshal(resp, &r); err != nil {
				return fmt.Errorf("%s: probe answer: %w", p.instance, err)
			}
			seen[i] = r.Instances[p.instance].Device == int64(blockSize)
			all = all && seen[i]
		}
		if all {
			return nil
		}
	}
	return fmt.Errorf("%s: probe not visible on every server after %v", p.instance, probeTimeout)
}

// awaitVerified waits until no server has stored blocks waiting for link
// verification (conductor_link_verify_pending_blocks, absent on a server
// without links) and notes how long after the start of ingest that was.
// It returns how many times it read the servers' /metrics.
func (s *session) awaitVerified(ctx context.Context, rep *report) (int, error) {
	start := time.Now()
	deadline := start.Add(s.o.ingestTimeout)
	for polls := 1; ; polls++ {
		waiting, err := s.pendingLinks()
		if err != nil {
			return polls, err
		}
		if waiting == 0 {
			rep.Ingest.VerifiedSeconds = rep.Ingest.Seconds + time.Since(start).Seconds()
			rep.Ingest.VerifiedBlocksPerSec = float64(rep.Ingest.BlocksPublished) / rep.Ingest.VerifiedSeconds
			s.logf("verified in %.0f ms more: %.0f blocks/s until verified", time.Since(start).Seconds()*1000, rep.Ingest.VerifiedBlocksPerSec)
			return polls, nil
		}
		if time.Now().After(deadline) {
			return polls, fmt.Errorf("link verification still waiting for %.0f blocks after %v", waiting, s.o.ingestTimeout)
		}
		select {
		case <-ctx.Done():
			return polls, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// pendingLinks is the stored blocks waiting for link verification on all
// servers.
func (s *session) pendingLinks() (float64, error) {
	waiting := 0.0
	for _, a := range s.apis {
		m, _, err := a.metrics()
		if err != nil {
			return 0, err
		}
		waiting += max(m.value("conductor_link_verify_pending_blocks", nil), 0)
	}
	return waiting, nil
}

// ingest sends every publisher's corpus concurrently and polls
// /global_view until prefix_count reaches want. Every block prompt suffix
// is unique, so the count can only reach want once every message arrived;
// a lost message instead makes its source stale, which /readyz reports.
func (s *session) ingest(ctx context.Context, want int, rep *report) error {
	start := time.Now()
	sendErr := make(chan error, 1)
	go func() {
		sendErr <- parallel(s.pubs, func(p *publisher) error {
			for _, msg := range p.payloads {
				if err := p.send(msg); err != nil {
					return fmt.Errorf("%s: %w", p.instance, err)
				}
			}
			return nil
		})
	}()
	sent := false
	// Never return while senders still use the sockets: session.close
	// closes them, and a ZMQ socket must not be used from two goroutines.
	defer func() {
		if !sent {
			<-sendErr
		}
	}()
	bar := newProgress("ingest", s.o.quiet)
	defer bar.done()
	deadline := start.Add(s.o.ingestTimeout)
	lastStale := time.Time{}
	for {
		n, found, over, err := s.prefixCounts()
		if err != nil {
			return err
		}
		elapsed := time.Since(start)
		bar.update(float64(n), float64(want), fmt.Sprintf("%d/%d blocks, %.0f/s", n, want, float64(n)/elapsed.Seconds()))
		if found && n == want {
			if !sent {
				sent = true
				if err := <-sendErr; err != nil {
					return err
				}
			}
			rep.Ingest.Seconds = elapsed.Seconds()
			rep.Ingest.BlocksPerSec = float64(rep.Ingest.BlocksPublished) / elapsed.Seconds()
			bar.done()
			s.logf("ingested %d blocks in %v: %.0f blocks/s", rep.Ingest.BlocksPublished, elapsed.Round(time.Millisecond), rep.Ingest.BlocksPerSec)
			return nil
		}
		if over > want {
			return fmt.Errorf("prefix_count %d exceeds the %d distinct blocks published", over, want)
		}
		if !sent {
			select {
			case err := <-sendErr:
				sent = true
				if err != nil {
					return err
				}
			default:
			}
		}
		if time.Since(lastStale) > time.Second {
			lastStale = time.Now()
			stale := 0
			for _, a := range s.apis {
				n, err := a.staleSources()
				if err != nil {
					return err
				}
				stale += n
			}
			if stale > 0 {
				return fmt.Errorf("%d source(s) went stale during ingest (a message was lost); prefix_count %d of %d", stale, n, want)
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("ingest timed out after %v: prefix_count %d of %d", s.o.ingestTimeout, n, want)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// prefixCounts reads our context's prefix_count on every server: the
// smallest, whether every server has the context, and the largest.
func (s *session) prefixCounts() (least int, found bool, most int, err error) {
	found = true
	for i, a := range s.apis {
		n, f, err := a.prefixCount(s.o.model, s.cfgBlockSize())
		if err != nil {
			return 0, false, 0, err
		}
		if i == 0 || n < least {
			least = n
		}
		most = max(most, n)
		found = found && f
	}
	return least, found, most, nil
}

func (s *session) cfgBlockSize() int { return s.o.corpus.BlockSize }

// bar shows a time-based progress bar until the returned func is called.
func (s *session) bar(label string, total time.Duration) func() {
	if s.o.quiet {
		return func() {}
	}
	p := newProgress(label, false)
	quit := make(chan struct{})
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				e := time.Since(start)
				p.update(e.Seconds(), total.Seconds(), fmt.Sprintf("%.1fs/%.0fs", e.Seconds(), total.Seconds()))
			}
		}
	}()
	return func() { close(quit); <-done; p.done() }
}

// unregLoadCap bounds the query load of the unregistration phase even if
// unregister calls hang until their own timeouts.
const unregLoadCap = 2 * time.Minute

// unregisterUnderLoad unregisters every publisher, one after another, while
// queries keep running, and measures how long that takes and how slow the
// queries overlapping it get. Answers are still checked: an instance being
// unregistered may vanish, one already unregistered must not appear, the
// others must stay exact.
func (s *session) unregisterUnderLoad(ctx context.Context, d0 *driver, rep *report) error {
	conc := s.o.unregConc
	d := &driver{targets: d0.targets, pool: d0.pool, ids: d0.ids, fails: d0.fails, states: make([]atomic.Uint32, len(d0.ids))}
	f0 := d.fails.count.Load()
	stop := make(chan struct{})
	t0 := time.Now()
	type result struct {
		samples []sample
	}
	out := make(chan result, 1)
	go func() {
		smp, _ := d.run(ctx, conc, t0, t0.Add(unregLoadCap), s.o.maxSamples, stop)
		out <- result{smp}
	}()
	// Let the load reach a steady state first.
	time.Sleep(300 * time.Millisecond)
	uStart := time.Since(t0)
	var slowest, wStart, wEnd time.Duration
	var uerr error
	for i, p := range s.pubs {
		if i == len(s.pubs)-1 && i > 0 && s.o.reclaimWindow > 0 {
			// Every other publisher is gone; the service reclaims their
			// entries now, while the last one's answers stay exact.
			wStart = time.Since(t0)
			time.Sleep(s.o.reclaimWindow)
			wEnd = time.Since(t0)
		}
		// With several servers the publisher is gone only once every
		// server unregistered it; until then it may still answer anywhere.
		d.states[i].Store(uint32(mayVanish))
		for _, a := range s.apis {
			c0 := time.Now()
			if err := a.unregister(p.instance); err != nil {
				uerr = err
				break
			}
			slowest = max(slowest, time.Since(c0))
		}
		if uerr != nil {
			break
		}
		s.registered[i] = false
		d.states[i].Store(uint32(mustBeGone))
	}
	uEnd := time.Since(t0)
	rep.unregEnd = t0.Add(uEnd)
	// Keep querying briefly: answers after the last unregistration must
	// be empty.
	time.Sleep(300 * time.Millisecond)
	close(stop)
	res := <-out
	if uerr != nil {
		return uerr
	}
	var overlapping, inWindow []sample
	for _, smp := range res.samples {
		end := smp.start + smp.lat
		switch {
		case wEnd > 0 && smp.start >= wStart && end <= wEnd:
			inWindow = append(inWindow, smp)
		case smp.start < uEnd && end > uStart:
			overlapping = append(overlapping, smp)
		}
	}
	lat := latencies(overlapping)
	rep.Unreg = unregResult{
		Publishers: len(s.pubs), Concurrency: conc, Seconds: (uEnd - uStart - (wEnd - wStart)).Seconds(),
		MaxCallMS: float64(slowest) / float64(time.Millisecond),
		Queries:   len(overlapping), P99US: us(percentile(lat, 0.99)), WorstUS: us(percentile(lat, 1)),
		Failures: d.fails.count.Load() - f0,
	}
	if wEnd > 0 {
		wl := latencies(inWindow)
		rep.Unreg.Reclaim = &reclaimResult{Seconds: (wEnd - wStart).Seconds(), Queries: len(inWindow),
			P99US: us(percentile(wl, 0.99)), WorstUS: us(percentile(wl, 1))}
	}
	rep.Checked += int64(len(res.samples))
	s.logf("unregistered %d publishers in %v under %d concurrent queries; worst overlapping query %s",
		len(s.pubs), (uEnd - uStart).Round(time.Microsecond), conc, fmtUS(rep.Unreg.WorstUS))

	// The context disappears with its last service, on every server.
	deadline := time.Now().Add(5 * time.Second)
	for _, a := range s.apis {
		for {
			_, found, err := a.prefixCount(s.o.model, s.cfgBlockSize())
			if err != nil {
				return err
			}
			if !found {
				break
			}
			if time.Now().After(deadline) {
				d.fails.add("context %s still in %s/global_view 5s after its last service was unregistered", s.o.model, a.base)
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}
