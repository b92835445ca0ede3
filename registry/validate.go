package registry

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
)

// DefaultTenant is what an empty or omitted tenant_id means.
const DefaultTenant = index.DefaultTenant

// Registration is a registration as a client or the config file states it,
// decoded but not yet checked against the rules: the HTTP decoder fills it
// from a /register body and the config loader from a kvevent_instance
// entry, and both hand it to NewService, so the two doors enforce the same
// rules by construction.
type Registration struct {
	Endpoint       string
	ReplayEndpoint string
	Type           string
	ModelName      string
	LoraName       string
	TenantID       string
	InstanceID     string
	BlockSize      int
	DPRank         int
	// CacheGroup is nil when none was given.
	CacheGroup *int
	// HashProfile is the profile as named; NewService resolves it.
	HashProfile hashing.Spec
	// KVCacheGroups is the optional declared layout of a hybrid model's
	// KV-cache groups (nil: none declared; groups.go).
	KVCacheGroups []GroupDecl
}

// RuleError is a registration that breaks one of the rules. Field names
// the offending member as a client wrote it; a member of hash_profile is
// named by itself ("strategy", "python_hash_seed"), as upstream Conductor
// names it. Missing marks a member the rules require in this combination
// (python_hash_seed for vllm_v1); every other rule error is an invalid
// value.
type RuleError struct {
	Field   string
	Missing bool
	Msg     string
}

func (e *RuleError) Error() string { return e.Field + ": " + e.Msg }

func ruleErrorf(field, format string, args ...any) *RuleError {
	return &RuleError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// NewService checks r against the registration rules and resolves its hash
// profile. The checks run in a fixed order, so a registration breaking
// several rules always gets the same error. The error is a *RuleError.
func NewService(r Registration) (Service, error) {
	svc := Service{
		Endpoint: r.Endpoint, ReplayEndpoint: r.ReplayEndpoint,
		ModelName: r.ModelName, LoraName: r.LoraName, TenantID: r.TenantID,
		InstanceID: r.InstanceID, BlockSize: r.BlockSize, DPRank: r.DPRank, CacheGroup: r.CacheGroup,
	}
	if svc.TenantID == "" {
		svc.TenantID = DefaultTenant
	}
	// The wire decoder already refuses these three; a config file's
	// values reach here unchecked.
	switch {
	case r.BlockSize <= 0:
		return svc, ruleErrorf("block_size", "block_size must be positive")
	case r.DPRank < 0:
		return svc, ruleErrorf("dp_rank", "dp_rank must not be negative")
	case r.CacheGroup != nil && *r.CacheGroup != 0:
		return svc, ruleErrorf("cache_group", "only cache_group 0 is supported")
	}
	var ok bool
	if svc.Type, ok = sourcetype.Parse(r.Type); !ok {
		return svc, ruleErrorf("type", "type must be vLLM, SGLang or Mooncake, got %q", r.Type)
	}
	if r.InstanceID == "" {
		return svc, ruleErrorf("instance_id", "instance_id must not be empty")
	}
	if r.ModelName == "" {
		return svc, ruleErrorf("modelname", "modelname must not be empty")
	}
	if err := ValidateEndpoint(r.Endpoint); err != nil {
		return svc, ruleErrorf("endpoint", "endpoint %v", err)
	}
	if r.ReplayEndpoint != "" {
		if err := ValidateEndpoint(r.ReplayEndpoint); err != nil {
			return svc, ruleErrorf("replay_endpoint", "replay_endpoint %v", err)
		}
	}
	groups, err := checkGroups(&r, svc.Type)
	if err != nil {
		return svc, err
	}
	svc.Groups = groups
	spec := r.HashProfile
	if spec.Strategy == "vllm_v1" && spec.PythonHashSeed == nil {
		return svc, &RuleError{Field: "python_hash_seed", Missing: true, Msg: "python_hash_seed is required for strategy vllm_v1"}
	}
	p, err := hashing.Resolve(spec)
	if err != nil {
		var pe *hashing.ProfileError
		if errors.As(err, &pe) {
			return svc, &RuleError{Field: pe.Member, Msg: pe.Msg}
		}
		return svc, ruleErrorf("hash_profile", "%v", err)
	}
	switch {
	case p.IsStandard():
		// Any publisher may be registered under the standard hash: engine
		// keys are recomputed from token ids (docs/engines.md#standard-hash).
	case svc.Type == sourcetype.VLLM && p.Strategy != "vllm_v1":
		return svc, ruleErrorf("strategy", "a vLLM publisher hashes with strategy vllm_v1 (or the standard rfc1527), got %q", p.Strategy)
	case svc.Type == sourcetype.SGLang && p.Strategy == "vllm_v1":
		return svc, ruleErrorf("strategy", "an SGLang publisher hashes with strategy sglang or sglang_bigram, got %q", p.Strategy)
	}
	svc.Profile = p
	return svc, nil
}

// ValidateEndpoint accepts the endpoints this service can connect a SUB or
// DEALER socket to: tcp://host:port with a concrete host (the service never
// binds, so wildcards are meaningless) and ipc://path.
func ValidateEndpoint(ep string) error {
	switch {
	case strings.HasPrefix(ep, "tcp://"):
		host, port, err := net.SplitHostPort(ep[len("tcp://"):])
		if err != nil {
			return errors.New("must be tcp://host:port or ipc://path")
		}
		if host == "" || host == "*" || host == "0.0.0.0" || host == "::" {
			return errors.New("must name a reachable host, not a wildcard")
		}
		if strings.ContainsAny(host, "/ \t;") {
			return errors.New("has an invalid host")
		}
		p, err := strconv.Atoi(port)
		if err != nil || p < 1 || p > 65535 {
			return errors.New("must have a port in 1..65535")
		}
		return nil
	case strings.HasPrefix(ep, "ipc://"):
		if len(ep) == len("ipc://") {
			return errors.New("must have a path after ipc://")
		}
		if strings.ContainsRune(ep, 0) {
			return errors.New("must not contain NUL")
		}
		return nil
	}
	return errors.New("must be tcp://host:port or ipc://path")
}
