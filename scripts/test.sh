#!/usr/bin/env bash
# Runs the whole test suite: vet, every package's tests under the race
# detector, then each fuzz target for a short, bounded time on top of its
# seed corpus. FUZZTIME overrides the per-target fuzz time (default 10s;
# FUZZTIME=0 skips fuzzing).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
scripts/setup.sh

go vet ./...
go test -race -count=1 -timeout 20m ./...

fuzztime="${FUZZTIME:-10s}"
if [ "$fuzztime" != "0" ]; then
	for pkg in $(go list ./...); do
		dir=$(go list -f '{{.Dir}}' "$pkg")
		for target in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //' | sort -u); do
			echo "fuzz: $pkg $target for $fuzztime"
			go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg"
		done
	done
fi
