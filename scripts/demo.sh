#!/usr/bin/env bash
# Slipstream demo (what `make demo` runs after building): `slip-perf compare` over loopback.
# The same sweep of message sizes runs plain (kernel TCP), with both ends under slip-run
# (the socket API over shm) and natively on the shm rings; the side-by-side table is
# printed and written with a plot to BUILD_DIR/demo/compare.{csv,json,svg}.
#
#   scripts/demo.sh [BUILD_DIR]       (default: build)
#
# Environment:
#   SLIP_DEMO_SIZES=1:1M:4      message sizes (every fourth power of two from 1 B to 1 MiB)
#   SLIP_DEMO_DURATION=0.1      seconds per run
#   SLIP_DEMO_REPEAT=3          runs per point (the table shows the median and the noise)
#   SLIP_DEMO_CPUS=S,C          run the server side on CPU S and the client side on CPU C
#                               (default: wherever the scheduler puts them)
#   SLIP_BENCH_PLAIN_ONLY=1     kernel TCP and native shm only (no slip-run needed)
#
# Exit status: that of slip-perf compare: 0 when everything ran and every connection under
# slip-run used shm, 1 otherwise, 2 on a setup error.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=tests/bench/lib.sh
source "$ROOT/tests/bench/lib.sh"

BUILD=${1:-build}
SIZES=${SLIP_DEMO_SIZES:-1:1M:4}
DURATION=${SLIP_DEMO_DURATION:-0.1}
REPEAT=${SLIP_DEMO_REPEAT:-3}
CPUS=${SLIP_DEMO_CPUS:-}
PLAIN_ONLY=${SLIP_BENCH_PLAIN_ONLY:-0}
slip_setup "$BUILD" "$PLAIN_ONLY" || exit 2

args=(compare --tests "lat,bw" --sizes "$SIZES" --duration "$DURATION" --repeat "$REPEAT"
  --out "$BUILD/demo")
[[ -n $CPUS ]] && args+=(--cpus "$CPUS")
[[ $PLAIN_ONLY == 1 ]] && args+=(--transports "tcp,shm-native")

echo "Slipstream demo: kernel TCP against Slipstream on this host (slip-perf compare)"
echo
# compare bounds each of its runs itself; this outer limit only guards against a hang.
timeout -k 5 600 "$SLIP_PERF" "${args[@]}"
