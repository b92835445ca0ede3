package main

import (
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The command line: the options, the named presets and their validation.

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
