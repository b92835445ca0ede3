package deploycheck

import (
	"bytes"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// A Dangling is a host a rendered manifest points a workload at that no
// Service of the same rendering provides: installed as rendered, the
// workload would dial a name that does not resolve (as the chart's old
// default etcd.endpoints, http://etcd:2379, did, and a replica that
// cannot reach etcd does not start).
type Dangling struct {
	Object string // kind/name of the object that names the host
	Where  string // the container argument, environment variable or data key
	Host   string
}

func (d Dangling) String() string {
	return fmt.Sprintf("%s %s: %s is not a Service of this rendering", d.Object, d.Where, d.Host)
}

// urlHost finds the host of every URL in a string (scheme://host[:port]),
// which is how the chart passes etcd endpoints, peers and bootstrap URLs.
var urlHost = regexp.MustCompile(`[a-zA-Z][a-zA-Z0-9+.-]*://(\[[0-9a-fA-F:.]+\]|[^/:,\s"'\\]+)`)

// DanglingHosts reads a multi-document rendering (helm template's output)
// and returns every host named in a container's command, arguments or
// environment, or in a ConfigMap's data, that is neither an IP address,
// localhost, a variable the kubelet substitutes at start ($(POD_IP)), nor
// a Service the rendering creates. A Service counts under its short name
// and its in-cluster forms (name.namespace, name.namespace.svc,
// ...svc.cluster.local); a name whose first label is a pod's
// (pod.service...) counts when the rest is a Service, the StatefulSet
// form. Any other host, in-cluster or outside, is reported: the default
// rendering must start with nothing but what it creates.
func DanglingHosts(rendered []byte) ([]Dangling, error) {
	type use struct{ object, where, host string }
	var uses []use
	services := map[string]bool{}
	namespaces := map[string]bool{"default": true}
	for i, doc := range splitDocuments(rendered) {
		var obj map[string]any
		if err := yaml.Unmarshal(doc, &obj); err != nil {
			return nil, fmt.Errorf("document %d: %w", i+1, err)
		}
		if obj == nil {
			continue
		}
		kind, _ := obj["kind"].(string)
		meta, _ := obj["metadata"].(map[string]any)
		name, _ := meta["name"].(string)
		if ns, ok := meta["namespace"].(string); ok && ns != "" {
			namespaces[ns] = true
		}
		object := kind + "/" + name
		add := func(where, text string) {
			for _, m := range urlHost.FindAllStringSubmatch(text, -1) {
				uses = append(uses, use{object, where, m[1]})
			}
		}
		switch kind {
		case "Service":
			services[name] = true
		case "ConfigMap":
			data, _ := obj["data"].(map[string]any)
			for k, v := range data {
				s, _ := v.(string)
				add("data "+k, s)
			}
		}
		for _, c := range containers(obj) {
			cname, _ := c["name"].(string)
			for _, field := range []string{"command", "args"} {
				list, _ := c[field].([]any)
				for j, a := range list {
					s, _ := a.(string)
					add(fmt.Sprintf("container %s %s[%d]", cname, field, j), s)
				}
			}
			env, _ := c["env"].([]any)
			for _, e := range env {
				em, _ := e.(map[string]any)
				n, _ := em["name"].(string)
				v, _ := em["value"].(string)
				add("container "+cname+" env "+n, v)
			}
		}
	}
	var out []Dangling
	for _, u := range uses {
		if !resolves(u.host, services, namespaces) {
			out = append(out, Dangling{u.object, u.where, u.host})
		}
	}
	slices.SortFunc(out, func(a, b Dangling) int { return strings.Compare(a.String(), b.String()) })
	return slices.Compact(out), nil
}

// resolves reports whether host needs nothing outside the rendering.
func resolves(host string, services, namespaces map[string]bool) bool {
	h := strings.ToLower(strings.Trim(host, "[]"))
	if h == "localhost" || strings.Contains(h, "$(") && !strings.Contains(h, ".") {
		return true
	}
	if _, err := netip.ParseAddr(h); err == nil {
		return true
	}
	labels := strings.Split(strings.TrimSuffix(strings.TrimSuffix(h, ".cluster.local"), ".svc"), ".")
	svcSuffix := strings.HasSuffix(strings.TrimSuffix(h, ".cluster.local"), ".svc")
	// Drop a trailing namespace the rendering uses.
	if len(labels) > 1 && namespaces[labels[len(labels)-1]] {
		labels = labels[:len(labels)-1]
	} else if svcSuffix {
		return false // another namespace's Service
	}
	switch len(labels) {
	case 1:
		return services[labels[0]]
	case 2:
		// pod.service: a StatefulSet pod under its governing Service,
		// either named outright (name-0) or left to the kubelet
		// ($(POD_NAME)).
		return services[labels[1]] && (strings.HasPrefix(labels[0], "$(") || isOrdinal(labels[0]))
	}
	return false
}

// isOrdinal reports whether a label ends in -N, a StatefulSet pod's name.
func isOrdinal(label string) bool {
	i := strings.LastIndexByte(label, '-')
	if i < 1 {
		return false
	}
	_, err := strconv.Atoi(label[i+1:])
	return err == nil
}

// containers returns the containers and init containers of a workload's
// pod template (Deployment, StatefulSet, DaemonSet, Job) or of a Pod.
func containers(obj map[string]any) []map[string]any {
	spec, _ := obj["spec"].(map[string]any)
	if tmpl, ok := spec["template"].(map[string]any); ok {
		spec, _ = tmpl["spec"].(map[string]any)
	}
	var out []map[string]any
	for _, field := range []string{"initContainers", "containers"} {
		list, _ := spec[field].([]any)
		for _, c := range list {
			if m, ok := c.(map[string]any); ok {
				out = append(out, m)
			}
		}
	}
	return out
}

// splitDocuments splits a multi-document YAML stream on its --- lines.
func splitDocuments(b []byte) [][]byte {
	var docs [][]byte
	for _, d := range regexp.MustCompile(`(?m)^---[ \t]*$`).Split(string(b), -1) {
		if len(bytes.TrimSpace([]byte(d))) > 0 {
			docs = append(docs, []byte(d))
		}
	}
	return docs
}
