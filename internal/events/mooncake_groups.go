package events

import (
	"strconv"
	"strings"

	"github.com/mooncake-conductor-go/conductor/index"
)

// vllmObjectGroup is the KV-cache group of a vllm_v1 Mooncake object: the
// event's group_id when it has one, else the object key's group:<n> label,
// else 0. ok is false for a group that is not a decimal index below
// index.MaxGroups, or a key label that disagrees with group_id.
func vllmObjectGroup(field, key string) (g int, ok bool) {
	label, hasLabel := keyGroupLabel(key)
	switch {
	case field != "":
		g, ok = parseGroup(field)
		if ok && hasLabel {
			l, lok := parseGroup(label)
			ok = lok && l == g
		}
		return g, ok
	case hasLabel:
		return parseGroup(label)
	}
	return 0, true
}

func parseGroup(s string) (int, bool) {
	g, err := strconv.Atoi(s)
	if err != nil || g < 0 || g >= index.MaxGroups || (len(s) > 1 && s[0] == '0') || s[0] == '+' {
		return 0, false
	}
	return g, true
}

// keyGroupLabel returns the n of an object key's @group:<n>@ field.
func keyGroupLabel(key string) (string, bool) {
	i := strings.Index(key, "@group:")
	if i < 0 {
		return "", false
	}
	rest := key[i+len("@group:"):]
	j := strings.IndexByte(rest, '@')
	if j < 0 {
		return "", false // the last field is the hash, never a label
	}
	return rest[:j], true
}

// groupName is the binding's group string of vLLM group g: "" for group 0,
// as bindings recorded before hybrid groups.
func groupName(g int) string {
	if g == 0 {
		return ""
	}
	return strconv.Itoa(g)
}

// release drops the reference bind took.
func (b *binding) release() { b.sink.Release(&b.ref) }
