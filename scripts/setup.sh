#!/usr/bin/env bash
# Installs what building this service needs beyond Go: libzmq (headers and
# pkg-config file, for github.com/pebbe/zmq4 through cgo), protoc (Debian's
# protobuf-compiler, which scripts/genproto.sh and the test that checks the
# generated gRPC code is current need) and promtool (Debian's prometheus,
# for scripts/check-deploy.sh), and Debian's python3-msgpack and python3-zmq
# for the Python example the suite runs. Idempotent and quiet when everything
# is already there.
set -euo pipefail

need=()
pkg-config --exists libzmq 2>/dev/null || need+=(libzmq3-dev)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
command -v gcc >/dev/null 2>&1 || need+=(gcc)
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
# The Python example (examples/python), which the test suite runs.
/usr/bin/python3 -c 'import msgpack, zmq' >/dev/null 2>&1 || need+=(python3-msgpack python3-zmq)

if ((${#need[@]})); then
	sudo=""
	if [ "$(id -u)" -ne 0 ]; then
		sudo="sudo"
	fi
	echo "setup: installing ${need[*]}" >&2
	export DEBIAN_FRONTEND=noninteractive
	$sudo apt-get update -qq
	$sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if ! command -v go >/dev/null 2>&1; then
	if [ -x /usr/local/go/bin/go ]; then
		echo "setup: add /usr/local/go/bin to PATH" >&2
	else
		echo "setup: Go is required (https://go.dev/doc/install)" >&2
	fi
	exit 1
fi
