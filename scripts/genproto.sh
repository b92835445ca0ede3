#!/usr/bin/env bash
# Regenerates the Go code for the protobuf contracts under internal/inferencecache/proto/. protoc
# comes from Debian's protobuf-compiler (scripts/setup.sh --test installs it); the
# two Go plugins are built at pinned versions, so every machine generates
# byte-identical code, once per version into the user's cache (as
# scripts/check-deploy.sh keeps helm), so the staleness test that runs this
# in every suite does not link them again each time. Usage:
#   scripts/genproto.sh            # write next to the .proto files
#   scripts/genproto.sh OUTDIR     # write under OUTDIR instead (the staleness test)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"

# Pinned plugin versions: change them together with go.mod's
# google.golang.org/protobuf and google.golang.org/grpc, then rerun.
PROTOC_GEN_GO=google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
PROTOC_GEN_GO_GRPC=google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2

out="${1:-internal/inferencecache/proto}"
if ! command -v protoc >/dev/null 2>&1; then
	echo "genproto: protoc not found; run scripts/setup.sh --test" >&2
	exit 1
fi
tools="${XDG_CACHE_HOME:-$HOME/.cache}/conductor-tools"
bin="$tools/protoc-plugins-${PROTOC_GEN_GO##*@}-${PROTOC_GEN_GO_GRPC##*@}"
if [ ! -x "$bin/protoc-gen-go" ] || [ ! -x "$bin/protoc-gen-go-grpc" ]; then
	mkdir -p "$tools"
	tmp=$(mktemp -d "$tools/plugins.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	GOBIN="$tmp" go install "$PROTOC_GEN_GO"
	GOBIN="$tmp" go install "$PROTOC_GEN_GO_GRPC"
	# Moved into place whole: a run beside this one sees both or neither.
	mv -T "$tmp" "$bin" 2>/dev/null || true
	if [ ! -x "$bin/protoc-gen-go" ] || [ ! -x "$bin/protoc-gen-go-grpc" ]; then
		bin=$tmp # the cache could not take them: use this run's build
	fi
fi

mkdir -p "$out"
out=$(cd "$out" && pwd)
files=$(cd internal/inferencecache/proto && find . -name '*.proto' | sed 's|^\./||' | sort)
# shellcheck disable=SC2086 # the file list is split on purpose
(cd internal/inferencecache/proto && protoc \
	--plugin=protoc-gen-go="$bin/protoc-gen-go" \
	--plugin=protoc-gen-go-grpc="$bin/protoc-gen-go-grpc" \
	--go_out="$out" --go_opt=paths=source_relative \
	--go-grpc_out="$out" --go-grpc_opt=paths=source_relative \
	$files)
