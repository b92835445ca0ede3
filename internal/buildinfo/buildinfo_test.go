package buildinfo

import (
	"regexp"
	"runtime"
	"runtime/debug"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestResolve(t *testing.T) {
	vcs := func(rev, modified string) *debug.BuildInfo {
		return &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified}}}
	}
	for _, tc := range []struct {
		name            string
		version, commit string
		bi              *debug.BuildInfo
		wantV, wantC    string
	}{
		{"link-time values win", "v1.2.0", "abc", vcs("def", "true"), "v1.2.0", "abc"},
		{"checkout build", "", "", vcs("def", "false"), "devel", "def"},
		{"dirty checkout", "", "", vcs("def", "true"), "devel", "def-dirty"},
		{"module dependency", "", "", &debug.BuildInfo{Main: debug.Module{Version: "v0.3.1"}}, "v0.3.1", "unknown"},
		{"no build info", "", "", nil, "devel", "unknown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := resolve(tc.version, tc.commit, tc.bi)
			want := Info{Version: tc.wantV, Commit: tc.wantC, GoVersion: runtime.Version(), LibZMQ: got.LibZMQ}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestLibZMQVersion(t *testing.T) {
	if v := Get().LibZMQ; !regexp.MustCompile(`^[1-9]\d*\.\d+\.\d+$`).MatchString(v) {
		t.Fatalf("libzmq version %q", v)
	}
}

func TestString(t *testing.T) {
	i := Info{Version: "v1", Commit: "c0ffee", GoVersion: "go1.26.8", LibZMQ: "4.3.4"}
	if got, want := i.String(), "conductor v1 (commit c0ffee, go1.26.8, libzmq 4.3.4)"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
}
