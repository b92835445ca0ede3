#!/usr/bin/env bash
# Checks deploy/ with the real tools: the Helm chart lints (strict) and
# renders with its defaults and with the StatefulSet, etcd-TLS and
# ServiceMonitor options on; the Prometheus alert rules load and pass
# their unit tests. helm is built from its Go module (pinned below) once
# and kept in the user's cache; promtool comes from Debian's prometheus
# package, which scripts/setup.sh installs.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"

helm_version=v3.22.0
tools="${XDG_CACHE_HOME:-$HOME/.cache}/conductor-tools"
helm="$tools/helm-$helm_version"
if [ ! -x "$helm" ]; then
	echo "check-deploy: building helm $helm_version (once)" >&2
	mkdir -p "$tools"
	GOBIN="$tools/bin.$$" go install "helm.sh/helm/v3/cmd/helm@$helm_version"
	mv "$tools/bin.$$/helm" "$helm"
	rmdir "$tools/bin.$$"
fi

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
for want in "default.yaml:Deployment" "default.yaml:PodDisruptionBudget" "options.yaml:StatefulSet" "options.yaml:ServiceMonitor"; do
	if ! grep -q "^kind: ${want#*:}\$" "$out/${want%%:*}"; then
		echo "check-deploy: helm template ($want) rendered no ${want#*:}" >&2
		exit 1
	fi
done
echo "check-deploy: chart lints and renders ($(grep -c '^kind: ' "$out/default.yaml") objects by default)"

promtool check rules deploy/prometheus/alerts.yml
(cd deploy/prometheus && promtool test rules alerts_test.yml index_alerts_test.yml)
