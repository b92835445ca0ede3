package metrics

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mooncake-conductor-go/conductor/internal/buildinfo"
)

// TestBuildInfo gathers from the real registry: one conductor_build_info
// series, value 1, carrying the build's facts as labels.
func TestBuildInfo(t *testing.T) {
	info := buildinfo.Info{Version: "v1.2.0", Commit: "c0ffee", GoVersion: "go1.26.8", LibZMQ: "4.3.4"}
	fams, err := New(Options{Build: &info}).Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got []map[string]string
	for _, f := range fams {
		if f.GetName() != "conductor_build_info" {
			continue
		}
		for _, m := range f.GetMetric() {
			if v := m.GetGauge().GetValue(); v != 1 {
				t.Errorf("value %v, want 1", v)
			}
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			got = append(got, l)
		}
	}
	want := []map[string]string{{"version": "v1.2.0", "commit": "c0ffee", "goversion": "go1.26.8", "libzmq": "4.3.4"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("conductor_build_info (-want +got):\n%s", diff)
	}
}

// TestNoBuildInfoWithoutBuild: the metric is only there when main says
// which build runs.
func TestNoBuildInfoWithoutBuild(t *testing.T) {
	fams, err := New(Options{}).Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == "conductor_build_info" {
			t.Fatal("conductor_build_info exported without a build")
		}
	}
}
