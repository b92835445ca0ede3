package events

import (
	"strings"
)

// Mooncake object keys are written by the engines' store connectors, not by the
// master, which forwards them verbatim (docs/events.md#object-keys). The
// registered hash profile decides which convention a master stream carries.

// splitKeyFields splits a vLLM/Ascend key on '@' separators that are not
// escaped with a backslash.
func splitKeyFields(key string, out []string) []string {
	start := 0
	for i := 0; i < len(key); i++ {
		switch key[i] {
		case '\\':
			i++ // the next byte is literal
		case '@':
			out = append(out, key[start:i])
			start = i + 1
		}
	}
	return append(out, key[start:])
}

func isDecimal(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func isHexDigit(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

// isHashHex accepts a vLLM BlockHash.hex() field: optional 0x, an even
// number of at least 16 hex digits.
func isHashHex(s string) bool {
	if len(s) >= 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X') {
		s = s[2:]
	}
	if len(s) < 16 || len(s)%2 != 0 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isHexDigit(s[i]) {
			return false
		}
	}
	return true
}

// normalizeHex lower-cases a hash and drops a 0x prefix so full hashes compare
// equal however the producer spelled them (docs/events.md#block-hash-forms).
func normalizeHex(s string) string {
	if len(s) >= 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X') {
		s = s[2:]
	}
	for i := 0; i < len(s); i++ {
		if s[i] >= 'A' && s[i] <= 'F' {
			return strings.ToLower(s)
		}
	}
	return s
}

// labeled reports whether field is "<prefix><decimal>".
func labeled(field, prefix string) bool {
	return strings.HasPrefix(field, prefix) && isDecimal(field[len(prefix):])
}

// skipGroupLabels returns the index after the optional group:N,
// cache_role: and cache_family: fields that may follow the rank labels at
// f[j], in that order, never consuming the last field (the hash). The group
// label is skipped, not checked (as upstream does; docs/events.md#vllm-keys).
func skipGroupLabels(f []string, j int) int {
	last := len(f) - 1
	if j < last && labeled(f[j], "group:") {
		j++
	}
	if j < last && strings.HasPrefix(f[j], "cache_role:") {
		j++
	}
	if j < last && strings.HasPrefix(f[j], "cache_family:") {
		j++
	}
	return j
}

// parseVLLMKey returns the block-hash field of a vLLM MooncakeStoreConnector or
// vLLM-Ascend AscendStoreConnector key (docs/events.md#vllm-keys,
// docs/events.md#ascend-keys). Everything else in the key (prefix, model,
// ranks, labels) is ignored for identity: the event's context decides the
// model.
func parseVLLMKey(key string) (string, bool) {
	var buf [16]string
	f := splitKeyFields(key, buf[:0])
	n := len(f)
	// Layerwise GVA forms: model@hash@rank and model@group@hash@rank.
	if n == 3 && isHashHex(f[1]) && isDecimal(f[2]) {
		return f[1], true
	}
	if n == 4 && isDecimal(f[1]) && isHashHex(f[2]) && isDecimal(f[3]) {
		return f[2], true
	}
	if n >= 6 {
		for i := 1; i+4 < n; i++ {
			if !labeled(f[i], "tp_rank:") {
				continue
			}
			if !labeled(f[i+1], "pcp") || !labeled(f[i+2], "dcp") || !labeled(f[i+3], "pp_rank:") {
				break
			}
			j := skipGroupLabels(f, i+4)
			if j == n-1 && isHashHex(f[j]) {
				return f[j], true
			}
			break
		}
	}
	for i := 1; i+3 < n; i++ {
		if !labeled(f[i], "pcp") {
			continue
		}
		if !labeled(f[i+1], "dcp") || !labeled(f[i+2], "head_or_tp_rank:") {
			break
		}
		j := i + 3
		if j < n-1 && labeled(f[j], "pp_rank:") {
			j++
		}
		j = skipGroupLabels(f, j)
		if j < n-1 && labeled(f[j], "layer_id:") {
			j++
		}
		if j == n-1 && isHashHex(f[j]) {
			return f[j], true
		}
		// historical layerwise: ...@<hash>@<layer_id>
		if j == n-2 && isHashHex(f[j]) && isDecimal(f[j+1]) {
			return f[j], true
		}
		break
	}
	return "", false
}

// parseSGLangKey splits an SGLang HiCache key into the logical page key
// (through the 64-hex page hash) and the component suffix
// (docs/events.md#sglang-keys), e.g. "tagA_Model_<64 hex>_0_k" →
// ("tagA_Model_<64 hex>", "_0_k", "<64 hex>").
func parseSGLangKey(key string) (logical, component, hash string, ok bool) {
	i := 0
	for i < len(key) {
		if !isHexDigit(key[i]) {
			i++
			continue
		}
		j := i
		for j < len(key) && isHexDigit(key[j]) {
			j++
		}
		if j-i == 64 && (i == 0 || key[i-1] == '_') && (j == len(key) || key[j] == '_') {
			return key[:j], key[j:], key[i:j], true
		}
		i = j
	}
	return "", "", "", false
}
