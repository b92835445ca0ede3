#!/usr/bin/env bash
# Measures the service end to end on this machine: builds the server,
# starts it on a free loopback port (no config file), runs the load
# generator against it and stops it. Arguments go to the load generator,
# e.g. scripts/loadgen.sh --publishers 8 --blocks 200000 --duration 5s
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
scripts/setup.sh
bin="$(mktemp -d)"
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/loadgen" ./scripts/loadgen
"$bin/loadgen" --spawn "$@"
