// Package sourcetype names the kinds of event publisher the service accepts
// (the metrics' source_type label; a source is the subscription itself).
// It is its own package so that the registry (which validates
// registrations), the event decoders and the subscriber (which pick a
// decoder by it) and the metrics (which label by it) share one definition
// without importing each other.
package sourcetype

import "fmt"

// Type is a registered publisher type. It alone selects the payload
// decoder; topics and payload shapes never do.
type Type uint8

// Publisher types, in counter order. The zero value is vLLM, as the
// registration contract has no default; a Type only comes from Parse or
// from these constants.
const (
	VLLM Type = iota
	SGLang
	Mooncake
	NumTypes // the number of types, for arrays indexed by Type
)

var names = [NumTypes]string{"vLLM", "SGLang", "Mooncake"}

// String returns the registration spelling ("vLLM", "SGLang", "Mooncake"),
// which is also the metric label.
func (t Type) String() string {
	if t < NumTypes {
		return names[t]
	}
	return fmt.Sprintf("Type(%d)", uint8(t))
}

// Parse maps the case-sensitive registration `type` to a Type; ok is false
// for any other spelling.
func Parse(s string) (t Type, ok bool) {
	for i, n := range names {
		if n == s {
			return Type(i), true
		}
	}
	return 0, false
}

// IsEngine reports whether publishers of the type are inference engines
// (vLLM, SGLang), whose instances are scheduling targets, rather than the
// Mooncake master's store stream.
func (t Type) IsEngine() bool { return t == VLLM || t == SGLang }
