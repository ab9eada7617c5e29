#!/usr/bin/env bash
# The NCCL plugin over verbs against perftest on one Soft-RoCE link, in one guest run of
# tests/vm/rxe-run (both ends on rxe0's address 10.77.0.1, as in tests/vm/bench-rdma.sh):
#   perftest       ib_write_lat -s 8 (t_typical) and ib_write_bw -s 4 MiB (BW average):
#                  the link's own limits with one RC queue pair
#   the plugin     slip-nccl-bench (tests/bench/nccl_bench.cc) with the plugin on rxe0:
#                  8 B latency (half the median round trip) and 4 MiB bandwidth with 8
#                  messages in flight, driven as NCCL's proxy does; kernel TCP on the
#                  guest's loopback in the same run for reference
# and prints the ratios against their targets (bandwidth >= 90% of ib_write_bw,
# latency <= 1.3x ib_write_lat). With SLIP_BENCH_NCCL_FABRIC=1 (make bench-fabric) the
# plugin runs a second time over libfabric's verbs provider (verbs;ofi_rxm) on the same
# rxe0, and its ratios are printed: fabric against the plugin over verbs
# (latency <= 1.2x, bandwidth >= 90%) and against perftest.
#
#   tests/vm/bench-nccl.sh [BUILD_DIR]     (host: boots the guest; make bench-nccl-rdma)
# Environment: SLIP_BENCH_NCCL_SECONDS=1 (seconds of streaming per bench point).
set -uo pipefail
BUILD=${1:-build}
cd "$(dirname "$0")/../.."
if [[ ${SLIP_BENCH_NCCL_GUEST:-0} != 1 ]]; then
  exec env SLIP_VM_TIMEOUT="${SLIP_VM_TIMEOUT:-900}" tests/vm/rxe-run \
    "SLIP_BENCH_NCCL_GUEST=1 SLIP_BENCH_NCCL_FABRIC=${SLIP_BENCH_NCCL_FABRIC:-0} tests/vm/bench-nccl.sh $BUILD"
fi

IP=10.77.0.1 DEV=rxe0 GID=1 PORT=18600

# perftest TEST SIZE FIELD ARGS...: the client's FIELD for SIZE (server and client here).
perftest() {
  local test=$1 size=$2 field=$3
  shift 3
  PORT=$((PORT + 1))
  local args=(-d "$DEV" -x "$GID" -F -p "$PORT" -s "$size" "$@")
  timeout 120 "$test" "${args[@]}" >/tmp/perftest.server 2>&1 &
  local server=$!
  sleep 1
  timeout 120 "$test" "${args[@]}" "$IP" >/tmp/perftest.client 2>&1
  wait "$server"
  awk -v s="$size" -v f="$field" '$1 == s && NF >= f { print $f; exit }' /tmp/perftest.client
}

lat=$(perftest ib_write_lat 8 5 -n 2000)
bw=$(perftest ib_write_bw 4194304 4 -n 200 --report_gbits)
echo "perftest: ib_write_lat 8 B t_typical ${lat:-?} us, ib_write_bw 4 MiB BW average ${bw:-?} Gbit/s"
echo
out=$(SLIP_TRANSPORTS=verbs timeout 600 "$BUILD/bin/slip-nccl-bench" \
  "$BUILD/lib/libnccl-net-slipstream.so" "${SLIP_BENCH_NCCL_SECONDS:-1}")
status=$?
echo "$out"
echo
[[ $status == 0 && -n $lat && -n $bw ]] || { echo "bench-nccl: a measurement failed"; exit 1; }
grep -q "plugin device: slipstream-$DEV" <<<"$out" || { echo "the plugin did not use $DEV"; exit 1; }
plugin_lat=$(awk -F'|' '$2 ~ /^ *8 B *$/ { gsub(/ /, "", $4); print $4 }' <<<"$out")
plugin_gbs=$(awk -F'|' '$2 ~ /^ *4 MiB *$/ { gsub(/ /, "", $7); print $7 }' <<<"$out")
awk -v pl="$plugin_lat" -v l="$lat" -v pg="$plugin_gbs" -v b="$bw" 'BEGIN {
  printf "| | perftest | the plugin | ratio | target |\n| --- | ---: | ---: | ---: | --- |\n"
  printf "| latency, 8 B (us) | %.2f | %.2f | %.2fx | <= 1.3x |\n", l, pl, pl / l
  printf "| bandwidth, 4 MiB (Gbit/s) | %.2f | %.2f | %.0f%% | >= 90%% |\n", b, pg * 8, 100 * pg * 8 / b
}'

[[ ${SLIP_BENCH_NCCL_FABRIC:-0} == 1 ]] || exit 0
# The same over libfabric's verbs provider (FI_UNIVERSE_SIZE: docs/DEPLOYMENT.md, rxe).
echo
fab=$(SLIP_TRANSPORTS=fabric SLIP_FABRIC_PROVIDER=verbs FI_UNIVERSE_SIZE=64 timeout 600 \
  "$BUILD/bin/slip-nccl-bench" "$BUILD/lib/libnccl-net-slipstream.so" \
  "${SLIP_BENCH_NCCL_SECONDS:-1}")
status=$?
echo "$fab"
echo
[[ $status == 0 ]] || { echo "bench-nccl: the fabric measurement failed"; exit 1; }
grep -q "plugin device: slipstream-verbs-$DEV" <<<"$fab" || { echo "fabric did not use $DEV"; exit 1; }
fab_lat=$(awk -F'|' '$2 ~ /^ *8 B *$/ { gsub(/ /, "", $4); print $4 }' <<<"$fab")
fab_gbs=$(awk -F'|' '$2 ~ /^ *4 MiB *$/ { gsub(/ /, "", $7); print $7 }' <<<"$fab")
awk -v fl="$fab_lat" -v pl="$plugin_lat" -v l="$lat" -v fg="$fab_gbs" -v pg="$plugin_gbs" \
  -v b="$bw" 'BEGIN {
  printf "| | perftest | the plugin over verbs | over fabric (verbs;ofi_rxm) | fabric / verbs | target |\n"
  printf "| --- | ---: | ---: | ---: | ---: | --- |\n"
  printf "| latency, 8 B (us) | %.2f | %.2f | %.2f | %.2fx | <= 1.2x |\n", l, pl, fl, fl / pl
  printf "| bandwidth, 4 MiB (Gbit/s) | %.2f | %.2f | %.2f | %.0f%% | >= 90%% |\n", b, pg * 8, fg * 8, 100 * fg / pg
}'
