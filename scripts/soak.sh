#!/usr/bin/env bash
# Soak test: builds the load generator, which builds the server from the
# working tree and spawns it on a free loopback port, then runs ingestion,
# queries and registration churn together for --duration (default 60s) and
# asserts a steady state: RSS within 20 % of its post-warm-up level, the
# goroutine count back at its level, no wrong answers, no 5xx, no transport
# errors. Prints a Markdown summary; exits non-zero if any assertion fails.
# Other arguments go to the load generator (see its --soak-* flags), e.g.
#   scripts/soak.sh --duration 10m --engine sglang
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
scripts/setup.sh
duration=60s
args=()
while [ $# -gt 0 ]; do
	case "$1" in
	--duration)
		[ $# -ge 2 ] || { echo "soak.sh: --duration needs a value" >&2; exit 2; }
		duration="$2"
		shift 2
		;;
	--duration=*)
		duration="${1#*=}"
		shift
		;;
	*)
		args+=("$1")
		shift
		;;
	esac
done
bin="$(mktemp -d)"
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/loadgen" ./scripts/loadgen
"$bin/loadgen" --spawn --soak "$duration" ${args[@]+"${args[@]}"}
