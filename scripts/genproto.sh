#!/usr/bin/env bash
# Regenerates the Go code for the protobuf contracts under internal/inferencecache/proto/. protoc
# comes from Debian's protobuf-compiler (scripts/setup.sh installs it); the
# two Go plugins are built at pinned versions into a temporary directory, so
# every machine generates byte-identical code. Usage:
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
	echo "genproto: protoc not found; run scripts/setup.sh" >&2
	exit 1
fi
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
GOBIN="$bin" go install "$PROTOC_GEN_GO"
GOBIN="$bin" go install "$PROTOC_GEN_GO_GRPC"

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
