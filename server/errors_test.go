package server

import (
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/mooncake-conductor-go/conductor/codec"
	"github.com/mooncake-conductor-go/conductor/internal/apicmd"
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

// TestJSONBodyHint: every route that reads MessagePack answers a JSON
// request with the reason the body gets anyway and a message naming its
// command-line subcommand; a body that is neither keeps today's message.
func TestJSONBodyHint(t *testing.T) {
	h := startServer(t, Options{DebugRoutes: true})
	const js = "\n {\"model\": \"m\", \"block_size\": 16}"
	n := 0
	for path, rt := range routes {
		if !rt.msgpack {
			continue
		}
		n++
		if !apicmd.Is(rt.cli) {
			t.Errorf("%s: cli %q is not a subcommand", path, rt.cli)
		}
		tail := fmt.Sprintf("; JSON is read only by the command line (conductor %s < request.json)", rt.cli)
		for _, tc := range []struct {
			ct, body string
			want     map[string]any
		}{
			{"application/json", js, map[string]any{"reason": "unsupported_content_type",
				"error": "Content-Type must contain application/msgpack: the API reads MessagePack only" + tail}},
			{"application/json; charset=utf-8", "", map[string]any{"reason": "unsupported_content_type",
				"error": "Content-Type must contain application/msgpack: the API reads MessagePack only" + tail}},
			{"text/plain", "[1]", map[string]any{"reason": "unsupported_content_type",
				"error": "Content-Type must contain application/msgpack: the API reads MessagePack only" + tail}},
			{"application/msgpack", js, map[string]any{"reason": "invalid_msgpack",
				"error": "body looks like JSON, not MessagePack: the API reads MessagePack only" + tail}},
			{"text/plain", "model=m", map[string]any{"reason": "unsupported_content_type",
				"error": "Content-Type must contain application/msgpack"}},
			{"application/msgpack", "", map[string]any{"reason": "invalid_msgpack", "error": "empty body"}},
		} {
			st, got, _ := h.do("POST", path, tc.ct, []byte(tc.body))
			if st != 400 {
				t.Errorf("%s %q %q: status %d", path, tc.ct, tc.body, st)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("%s %q %q (-want +got):\n%s", path, tc.ct, tc.body, d)
			}
		}
	}
	if n != 5 {
		t.Errorf("%d MessagePack routes, want 5 (register, unregister, query, query_by_hash, debug/explain)", n)
	}
}
