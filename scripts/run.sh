#!/usr/bin/env bash
# Runs the service with its defaults (port 13333, config from
# CONDUCTOR_CONFIG_PATH or ~/.mooncake/conductor_config.json if present).
# Extra arguments are passed to the binary, e.g. --port 14000.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
scripts/setup.sh
mkdir -p bin
go build -o bin/conductor .
exec bin/conductor "$@"
