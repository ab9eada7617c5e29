#!/usr/bin/env bash
# Two pods on one host: kernel TCP over a veth pair between two network namespaces against
# shm between them through a shared rendezvous directory (SLIP_RENDEZVOUS_DIR), measured
# in one run with slip-perf (latency, bandwidth, setup). Needs root (ip netns).
#   tests/bench/pods.sh BUILD_DIR      results in BUILD_DIR/bench-pods/
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/bench/lib.sh
source "$here/lib.sh"
build=${1:-build}
slip_setup "$build" 0
out=$build/bench-pods
mkdir -p "$out"
tag=$$
server_ns=slipbench-$tag-s client_ns=slipbench-$tag-c
dir=$(mktemp -d /tmp/slip-bench-rdv-XXXXXX)
cleanup() {
  ip netns del "$server_ns" 2>/dev/null || true
  ip netns del "$client_ns" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
ip netns add "$server_ns"
ip netns add "$client_ns"
ip link add "sb${tag}s" type veth peer name "sb${tag}c"
ip link set "sb${tag}s" netns "$server_ns"
ip link set "sb${tag}c" netns "$client_ns"
ip -n "$server_ns" addr add 10.231.9.1/24 dev "sb${tag}s"
ip -n "$client_ns" addr add 10.231.9.2/24 dev "sb${tag}c"
for ns in "$server_ns" "$client_ns"; do
  ip -n "$ns" link set lo up
  for dev in $(ip -n "$ns" -o link show | awk -F': ' '/sb[0-9]/ {print $2}' | cut -d@ -f1); do
    ip -n "$ns" link set "$dev" up
  done
done

tests=(tcp_lat tcp_bw tcp_crr)
sweep=(--sizes "${SLIP_BENCH_SIZES:-64,64K,1M}" --duration "${SLIP_BENCH_DURATION:-2}")
# run MODE: slip-perf server in one namespace, the client in the other; MODE plain or shm.
run() {
  local mode=$1 wrap=()
  # (Every connection carried however short: tcp_crr measures shm's setup.)
  [[ $mode == shm ]] && wrap=(env SLIP_RENDEZVOUS_DIR="$dir" SLIP_TRANSPORTS=shm,tcp
    SLIP_SHORT_CONNS=accelerate "$SLIP_RUN" --stats="$out/$mode.stats.jsonl" --)
  rm -f "$out/$mode.stats.jsonl"
  ip netns exec "$server_ns" timeout 300 "${wrap[@]}" "$SLIP_PERF" server -p 5301 --once \
    >"$out/$mode.server.log" 2>&1 &
  local server=$!
  for _ in $(seq 100); do
    ip netns exec "$server_ns" ss -ltn | grep -q ':5301 ' && break
    sleep 0.05
  done
  ip netns exec "$client_ns" timeout 300 "${wrap[@]}" "$SLIP_PERF" client 10.231.9.1 -p 5301 \
    "${tests[@]}" "${sweep[@]}" --format csv --label "$mode" >"$out/$mode.csv"
  wait "$server"
}
run plain
run shm
if grep -q '"transport":"tcp"' "$out/shm.stats.jsonl"; then
  echo "warning: some connections under slip-run were not on shm:" >&2
  grep -o '"transport":"tcp","reason":"[a-z_]*"' "$out/shm.stats.jsonl" | sort | uniq -c >&2
fi
echo "kernel TCP over veth (plain) vs shm across the namespaces (shm); $out/*.csv"
paste -d, "$out/plain.csv" "$out/shm.csv" | column -s, -t
