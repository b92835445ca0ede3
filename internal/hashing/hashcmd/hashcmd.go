// Package hashcmd is the `conductor hash` subcommand: it hashes a prompt's
// token ids under a hash profile and prints, per block, the index key the
// conductor looks up and the values the engine publishes for that block, so
// an integrator can hold them against their engine's KV events when queries
// find nothing.
package hashcmd

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"

	"github.com/mooncake-conductor-go/conductor/internal/hashing"
)

// Exit codes: 2 is a usage error (bad flags, profile or token input), as
// the flag package and most command-line tools use it.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

// Block is one output row. Keys and event integers are decimal strings, as
// in the golden vectors, so that JSON readers that parse numbers as doubles
// (jq, JavaScript) keep all 64 bits.
type Block struct {
	Index int `json:"index"`
	// Start and End are the block's positions [Start, End): token
	// positions, or pair positions for sglang_bigram.
	Start   int `json:"start"`
	End     int `json:"end"`
	Covered int `json:"covered"`
	// Key is the 64-bit index key (the profile's projection of Digest).
	Key    string `json:"key"`
	KeyHex string `json:"key_hex"`
	// Event is the integer the engine puts in block_hashes: vLLM's
	// unsigned low 64 bits, SGLang's signed int64.
	Event string `json:"event"`
	// Digest is the block's full digest in hex (SHA-256, 64 characters;
	// XXH3-128 under xxhash and xxhash_cbor, 32), which vLLM publishes as
	// bytes when VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0.
	Digest string `json:"digest"`
}

// options are the parsed command line.
type options struct {
	spec      hashing.Spec
	blockSize int
	lora      string
	salt      string
	file      string
	json      bool
}

// Summary is the subcommand's one-line description, for the main usage
// text.
const Summary = "hashes a prompt's token ids as an engine does and prints each block's index key and published hash"

// Run executes the subcommand with args (after "hash") and returns the
// process exit code. Token ids come from stdin unless --file names a file.
func Run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintln(stderr, "conductor hash:", err)
		return exitUsage
	}
	p, err := hashing.Resolve(o.spec)
	if err != nil {
		fmt.Fprintln(stderr, "conductor hash:", flagError(err))
		return exitUsage
	}
	in := stdin
	if o.file != "" {
		f, err := os.Open(o.file)
		if err != nil {
			fmt.Fprintln(stderr, "conductor hash:", err)
			return exitUsage
		}
		defer f.Close()
		in = f
	}
	toks, err := readTokens(in)
	if err != nil {
		fmt.Fprintln(stderr, "conductor hash: token ids:", err)
		return exitUsage
	}
	blocks, err := Hash(&p, o.blockSize, toks, o.lora, o.salt)
	if err != nil {
		fmt.Fprintln(stderr, "conductor hash:", err)
		return exitUsage
	}
	if len(blocks) == 0 {
		fmt.Fprintf(stderr, "conductor hash: %d token ids make no block of size %d\n", len(toks), o.blockSize)
	}
	if err := write(stdout, blocks, o.json); err != nil {
		fmt.Fprintln(stderr, "conductor hash:", err)
		return exitError
	}
	return exitOK
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	var seed string
	fl := flag.NewFlagSet("conductor hash", flag.ContinueOnError)
	fl.SetOutput(stderr)
	fl.StringVar(&o.spec.Strategy, "strategy", "", "hash strategy: vllm_v1, sglang, sglang_bigram or rfc1527 (required)")
	fl.StringVar(&o.spec.Algorithm, "algorithm", "", "vllm_v1: the engine's --prefix-caching-hash-algo, sha256 (vLLM's default), sha256_cbor, xxhash or xxhash_cbor (required); SGLang: sha256_raw (the default)")
	fl.StringVar(&o.spec.IndexProjection, "index-projection", "", "low64_be (vllm_v1) or first64_be (SGLang); default: the strategy's")
	fl.StringVar(&seed, "seed", "", "vllm_v1 (required): the engine's PYTHONHASHSEED, \"random\" or decimal, or \"vllm-none-hash\" for an engine without PYTHONHASHSEED (sha256 and sha256_cbor); ignored by SGLang; rfc1527: the XXH3 seed (default 1337)")
	fl.IntVar(&o.blockSize, "block-size", 0, "the registered block_size (required)")
	fl.StringVar(&o.lora, "lora-name", "", "LoRA adapter name (vllm_v1 hashes it into every block; SGLang ignores it)")
	fl.StringVar(&o.salt, "cache-salt", "", "the request's cache_salt (enters a chain's first block)")
	fl.StringVar(&o.file, "file", "", "read the token ids from this file instead of stdin")
	fl.BoolVar(&o.json, "json", false, "one JSON object per block instead of text")
	fl.Usage = func() {
		fmt.Fprint(fl.Output(), "Usage: conductor hash --strategy S [--algorithm A] [--seed N] --block-size B [flags] < tokens.json\n\n"+
			"Hashes a JSON array of token ids under a hash profile and prints one line per\n"+
			"block: the index key the conductor looks up and what the engine publishes.\n\n")
		fl.PrintDefaults()
	}
	if err := fl.Parse(args); err != nil {
		return o, err
	}
	if fl.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fl.Args())
	}
	set := map[string]bool{}
	fl.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if o.spec.Strategy == "" {
		return o, errors.New("--strategy is required")
	}
	std := o.spec.Strategy == hashing.StrategyRFC1527
	switch {
	case set["seed"] && std:
		o.spec.Seed = &seed
	case set["seed"]:
		o.spec.PythonHashSeed = &seed
	}
	if std {
		// The standard hash: XXH3-64, its keys unprojected, no salt.
		if o.spec.Algorithm == "" {
			o.spec.Algorithm = hashing.AlgorithmXXH3_64
		}
		if o.salt != "" {
			return o, errors.New("--cache-salt: strategy rfc1527 hashes no salt (a salted query matches no block)")
		}
		if o.blockSize <= 0 || o.blockSize > math.MaxInt32 {
			return o, fmt.Errorf("--block-size must be between 1 and %d", math.MaxInt32)
		}
		return o, nil
	}
	sglang := o.spec.Strategy == hashing.StrategySGLang || o.spec.Strategy == hashing.StrategySGLangBigram
	if o.spec.Algorithm == "" && sglang {
		o.spec.Algorithm = hashing.AlgorithmSHA256Raw
	}
	if o.spec.IndexProjection == "" {
		o.spec.IndexProjection = hashing.ProjectionLow64BE
		if sglang {
			o.spec.IndexProjection = hashing.ProjectionFirst64BE
		}
	}
	if o.blockSize <= 0 || o.blockSize > math.MaxInt32 {
		return o, fmt.Errorf("--block-size must be between 1 and %d", math.MaxInt32)
	}
	return o, nil
}

