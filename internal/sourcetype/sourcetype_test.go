package sourcetype

import "testing"

// TestParseRoundTrips: every type parses back from its spelling, and
// spellings differing in case or unknown names do not parse.
func TestParseRoundTrips(t *testing.T) {
	for ty := Type(0); ty < NumTypes; ty++ {
		got, ok := Parse(ty.String())
		if !ok || got != ty {
			t.Errorf("Parse(%q) = %v, %v; want %v", ty.String(), got, ok, ty)
		}
	}
	for _, s := range []string{"", "vllm", "VLLM", "sglang", "mooncake", "TensorRT-LLM"} {
		if _, ok := Parse(s); ok {
			t.Errorf("Parse(%q) accepted", s)
		}
	}
	if VLLM.IsEngine() != true || SGLang.IsEngine() != true || Mooncake.IsEngine() != false {
		t.Error("IsEngine: only vLLM and SGLang are engines")
	}
}
