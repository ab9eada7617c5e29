#!/bin/sh
# Installs what Slipstream needs to build, test and benchmark on Debian 12.
# Idempotent: does nothing (and needs no root) when everything is present.
set -eu

PACKAGES="build-essential cmake ninja-build pkg-config libgtest-dev clang libclang-rt-14-dev \
python3 iperf3 sockperf socat iproute2 procps libibverbs-dev librdmacm-dev rdma-core \
ibverbs-providers libfabric-dev libfabric-bin"
# `install-deps.sh workloads`: the training stacks of tests/workloads as well; `long`:
# those and CPython's test suite (workloads.cpython_sockets, in `make test-long`).
if [ "${1:-}" = "workloads" ] || [ "${1:-}" = "long" ]; then
  PACKAGES="$PACKAGES python3-grpcio python3-torch openmpi-bin python3-mpi4py nginx"
fi
if [ "${1:-}" = "long" ]; then
  PACKAGES="$PACKAGES libpython3.11-testsuite"
fi

missing=""
for p in $PACKAGES; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0

echo "install-deps: installing:$missing"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