// flagError renames a profile error's member to the flag that set it.
func flagError(err error) error {
	var pe *hashing.ProfileError
	if !errors.As(err, &pe) {
		return err
	}
	name := map[string]string{
		"strategy": "--strategy", "algorithm": "--algorithm",
		"index_projection": "--index-projection", "python_hash_seed": "--seed", "seed": "--seed",
	}[pe.Member]
	if name == "" {
		name = pe.Member
	}
	return fmt.Errorf("%s: %s", name, pe.Msg)
}

// readTokens decodes one JSON array of int32-range integers and nothing
// after it.
func readTokens(r io.Reader) ([]int32, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	// Decoded as []any: a []json.Number target would also take "2".
	var raw []any
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("want a JSON array of integers: %w", err)
	}
	if raw == nil {
		return nil, errors.New("want a JSON array of integers, got null")
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("unexpected data after the array")
	}
	toks := make([]int32, len(raw))
	for i, e := range raw {
		n, ok := e.(json.Number)
		if !ok {
			return nil, fmt.Errorf("element %d is not a number", i)
		}
		v, err := strconv.ParseInt(n.String(), 10, 32)
		if err != nil {
			return nil, fmt.Errorf("element %d (%s) is not an integer in int32 range", i, n)
		}
		toks[i] = int32(v)
	}
	return toks, nil
}

// Hash returns the blocks of toks under p, as the conductor hashes a query.
// An SGLang profile cannot hash negative ids (the engine refuses them too),
// which is an error here rather than the query path's zero blocks, so that
// the integrator sees why.
func Hash(p *hashing.Profile, blockSize int, toks []int32, lora, salt string) ([]Block, error) {
	sglang := p.Projection() == hashing.First64BE
	if sglang {
		for i, t := range toks {
			if t < 0 {
				return nil, fmt.Errorf("token id %d at position %d is negative, which SGLang cannot hash", t, i)
			}
		}
	}
	c := hashing.AcquireChain()
	defer hashing.ReleaseChain(c)
	c.Reset(p, blockSize, toks, lora, salt)
	var out []Block
	start := 0
	for i := 0; ; i++ {
		key, covered, ok := c.Next()
		if !ok {
			break
		}
		d := c.Digest()
		event := strconv.FormatUint(key, 10)
		if sglang {
			event = strconv.FormatInt(int64(key), 10)
		}
		digest := hex.EncodeToString(p.DigestBytes(&d))
		if p.IsStandard() {
			digest = digest[:16] // the 64-bit hash is the whole value
		}
		out = append(out, Block{
			Index: i, Start: start, End: start + covered, Covered: covered,
			Key: strconv.FormatUint(key, 10), KeyHex: fmt.Sprintf("%016x", key),
			Event: event, Digest: digest,
		})
		start += covered
	}
	return out, nil
}

func write(w io.Writer, blocks []Block, asJSON bool) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	for _, b := range blocks {
		if asJSON {
			if err := enc.Encode(b); err != nil {
				return err
			}
			continue
		}
		fmt.Fprintf(&buf, "block %d  positions [%d,%d)  key %s (0x%s)  event %s  digest %s\n",
			b.Index, b.Start, b.End, b.Key, b.KeyHex, b.Event, b.Digest)
	}
	_, err := w.Write(buf.Bytes())
	return err
}
