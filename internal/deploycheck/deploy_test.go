// Package deploycheck tests the deployment files under deploy/ (Helm chart,
// compose example, Grafana dashboard, Prometheus rules) offline, without
// helm, docker or Prometheus, for what can drift from the code: the files
// parse, every flag they pass is one the binary knows, and every conductor_
// metric they name is one the code exports.
package deploycheck

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"

	"github.com/mooncake-conductor-go/conductor/internal/config"
)

// knownFlags are the flag names listed by conductor --help.
func knownFlags(t *testing.T) map[string]bool {
	t.Helper()
	flags := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z][a-z0-9-]*)`).FindAllStringSubmatch(config.Usage(), -1) {
		flags[m[1]] = true
	}
	if len(flags) < 10 || !flags["etcd-endpoints"] {
		t.Fatalf("could not read the flags from config.Usage(): %v", flags)
	}
	return flags
}

// TestMain runs the tests from deploy/, so the paths below read as the
// deployment files' own.
func TestMain(m *testing.M) {
	if err := os.Chdir(filepath.Join("..", "..", "deploy")); err != nil {
		panic(err)
	}
	os.Exit(m.Run())
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// flagUses returns the --name of every long option written in text.
func flagUses(text string) []string {
	var out []string
	for _, m := range regexp.MustCompile(`(?m)^\s*-\s+"?--([a-z][a-z0-9-]*)`).FindAllStringSubmatch(text, -1) {
		out = append(out, m[1])
	}
	return out
}

func TestFlagsExist(t *testing.T) {
	known := knownFlags(t)
	for _, tc := range []struct {
		file string
		min  int // guards against the pattern silently matching nothing
	}{
		{"helm/conductor/templates/workload.yaml", 14},
	} {
		uses := flagUses(string(readFile(t, tc.file)))
		if len(uses) < tc.min {
			t.Errorf("%s: found %d flags %v, want at least %d", tc.file, len(uses), uses, tc.min)
		}
		for _, f := range uses {
			if !known[f] {
				t.Errorf("%s passes --%s, which conductor does not have", tc.file, f)
			}
		}
	}
}

func TestFlagUsesPattern(t *testing.T) {
	got := flagUses("args:\n  - --port=1\n  - \"--x-y\"\n  - etcd\n  - --name=etcd\n  # - --commented\n")
	if diff := cmp.Diff([]string{"port", "x-y", "name"}, got); diff != "" {
		t.Errorf("flagUses (-want +got):\n%s", diff)
	}
}

type values struct {
	ReplicaCount int            `json:"replicaCount"`
	Config       map[string]any `json:"config"`
	Etcd         struct {
		Endpoints []string `json:"endpoints"`
		Prefix    string   `json:"prefix"`
	} `json:"etcd"`
	LivenessProbe  probe `json:"livenessProbe"`
	ReadinessProbe probe `json:"readinessProbe"`
	Resources      struct {
		Requests map[string]string `json:"requests"`
	} `json:"resources"`
	PodSecurityContext struct {
		RunAsNonRoot bool `json:"runAsNonRoot"`
		RunAsUser    int  `json:"runAsUser"`
	} `json:"podSecurityContext"`
	SecurityContext struct {
		ReadOnlyRootFilesystem   bool `json:"readOnlyRootFilesystem"`
		AllowPrivilegeEscalation bool `json:"allowPrivilegeEscalation"`
	} `json:"securityContext"`
	PodDisruptionBudget struct {
		Enabled bool `json:"enabled"`
	} `json:"podDisruptionBudget"`
}

type probe struct {
	HTTPGet struct {
		Path string `json:"path"`
	} `json:"httpGet"`
}

