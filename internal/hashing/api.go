// Package hashing turns a query's token ids into the chain of 64-bit block
// keys that an engine published, byte for byte, for every registered hash
// profile; it also maps the wire forms of event block hashes to the same keys.
package hashing

// Spec is a hash profile as a client sends it in /register, before
// validation. PythonHashSeed is nil when the member was omitted.
type Spec struct {
	Strategy        string
	Algorithm       string
	IndexProjection string
	PythonHashSeed  *string
	// Seed is rfc1527's seed text; nil when omitted (the default 1337).
	Seed *string
}

// Projection says which 8 bytes of a digest become the index key.
type Projection uint8

const (
	// Low64BE takes the last 8 bytes big-endian (vLLM).
	Low64BE Projection = iota + 1
	// First64BE takes the first 8 bytes big-endian (SGLang).
	First64BE
	// Native: the published value is the key itself (rfc1527's H); a
	// binary form is the 8 bytes big-endian, XXH3's canonical form.
	Native
)

// Profile is a validated, resolved hash profile. It is comparable with ==,
// which is how the registry checks that all services of a context agree.
type Profile struct {
	Strategy        string
	Algorithm       string
	IndexProjection string
	// PythonHashSeed is the accepted text ("0" for SGLang strategies).
	PythonHashSeed string
	// RootDigest is the chain root (vLLM) or the all-zero display sentinel
	// (SGLang); it is reported in read responses. An XXH3-128 root (16
	// bytes) fills its last 16 bytes, the first 16 being zero
	// (DigestBytes).
	RootDigest [32]byte
	// Seed is rfc1527's accepted seed text ("" for the other strategies).
	Seed string

	// seed is Seed's value.
	seed uint64

	// kind is the parsed (strategy, algorithm) pair; zero means the
	// Profile was not produced by Resolve and hashes nothing.
	kind kind
}

// ProfileError reports the profile member that failed validation so the
// API can answer invalid_value naming it.
type ProfileError struct {
	Member string // "strategy", "algorithm", "index_projection", "python_hash_seed", "seed"
	Msg    string
}

// Error renders "member: message", so a caller that only logs the error
// still sees which profile field was rejected.
func (e *ProfileError) Error() string { return e.Member + ": " + e.Msg }
