package registry

// EnginesFirst calls apply on each item in the order registrations are
// applied in bulk (at start, and when a shared store re-reads its set):
// engines (vLLM, SGLang) before Mooncake streams, because a Mooncake
// stream indexes only into contexts an engine has bound, and its restored
// bindings need them; within each kind, items keep their order. isEngine
// says which kind an item is. It stops at the first error apply returns.
func EnginesFirst[T any](items []T, isEngine func(T) bool, apply func(T) error) error {
	for _, engines := range []bool{true, false} {
		for _, it := range items {
			if isEngine(it) != engines {
				continue
			}
			if err := apply(it); err != nil {
				return err
			}
		}
	}
	return nil
}
