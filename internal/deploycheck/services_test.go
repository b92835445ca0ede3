package deploycheck

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const workload = `
apiVersion: apps/v1
kind: Deployment
metadata: {name: conductor}
spec:
  template:
    spec:
      containers:
        - name: conductor
          args:
            - --config=/etc/conductor/conductor_config.json
            - --advertise-url=http://$(POD_IP):13333
            - %s
          env:
            - {name: PEER, value: "%s"}
`

func TestDanglingHosts(t *testing.T) {
	service := func(name string) string {
		return "---\napiVersion: v1\nkind: Service\nmetadata: {name: " + name + "}\n"
	}
	cases := []struct {
		name     string
		rendered string
		want     []Dangling
	}{
		{"no host at all", fmt.Sprintf(workload, "--port=13333", ""), nil},
		{"a Service of the rendering", fmt.Sprintf(workload, "--etcd-endpoints=http://conductor-etcd:2379", "") + service("conductor-etcd"), nil},
		{"its in-cluster forms", fmt.Sprintf(workload, "--etcd-endpoints=http://conductor-etcd.default:2379,http://conductor-etcd.default.svc:2379", "http://conductor-etcd.default.svc.cluster.local:2379") + service("conductor-etcd"), nil},
		{"a StatefulSet pod under its governing Service", fmt.Sprintf(workload, "--initial-cluster=e-0=http://e-0.e-peer.default.svc:2380,e-1=http://e-1.e-peer.default.svc:2380", "http://$(POD_NAME).e-peer.default.svc:2379") + service("e-peer"), nil},
		{"IP addresses and loopback", fmt.Sprintf(workload, "--listen-client-urls=http://0.0.0.0:2379,http://[::1]:2379", "http://localhost:1"), nil},
		{"the chart's old default", fmt.Sprintf(workload, "--etcd-endpoints=http://etcd:2379", ""), []Dangling{
			{"Deployment/conductor", "container conductor args[2]", "etcd"},
		}},
		{"one of two endpoints missing", fmt.Sprintf(workload, "--etcd-endpoints=http://etcd-a:2379,http://etcd-b:2379", "") + service("etcd-a"), []Dangling{
			{"Deployment/conductor", "container conductor args[2]", "etcd-b"},
		}},
		{"another namespace's Service", fmt.Sprintf(workload, "--etcd-endpoints=https://etcd.infra.svc:2379", "") + service("etcd"), []Dangling{
			{"Deployment/conductor", "container conductor args[2]", "etcd.infra.svc"},
		}},
		{"a host outside the cluster", fmt.Sprintf(workload, "--bootstrap-from=https://peer.example.com", "") + service("peer"), []Dangling{
			{"Deployment/conductor", "container conductor args[2]", "peer.example.com"},
		}},
		{"a pod name that is no StatefulSet ordinal", fmt.Sprintf(workload, "--x=http://web.e-peer:1", "") + service("e-peer"), []Dangling{
			{"Deployment/conductor", "container conductor args[2]", "web.e-peer"},
		}},
		{"in the environment", fmt.Sprintf(workload, "--port=1", "http://nowhere:2379"), []Dangling{
			{"Deployment/conductor", "container conductor env PEER", "nowhere"},
		}},
		{"in a ConfigMap", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata:\n  conductor_config.json: '{\"endpoint\": \"tcp://vllm-0:5557\", \"replay\": \"tcp://10.0.0.1:5558\"}'\n", []Dangling{
			{"ConfigMap/c", "data conductor_config.json", "vllm-0"},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := DanglingHosts([]byte(c.rendered))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
	if _, err := DanglingHosts([]byte("kind: [unclosed")); err == nil {
		t.Error("a rendering that is not YAML was accepted")
	}
}
