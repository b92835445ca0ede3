package buildinfo

import (
	"os"
	"reflect"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
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
		// Go 1.24 and later stamp a checkout build's module version from
		// the VCS: a pseudo-version, or the tag.
		{"checkout build, VCS-stamped version", "", "", &debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20261201135749-18f269b533d9"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "18f269b533d97cc827e39686de3d33ecb03dcbcf"}}},
			"v0.0.0-20261201135749-18f269b533d9", "18f269b533d97cc827e39686de3d33ecb03dcbcf"},
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

// TestLinkerFlagsNameThisPackage: scripts/run.sh and the Dockerfile stamp
// the version with -X, which silently does nothing when the package path
// is wrong (as it was after the packages moved under internal/).
func TestLinkerFlagsNameThisPackage(t *testing.T) {
	pkg := reflect.TypeOf(Info{}).PkgPath()
	for _, f := range []string{"../../scripts/run.sh", "../../Dockerfile"} {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		text := strings.ReplaceAll(string(raw), "$pkg", pkg)
		for _, v := range []string{"version", "commit"} {
			if !strings.Contains(text, "-X "+pkg+"."+v+"=") {
				t.Errorf("%s does not stamp %s.%s", f, pkg, v)
			}
		}
	}
	if !strings.Contains(mustRead(t, "../../scripts/run.sh"), "pkg="+pkg+"\n") {
		t.Errorf("scripts/run.sh does not set pkg=%s", pkg)
	}
}

func mustRead(t *testing.T, f string) string {
	t.Helper()
	raw, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}
