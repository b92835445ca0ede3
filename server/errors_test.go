package server

import (
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/mooncake-conductor-go/conductor/codec"
	"github.com/mooncake-conductor-go/conductor/internal/query"
	"github.com/mooncake-conductor-go/conductor/registry"
)

// TestErrorBody covers every member of the closed set of handler errors,
// and that anything else is a 500 with its message.
func TestErrorBody(t *testing.T) {
	for _, tc := range []struct {
		name   string
		err    error
		status int
		body   map[string]any
	}{
		{"validation", codec.Errorf(codec.InvalidType, "model", "model must be a string"), 400,
			map[string]any{"error": "model must be a string", "reason": "invalid_type", "field": "model"}},
		{"query engine", &query.Error{Reason: query.OutOfRange, Field: "token_ids", Msg: "m"}, 400,
			map[string]any{"error": "m", "reason": "out_of_range", "field": "token_ids"}},
		{"query engine, missing", &query.Error{Reason: query.Missing, Field: "model", Msg: "model is required"}, 400,
			map[string]any{"error": "model is required", "reason": "missing", "field": "model"}},
		{"rule", &registry.RuleError{Field: "strategy", Msg: "bad"}, 400,
			map[string]any{"error": "bad", "reason": "invalid_value", "field": "strategy"}},
		{"rule missing", &registry.RuleError{Field: "python_hash_seed", Missing: true, Msg: "needed"}, 400,
			map[string]any{"error": "needed", "reason": "missing", "field": "python_hash_seed"}},
		{"conflict", &registry.ConflictError{Msg: "taken"}, 400,
			map[string]any{"error": "taken", "reason": "invalid_registration"}},
		{"too many", fmt.Errorf("wrapped: %w", registry.ErrTooManyServices), 400,
			map[string]any{"error": "the service limit is reached", "reason": "out_of_range"}},
		{"source", &registry.SourceError{Key: "a|default|0", Err: errors.New("no socket")}, 400,
			map[string]any{"error": "cannot subscribe to endpoint: start source for a|default|0: no socket", "reason": "invalid_value", "field": "endpoint"}},
		{"not registered", fmt.Errorf("%w: a|default|0", registry.ErrNotFound), 404,
			map[string]any{"error": "service not found: a|default|0"}},
		{"not recorded", fmt.Errorf("%w: no space left on device", registry.ErrNotRecorded), 503,
			map[string]any{"error": "registration change could not be recorded: no space left on device"}},
		{"method", &httpError{errMethod, "method not allowed; use GET"}, 405, map[string]any{"error": "method not allowed; use GET"}},
		{"unauthorized", &httpError{errUnauthorized, "no"}, 401, map[string]any{"error": "no"}},
		{"unavailable", &httpError{errUnavailable, "later"}, 503, map[string]any{"error": "later"}},
		{"route", &httpError{errNotFound, "not found: /x"}, 404, map[string]any{"error": "not found: /x"}},
		{"anything else", errors.New("disk on fire"), 500, map[string]any{"error": "disk on fire"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := errorBody(nil, tc.err)
			var got map[string]any
			if err := msgpack.Unmarshal(body, &got); err != nil {
				t.Fatal(err)
			}
			if status != tc.status {
				t.Errorf("status %d, want %d", status, tc.status)
			}
			if diff := cmp.Diff(tc.body, got); diff != "" {
				t.Errorf("body (-want +got):\n%s", diff)
			}
		})
	}
}