func TestChartValues(t *testing.T) {
	var v values
	if err := yaml.Unmarshal(readFile(t, "helm/conductor/values.yaml"), &v); err != nil {
		t.Fatalf("values.yaml: %v", err)
	}
	checks := []struct {
		what string
		ok   bool
	}{
		// helm install with the defaults must start on a cluster with
		// nothing else installed: one replica, no etcd to wait for.
		{"one replica by default", v.ReplicaCount == 1},
		{"no etcd by default (none to reach)", len(v.Etcd.Endpoints) == 0},
		{"etcd prefix ends in /", strings.HasSuffix(v.Etcd.Prefix, "/")},
		{"liveness on /healthz", v.LivenessProbe.HTTPGet.Path == "/healthz"},
		{"readiness on /readyz", v.ReadinessProbe.HTTPGet.Path == "/readyz"},
		{"cpu and memory requests", v.Resources.Requests["cpu"] != "" && v.Resources.Requests["memory"] != ""},
		{"non-root with the image's user", v.PodSecurityContext.RunAsNonRoot && v.PodSecurityContext.RunAsUser == 10001},
		{"read-only root filesystem", v.SecurityContext.ReadOnlyRootFilesystem && !v.SecurityContext.AllowPrivilegeEscalation},
		{"PodDisruptionBudget", v.PodDisruptionBudget.Enabled},
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("values.yaml: want %s", c.what)
		}
	}
	if !strings.Contains(string(readFile(t, "../Dockerfile")), "--uid 10001") {
		t.Errorf("the Dockerfile's user is no longer uid 10001; update podSecurityContext.runAsUser")
	}
}

// TestConfigsLoad feeds the chart's default conductor_config.json and the
// compose example's config file and conductor arguments to the real config
// loader, which rejects unknown flags and bad values.
func TestConfigsLoad(t *testing.T) {
	var v values
	if err := yaml.Unmarshal(readFile(t, "helm/conductor/values.yaml"), &v); err != nil {
		t.Fatal(err)
	}
	chartConfig, err := json.Marshal(v.Config)
	if err != nil {
		t.Fatal(err)
	}
	// The chart's example of a static registration (check-deploy.sh
	// renders it) must be one conductor itself accepts.
	var staticValues values
	if err := yaml.Unmarshal(readFile(t, "helm/conductor/ci/static-registration-values.yaml"), &staticValues); err != nil {
		t.Fatal(err)
	}
	staticConfig, err := json.Marshal(staticValues.Config)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(staticConfig), `"prefill-0"`) {
		t.Fatalf("static registration example lost its registration: %s", staticConfig)
	}
	var compose struct {
		Services map[string]struct {
			Command []string `json:"command"`
		} `json:"services"`
	}
	if err := yaml.Unmarshal(readFile(t, "compose/docker-compose.yml"), &compose); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	for _, tc := range []struct {
		name   string
		config []byte
		args   []string
	}{
		{"chart defaults", chartConfig, []string{"--etcd-endpoints=http://etcd:2379", "--advertise-url=http://10.0.0.1:13333"}},
		{"chart static registration example", staticConfig, []string{"--log-level=INFO"}},
		{"compose conductor-a", readFile(t, "compose/conductor_config.json"), compose.Services["conductor-a"].Command},
		{"compose conductor-b", readFile(t, "compose/conductor_config.json"), compose.Services["conductor-b"].Command},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if len(tc.args) == 0 {
				t.Fatal("no arguments")
			}
			path := filepath.Join(t.TempDir(), "conductor_config.json")
			if err := os.WriteFile(path, tc.config, 0o600); err != nil {
				t.Fatal(err)
			}
			args := append([]string{}, tc.args...)
			for i, a := range args {
				if strings.HasPrefix(a, "--config=") {
					args[i] = "--config=" + path
				}
			}
			args = append(args, "--config="+path, "--state-dir=")
			if _, err := config.Load(args, func(string) string { return "" }); err != nil {
				t.Errorf("config.Load(%q): %v", args, err)
			}
		})
	}
}

