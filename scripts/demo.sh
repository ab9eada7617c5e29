#!/usr/bin/env bash
# Slipstream demo (what `make demo` runs after building): the same slip-perf server and
# client over loopback, first on kernel TCP, then both under slip-run, side by side.
#
#   scripts/demo.sh [BUILD_DIR]       (default: build)
#
# SLIP_DEMO_DURATION=2 sets the seconds per test; SLIP_BENCH_PLAIN_ONLY=1 runs kernel TCP only.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=tests/bench/lib.sh
source "$ROOT/tests/bench/lib.sh"

BUILD=${1:-build}
DURATION=${SLIP_DEMO_DURATION:-2}
PLAIN_ONLY=${SLIP_BENCH_PLAIN_ONLY:-0}
PAIR_TIMEOUT=60
slip_setup "$BUILD" "$PLAIN_ONLY" || exit 2

WORK=$(mktemp -d "${TMPDIR:-/tmp}/slip-demo.XXXXXX") || exit 2
trap 'rm -rf "$WORK"' EXIT

# run MODE TITLE: one server and one client running tcp_lat (64 B) and tcp_bw (64 KiB).
run() {
  local mode=$1 port
  port=$(slip_free_port 15301)
  printf '  %-34s' "$2 ..."
  if slip_pair "$mode" "$WORK/$mode" "$port" exits \
    "$SLIP_PERF" server --bind 127.0.0.1 -p "$port" --count 2 :: \
    "$SLIP_PERF" client 127.0.0.1 -p "$port" tcp_lat tcp_bw --duration "$DURATION" \
    --format csv --label "$mode"; then
    echo "done"
  else
    echo "FAILED"
    sed 's/^/    /' "$WORK/$mode.err" "$WORK/$mode.server.log" >&2
    exit 1
  fi
}

# get MODE TEST COLUMN
get() { slip_csv_value "$WORK/$1.out" "$2" "$3"; }

# line TITLE TEST COLUMN BETTER DECIMALS: BETTER is lower (latency) or higher (bandwidth).
line() {
  local tcp shm ratio=""
  tcp=$(get tcp "$2" "$3")
  shm=$([[ $PLAIN_ONLY == 1 ]] || get shm "$2" "$3")
  if [[ -n $tcp && -n $shm ]]; then
    ratio=$(awk -v t="$tcp" -v s="$shm" -v b="$4" 'BEGIN {
      r = (b == "lower") ? t / s : s / t
      if (r >= 1) printf "%.1fx faster", r; else printf "%.1fx slower", 1 / r }')
  fi
  printf '  %-28s %12s %16s   %s\n' "$1" "$(number "$tcp" "$5")" "$(number "$shm" "$5")" "$ratio"
}

# number VALUE DECIMALS: VALUE rounded, or "-".
number() {
  if [[ -n $1 ]]; then printf "%.${2}f" "$1"; else echo "-"; fi
}

echo "Slipstream demo: slip-perf over loopback (127.0.0.1), ${DURATION} s per test"
echo
run tcp "kernel TCP"
[[ $PLAIN_ONLY == 1 ]] || run shm "both ends under slip-run"
echo
printf '  %-28s %12s %16s   %s\n' "" "kernel TCP" "Slipstream shm" "Slipstream"
line "latency p50, 64 B (us)" tcp_lat p50_us lower 2
line "latency mean, 64 B (us)" tcp_lat mean_us lower 2
line "bandwidth, 64 KiB (Gbit/s)" tcp_bw gbit_s higher 1
echo
echo "  Latency is one-way (round trip / 2); bandwidth is one stream of 64 KiB writes."
if [[ $PLAIN_ONLY != 1 ]]; then
  echo
  echo "Connections under slip-run, as each process recorded them:"
  slip_stats_connections "$WORK/shm.stats.jsonl"
  if ! slip_stats_all_shm "$WORK/shm.stats.jsonl"; then
    echo
    echo "Note: not every connection used shm, so the right column is (partly) kernel TCP."
    echo "The reason is shown next to each such connection."
  fi
fi
