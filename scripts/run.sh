#!/usr/bin/env bash
# Runs the service with its defaults (port 13333, config from
# CONDUCTOR_CONFIG_PATH or ~/.mooncake/conductor_config.json if present).
# Extra arguments are passed to the binary, e.g. --port 14000. Installs
# only what building and running needs (scripts/setup.sh: libzmq,
# pkg-config, gcc); the test suite's tools come with scripts/test.sh.
#
# The binary is stamped with the checkout's version and commit (git
# describe, git rev-parse), so --version and conductor_build_info say which
# build runs; outside a git checkout the Go toolchain's own record is used.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
scripts/setup.sh
mkdir -p bin
pkg=github.com/mooncake-conductor-go/conductor/internal/buildinfo
ldflags=()
if commit=$(git rev-parse HEAD 2>/dev/null); then
	version=$(git describe --tags --always --dirty 2>/dev/null || echo "$commit")
	if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
		commit="$commit-dirty"
	fi
	ldflags=(-ldflags "-X $pkg.version=$version -X $pkg.commit=$commit")
fi
go build "${ldflags[@]}" -o bin/conductor .
exec bin/conductor "$@"