// exportedMetrics collects the conductor_ metric names written as string
// literals in the service's non-test Go files. The load generator
// (scripts) and this package read metrics and are left out: a name they
// mention is not thereby exported.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	re := regexp.MustCompile(`"(conductor_[a-z0-9_]+)"`)
	names := map[string]bool{}
	err := filepath.WalkDir("..", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || path == filepath.Join("..", "scripts") || path == filepath.Join("..", "deploy")) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range re.FindAllStringSubmatch(string(b), -1) {
			names[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !names["conductor_index_blocks"] || !names["conductor_etcd_failures_total"] {
		t.Fatalf("metric names not found in the source: %v", names)
	}
	return names
}

func TestMetricsExist(t *testing.T) {
	exported := exportedMetrics(t)
	var dash struct {
		Panels []struct {
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(readFile(t, "grafana/conductor.json"), &dash); err != nil {
		t.Fatalf("grafana/conductor.json: %v", err)
	}
	var dashExprs []string
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			dashExprs = append(dashExprs, tg.Expr)
		}
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
				Expr  string `json:"expr"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(readFile(t, "prometheus/alerts.yml"), &rules); err != nil {
		t.Fatalf("prometheus/alerts.yml: %v", err)
	}
	var ruleExprs []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			ruleExprs = append(ruleExprs, r.Expr)
		}
	}
	for _, tc := range []struct {
		file  string
		exprs []string
		min   int
	}{
		{"grafana/conductor.json", dashExprs, 30},
		{"prometheus/alerts.yml", ruleExprs, 8},
	} {
		if len(tc.exprs) < tc.min {
			t.Errorf("%s: %d expressions, want at least %d", tc.file, len(tc.exprs), tc.min)
		}
		used := map[string]bool{}
		for _, e := range tc.exprs {
			for _, m := range regexp.MustCompile(`conductor_[a-z0-9_]+`).FindAllString(e, -1) {
				used[m] = true
			}
		}
		var missing []string
		for m := range used {
			base := m
			for _, suf := range []string{"_bucket", "_sum", "_count"} {
				if !exported[base] && strings.HasSuffix(base, suf) {
					base = strings.TrimSuffix(base, suf)
				}
			}
			if !exported[base] {
				missing = append(missing, m)
			}
		}
		sort.Strings(missing)
		if len(missing) > 0 {
			t.Errorf("%s names metrics the code does not export: %v", tc.file, missing)
		}
	}
}

// TestComposeGrafana: compose's Grafana mounts files that exist, its
// provisioned data source is the compose Prometheus, and the dashboard
// provider reads the directory the dashboard is mounted in.
func TestComposeGrafana(t *testing.T) {
	var compose struct {
		Services map[string]struct {
			Image   string   `json:"image"`
			Volumes []string `json:"volumes"`
			Ports   []string `json:"ports"`
		} `json:"services"`
	}
	if err := yaml.Unmarshal(readFile(t, "compose/docker-compose.yml"), &compose); err != nil {
		t.Fatal(err)
	}
	g, ok := compose.Services["grafana"]
	if !ok {
		t.Fatal("compose has no grafana service")
	}
	mounts := map[string]string{}
	for _, v := range g.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) < 2 {
			t.Fatalf("volume %q", v)
		}
		host := filepath.Join("compose", parts[0])
		if _, err := os.Stat(host); err != nil {
			t.Errorf("grafana mounts %s, which does not exist: %v", parts[0], err)
		}
		mounts[parts[1]] = host
	}
	dash, ok := mounts["/var/lib/grafana/dashboards/conductor.json"]
	if !ok || filepath.Clean(dash) != filepath.Join("grafana", "conductor.json") {
		t.Errorf("the dashboard is not mounted from deploy/grafana/conductor.json: %v", mounts)
	}
	prov, ok := mounts["/etc/grafana/provisioning"]
	if !ok {
		t.Fatalf("no provisioning directory mounted: %v", mounts)
	}
	var ds struct {
		Datasources []struct {
			Type, URL string
			IsDefault bool `json:"isDefault"`
		} `json:"datasources"`
	}
	if err := yaml.Unmarshal(readFile(t, filepath.Join(prov, "datasources", "prometheus.yml")), &ds); err != nil {
		t.Fatal(err)
	}
	promPort := ""
	for _, p := range compose.Services["prometheus"].Ports {
		promPort = p[strings.LastIndex(p, ":")+1:]
	}
	if len(ds.Datasources) != 1 || ds.Datasources[0].Type != "prometheus" || !ds.Datasources[0].IsDefault ||
		ds.Datasources[0].URL != "http://prometheus:"+strings.Trim(promPort, `"`) {
		t.Errorf("data source %+v, want the default prometheus at http://prometheus:%s", ds.Datasources, promPort)
	}
	var dp struct {
		Providers []struct {
			Options struct {
				Path string `json:"path"`
			} `json:"options"`
		} `json:"providers"`
	}
	if err := yaml.Unmarshal(readFile(t, filepath.Join(prov, "dashboards", "conductor.yml")), &dp); err != nil {
		t.Fatal(err)
	}
	if len(dp.Providers) != 1 || dp.Providers[0].Options.Path != filepath.Dir("/var/lib/grafana/dashboards/conductor.json") {
		t.Errorf("dashboard providers %+v do not read /var/lib/grafana/dashboards", dp.Providers)
	}
}
