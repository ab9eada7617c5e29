#!/usr/bin/env bash
# A/B of two builds on this host: slip-perf latency (64 B), bandwidth (64 KiB writes) and
# connection setup (connect, one 64 B request and response, close), kernel TCP and then
# each build's shm under its own slip-run, one after another in every round, so that both
# see the same host. Prints one line per test and round: the main figure of each.
#
#   tests/bench/ab.sh BASE_BUILD NEW_BUILD [ROUNDS]        (default 3 rounds)
#
# Environment: SLIP_AB_DURATION=3 (seconds per measurement), SLIP_AB_TESTS (default
# "lat bw crr"; also bw1m: 1 MiB writes). Build the base with, e.g.:
#   git worktree add /tmp/base REV && cmake -S /tmp/base -B /tmp/base/build -G Ninja && \
#     ninja -C /tmp/base/build slipstream slip-run slip-perf
set -uo pipefail

BASE=${1:?usage: ab.sh BASE_BUILD NEW_BUILD [ROUNDS]}
NEW=${2:?usage: ab.sh BASE_BUILD NEW_BUILD [ROUNDS]}
ROUNDS=${3:-3}
DURATION=${SLIP_AB_DURATION:-3}
read -r -a TESTS <<< "${SLIP_AB_TESTS:-lat bw crr}"

declare -A ARGS=([lat]="tcp_lat --size 64" [bw]="tcp_bw --size 65536" [bw1m]="tcp_bw --size 1048576"
                 [crr]="tcp_crr --size 64")
declare -A UNIT=([lat]="p50 us" [bw]="Gbit/s" [bw1m]="Gbit/s" [crr]="conn/s")

port() { echo $((20000 + RANDOM % 20000)); }

# measure BUILD WRAP TEST: the main figure of one slip-perf run, WRAP being "" or slip-run.
measure() {
  local build=$1 wrap=$2 test=$3 p
  p=$(port)
  local pre=()
  [[ -n $wrap ]] && pre=("$build/bin/slip-run" --)
  "${pre[@]}" "$build/bin/slip-perf" server -p "$p" --once >/dev/null 2>&1 &
  local server=$!
  sleep 0.5
  # shellcheck disable=SC2086
  "${pre[@]}" "$build/bin/slip-perf" client 127.0.0.1 -p "$p" ${ARGS[$test]} \
    --duration "$DURATION" --format csv 2>/dev/null | tail -1 | awk -F, '{print $(NF-2)}'
  wait "$server" 2>/dev/null
}

for ((r = 1; r <= ROUNDS; r++)); do
  for test in "${TESTS[@]}"; do
    tcp=$(measure "$NEW" "" "$test")
    base=$(measure "$BASE" slip "$test")
    new=$(measure "$NEW" slip "$test")
    printf 'round %d  %-3s (%s)  tcp %-10s base %-10s new %-10s new/base %s\n' "$r" "$test" \
      "${UNIT[$test]}" "$tcp" "$base" "$new" \
      "$(awk -v a="$new" -v b="$base" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }')"
  done
done
