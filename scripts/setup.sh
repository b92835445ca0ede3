#!/usr/bin/env bash
# Installs what this service needs beyond Go, from Debian's packages.
#
#   scripts/setup.sh          what building and running it needs: libzmq's
#                             headers and pkg-config file, pkg-config and gcc
#                             (github.com/pebbe/zmq4 goes through cgo).
#   scripts/setup.sh --test   that, plus what the test suite needs: protoc
#                             (protobuf-compiler: scripts/genproto.sh and the
#                             test that checks the generated gRPC code is
#                             current), promtool (Debian's prometheus, for
#                             scripts/check-deploy.sh's alert-rule tests) and
#                             python3-msgpack and python3-zmq (the Python
#                             example the suite runs).
#
# scripts/run.sh uses the first form, scripts/test.sh the second, so running
# the service never installs a Prometheus server. Idempotent and quiet when
# everything is already there.
set -euo pipefail

mode=run
case "${1:-}" in
"") ;;
--test) mode=test ;;
*)
	echo "usage: scripts/setup.sh [--test]" >&2
	exit 2
	;;
esac

need=()
pkg-config --exists libzmq 2>/dev/null || need+=(libzmq3-dev)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
command -v gcc >/dev/null 2>&1 || need+=(gcc)
if [ "$mode" = test ]; then
	command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
	command -v promtool >/dev/null 2>&1 || need+=(prometheus)
	/usr/bin/python3 -c 'import msgpack, zmq' >/dev/null 2>&1 || need+=(python3-msgpack python3-zmq)
fi

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
