#!/usr/bin/env bash
# Checks deploy/: offline against the code (internal/deploycheck), then
# with the real tools: the Helm chart lints (strict) and
# renders with its defaults and with the StatefulSet, etcd-TLS and
# ServiceMonitor options on; the Prometheus alert rules load and pass
# their unit tests; the default rendering, and the one with the chart's
# own etcd, name no host but the Services they create (so `helm install`
# with them starts on an empty cluster). helm is built from its Go module
# (pinned below, a version the module proxy approves) once and kept in the
# user's cache; promtool comes from Debian's prometheus package, which
# scripts/setup.sh --test installs.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
scripts/setup.sh --test

helm_module=helm.sh/helm/v4
helm_version=v4.3.2
tools="${XDG_CACHE_HOME:-$HOME/.cache}/conductor-tools"
helm="$tools/helm-$helm_version"
if [ ! -x "$helm" ]; then
	echo "check-deploy: building helm $helm_version (once)" >&2
	mkdir -p "$tools"
	GOBIN="$tools/bin.$$" go install "$helm_module/cmd/helm@$helm_version"
	mv "$tools/bin.$$/helm" "$helm"
	rmdir "$tools/bin.$$"
fi

# The offline checks of deploy/ (flags, configs, metric names) parse YAML,
# which the service never does, so they are a module of their own and
# `go test ./...` at the top does not reach them.
(cd internal/deploycheck && go vet ./... && go test -race -count=1 ./...)

chart=deploy/helm/conductor
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$helm" lint --strict "$chart"
"$helm" template conductor "$chart" >"$out/default.yaml"
"$helm" template conductor "$chart" \
	--set persistence.enabled=true \
	--set serviceMonitor.enabled=true \
	--set etcd.endpoints='{https://etcd-0:2379,https://etcd-1:2379}' \
	--set etcd.tls.secretName=etcd-client-tls \
	>"$out/options.yaml"
"$helm" template conductor "$chart" --set replicaCount=3 --set etcd.deploy.enabled=true --set etcd.deploy.replicas=3 >"$out/etcd.yaml"
"$helm" template conductor "$chart" -f "$chart/ci/static-registration-values.yaml" >"$out/static.yaml"
for want in "default.yaml:Deployment" "default.yaml:Service" "default.yaml:PodDisruptionBudget" "options.yaml:StatefulSet" "options.yaml:ServiceMonitor" "etcd.yaml:StatefulSet"; do
	if ! grep -q "^kind: ${want#*:}\$" "$out/${want%%:*}"; then
		echo "check-deploy: helm template ($want) rendered no ${want#*:}" >&2
		exit 1
	fi
done
# The chart's own etcd: three members that know each other, and the pods
# pointed at its Service.
grep -q -- "--initial-cluster=conductor-etcd-0=.*,conductor-etcd-1=.*,conductor-etcd-2=" "$out/etcd.yaml" ||
	{ echo "check-deploy: etcd.deploy rendered no three-member initial cluster" >&2; exit 1; }
grep -q -- "--etcd-endpoints=http://conductor-etcd:2379" "$out/etcd.yaml" ||
	{ echo "check-deploy: etcd.deploy does not point the pods at the chart's etcd" >&2; exit 1; }
# The defaults: one replica, no etcd, nothing to wait for.
grep -q '^  replicas: 1$' "$out/default.yaml" && ! grep -q -- '--etcd-endpoints' "$out/default.yaml" ||
	{ echo "check-deploy: the default rendering is not one replica without etcd" >&2; exit 1; }
# Every host the default rendering (and the one with the chart's own etcd)
# points a workload at is a Service it creates.
(cd internal/deploycheck && go run ./cmd/danglinghosts "$out/default.yaml" "$out/etcd.yaml")
grep -q '"prefill-0"' "$out/static.yaml" ||
	{ echo "check-deploy: the static registration example did not render" >&2; exit 1; }
# An incomplete static registration, or a bad etcd size, fails the render
# with a message naming what is missing, instead of failing at pod start.
for bad in \
	'config.kvevent_instance={"p0":{"endpoint":"tcp://10.0.0.1:5557"}}|config.kvevent_instance.p0.type is required' \
	'config.kvevent_instance={"p0":{"endpoint":"tcp://h:1","type":"vLLM","modelname":"m","instance_id":"p0","block_size":16,"dp_rank":0}}|p0.hash_profile is required' \
	'config.kvevent_instance={"p0":{"endpoint":"tcp://h:1","type":"vLLM","modelname":"m","instance_id":"p0","dp_rank":0,"hash_profile":{}}}|p0.block_size is required' \
	'config.kvevent_instance={"p0":{"endpoint":"tcp://h:1","type":"vLLM","modelname":"m","instance_id":"p0","block_size":16,"dp_rank":0,"hash_profile":{"strategy":"vllm_v1","algorithm":"sha256","index_projection":"low64_be"}}}|python_hash_seed is required for vllm_v1' \
	'etcd.deploy={"enabled":true,"replicas":2}|etcd.deploy.replicas must be 1, 3 or 5' \
	'replicaCount=2|replicaCount > 1 needs etcd.endpoints or etcd.deploy.enabled'; do
	if msg=$("$helm" template conductor "$chart" --set-json "${bad%%|*}" 2>&1 >/dev/null); then
		echo "check-deploy: helm template accepted ${bad%%|*}" >&2
		exit 1
	fi
	if ! grep -qF -- "${bad#*|}" <<<"$msg"; then
		echo "check-deploy: helm template refused ${bad%%|*} without saying \"${bad#*|}\": $msg" >&2
		exit 1
	fi
done
echo "check-deploy: chart lints and renders ($(grep -c '^kind: ' "$out/default.yaml") objects by default)"

promtool check rules deploy/prometheus/alerts.yml
(cd deploy/prometheus && promtool test rules alerts_test.yml index_alerts_test.yml)
