#!/usr/bin/env bash
# Slipstream benchmark (what `make bench` runs): kernel TCP over loopback against Slipstream
# shm, both measured in this one run on this host, plus memcpy bandwidth as the physical
# limit. Prints a markdown table and writes it to BUILD/bench/results.md; raw outputs go to
# BUILD/bench/raw/.
#
#   tests/bench/bench.sh [BUILD_DIR]          (default: build)
#
# Environment:
#   SLIP_BENCH_DURATION=5        seconds per measurement
#   SLIP_BENCH_PLAIN_ONLY=1      kernel TCP only (no slip-run needed), e.g. to check the bench
#   SLIP_BENCH_CPUS=S,C          pin servers to CPU S and clients to CPU C (default: unpinned)
#   SLIP_BENCH_PORT=15301        first port to try
#   SLIP_RING_SIZE               also sets the memcpy size (default 1M, the shim's default)
#
# Exit status: 0 when every measurement ran (targets met or not: the table says), 1 when one
# failed or a connection in the shm column did not use shm, 2 on a setup error.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/bench/lib.sh
source "$ROOT/tests/bench/lib.sh"

BUILD=${1:-build}
DURATION=${SLIP_BENCH_DURATION:-5}
PLAIN_ONLY=${SLIP_BENCH_PLAIN_ONLY:-0}
RING=${SLIP_RING_SIZE:-1M}
RR_CONNS=4
NEXT_PORT=${SLIP_BENCH_PORT:-15301}
OUT=$BUILD/bench
RAW=$OUT/raw
RESULTS=$OUT/results.md

slip_setup "$BUILD" "$PLAIN_ONLY" || exit 2
if ! [[ $DURATION =~ ^[1-9][0-9]*$ ]]; then
  echo "error: SLIP_BENCH_DURATION must be a whole number of seconds" >&2
  exit 2
fi
# Each side of a pair may run for the measurement, its warm-up, and start-up under the shim.
PAIR_TIMEOUT=$((DURATION * 2 + 30))
mkdir -p "$RAW" || exit 2

MODES=(tcp shm)
[[ $PLAIN_ONLY == 1 ]] && MODES=(tcp)
# The shm column measures shm: connections are carried however short they are (tcp_crr's
# last one request), as slip-perf compare does; the default policy keeps those plain.
export SLIP_SHORT_CONNS=accelerate

declare -A VAL=()        # VAL[metric.mode] = number
declare -A TRANSPORT=()  # TRANSPORT[measurement] = connection summary under slip-run
FAILURES=()
FELL_BACK=()

# --- setup ---------------------------------------------------------------------------------

# Installs iperf3, sockperf and jq when absent. A tool that stays missing skips its rows.
ensure_tools() {
  local missing=() t
  for t in iperf3 sockperf jq; do command -v "$t" >/dev/null || missing+=("$t"); done
  [[ ${#missing[@]} -eq 0 ]] && return 0
  slip_apt_install "$RAW/apt.log" "${missing[@]}"
  for t in "${missing[@]}"; do
    command -v "$t" >/dev/null || echo "warning: $t is not available: its rows are skipped" >&2
  done
}

# Sets PIN_SERVER and PIN_CLIENT from SLIP_BENCH_CPUS=S,C. Unpinned by default:
# the scheduler places the processes as it would for any program. (Pinning the two ends of
# a kernel TCP ping-pong to different CPUs can cost it a cross-CPU wake-up per message,
# which in a VM is several microseconds; pinning them to one CPU starves a spinning
# transport. Neither is what an unmodified program gets.)
pick_cpus() {
  local spec=${SLIP_BENCH_CPUS:-none}
  [[ $spec == none ]] && return 0
  if ! [[ $spec =~ ^[0-9]+,[0-9]+$ ]] || ! command -v taskset >/dev/null; then
    echo "error: SLIP_BENCH_CPUS must be S,C (two CPU numbers) and needs taskset" >&2
    exit 2
  fi
  PIN_SERVER=${spec%%,*} PIN_CLIENT=${spec##*,}
}

# --- measurements --------------------------------------------------------------------------

# failure_reason PREFIX: the client's last error line (some tools print errors on stdout),
# else its last line on stderr.
failure_reason() {
  local why
  why=$(cat "$1.err" "$1.out" 2>/dev/null | grep -i 'error' | tail -n 1)
  [[ -z $why ]] && why=$(tail -n 1 "$1.err" 2>/dev/null)
  echo "${why:-no message}"
}

# pair NAME MODE SERVER_END SERVER... :: CLIENT...
# Runs slip_pair on a free port ("{port}" in the commands is replaced by it). Sets PREFIX.
pair() {
  local name=$1 mode=$2 end=$3
  shift 3
  local port
  port=$(slip_free_port "$NEXT_PORT")
  NEXT_PORT=$((port + 1))
  PREFIX=$RAW/$name.$mode
  printf '  %-5s %-22s ' "$mode" "$name"
  local rc=0
  slip_pair "$mode" "$PREFIX" "$port" "$end" "${@//\{port\}/$port}" || rc=$?
  if [[ $rc != 0 ]]; then
    local why
    why=$(failure_reason "$PREFIX")
    [[ $rc == 124 ]] && why="timed out after ${PAIR_TIMEOUT}s"
    echo "FAILED (status $rc): $why"
    FAILURES+=("$name over $mode: status $rc: $why (files: $PREFIX.*)")
    return 1
  fi
  echo "ok"
  if [[ $mode == shm ]]; then
    TRANSPORT[$name]=$(slip_stats_summary "$PREFIX.stats.jsonl")
    slip_stats_all_shm "$PREFIX.stats.jsonl" || FELL_BACK+=("$name")
  fi
}

# solo NAME TITLE CMD...: one program on its own (no server pair) under timeout, its
# output in $RAW/NAME.out and .err. Sets PREFIX; returns its status.
solo() {
  local name=$1 title=$2
  shift 2
  PREFIX=$RAW/$name
  printf '  %-5s %-22s ' "-" "$title"
  if timeout -k 5 "$PAIR_TIMEOUT" "$@" >"$PREFIX.out" 2>"$PREFIX.err"; then
    echo "ok"
    return 0
  fi
  echo "FAILED: $(tail -n 1 "$PREFIX.err")"
  FAILURES+=("$title: $(tail -n 1 "$PREFIX.err")")
  return 1
}

measure_slip_perf() {
  local mode=$1
  if pair slip-perf-lat "$mode" exits \
    "$SLIP_PERF" server --bind 127.0.0.1 -p '{port}' --once :: \
    "$SLIP_PERF" client 127.0.0.1 -p '{port}' tcp_lat --size 64 --duration "$DURATION" \
    --format csv --label "$mode"; then
    slip_value lat_mean "$mode" "$(slip_csv_value "$PREFIX.out" tcp_lat mean_us)"
    slip_value lat_p50 "$mode" "$(slip_csv_value "$PREFIX.out" tcp_lat p50_us)"
    slip_value lat_p99 "$mode" "$(slip_csv_value "$PREFIX.out" tcp_lat p99_us)"
  fi
  if pair slip-perf-bw "$mode" exits \
    "$SLIP_PERF" server --bind 127.0.0.1 -p '{port}' --once :: \
    "$SLIP_PERF" client 127.0.0.1 -p '{port}' tcp_bw --size 64K --duration "$DURATION" \
    --format csv --label "$mode"; then
    slip_value bw "$mode" "$(slip_csv_value "$PREFIX.out" tcp_bw gbit_s)"
  fi
}

# Request/response rate over several connections, and connection setup (connect, one
# request and response, close): the shim registers at the listener's rendezvous on every
# connect, so this is where its setup cost shows.
measure_slip_perf_rates() {
  local mode=$1
  if pair slip-perf-rr "$mode" exits \
    "$SLIP_PERF" server --bind 127.0.0.1 -p '{port}' --once :: \
    "$SLIP_PERF" client 127.0.0.1 -p '{port}' tcp_rr --size 64 --conns "$RR_CONNS" \
    --duration "$DURATION" --format csv --label "$mode"; then
    slip_value rr "$mode" "$(slip_csv_value "$PREFIX.out" tcp_rr trans_s)"
  fi
  if pair slip-perf-crr "$mode" exits \
    "$SLIP_PERF" server --bind 127.0.0.1 -p '{port}' --once :: \
    "$SLIP_PERF" client 127.0.0.1 -p '{port}' tcp_crr --size 64 --duration "$DURATION" \
    --format csv --label "$mode"; then
    slip_value crr "$mode" "$(slip_csv_value "$PREFIX.out" tcp_crr trans_s)"
  fi
}

# The shm transport itself, without sockets or the preload (slip-perf native: a forked
# pair on the library's rings), so that the cost of the socket layer on top is visible.
measure_native() {
  local pin=()
  [[ -n ${PIN_SERVER:-} && -n ${PIN_CLIENT:-} ]] && pin=(--cpus "$PIN_SERVER,$PIN_CLIENT")
  if solo native "native shm" "$SLIP_PERF" native shm_lat shm_bw --duration "$DURATION" \
    "${pin[@]}" --format csv; then
    slip_value native_lat - "$(slip_csv_value "$PREFIX.out" shm_lat p50_us)"
    slip_value native_bw - "$(slip_csv_value "$PREFIX.out" shm_bw gbit_s)"
  fi
}

# Kernel TCP's best case for ping-pong: both ends on one CPU, where a message wakes its
# peer without a cross-CPU wake-up (in a VM, an idle virtual CPU can take tens of
# microseconds to wake). Informational, shown against the unpinned shm figure: the
# comparison itself runs unpinned.
measure_slip_perf_one_cpu() {
  [[ $1 == tcp ]] && command -v taskset >/dev/null || return 0
  local cpu
  cpu=$(awk '/^Cpus_allowed_list/ { split($2, a, /[-,]/); print a[1] }' /proc/self/status)
  [[ -n $cpu ]] || return 0
  if PIN_SERVER=$cpu PIN_CLIENT=$cpu pair slip-perf-lat-1cpu tcp exits \
    "$SLIP_PERF" server --bind 127.0.0.1 -p '{port}' --once :: \
    "$SLIP_PERF" client 127.0.0.1 -p '{port}' tcp_lat --size 64 --duration "$DURATION" \
    --format csv --label tcp-1cpu; then
    slip_value lat_mean_1cpu tcp "$(slip_csv_value "$PREFIX.out" tcp_lat mean_us)"
  fi
}

# --mps 2000000: sockperf sizes its sample buffer from the message rate, and its default
# (about 600K messages/s) is exceeded by shm, which makes it abort with "_seqN >
# m_maxSequenceNo". 2M round trips/s is above what either column reaches, so nothing is
# throttled; both columns get the same flag.
measure_sockperf() {
  local mode=$1
  command -v sockperf >/dev/null || return 0
  if pair sockperf "$mode" int \
    sockperf server --tcp -i 127.0.0.1 -p '{port}' :: \
    sockperf ping-pong --tcp -i 127.0.0.1 -p '{port}' -m 64 -t "$DURATION" --mps 2000000; then
    slip_value sockperf "$mode" "$(sed -n 's/.*Summary: Latency is \([0-9.]*\) usec.*/\1/p' \
      "$PREFIX.out" "$PREFIX.err" | head -n 1)"
  fi
}

measure_iperf3() {
  local mode=$1
  command -v iperf3 >/dev/null || return 0
  if pair iperf3 "$mode" exits \
    iperf3 -s -B 127.0.0.1 -p '{port}' -1 :: \
    iperf3 -c 127.0.0.1 -p '{port}' -l 64K -t "$DURATION" -f g; then
    slip_value iperf3 "$mode" "$(awk '/receiver/ {
        for (i = 2; i <= NF; i++) if ($i == "Gbits/sec") { print $(i - 1); exit } }' \
      "$PREFIX.out")"
  fi
}

measure_memcpy() {
  local pin=()
  [[ -n ${PIN_CLIENT:-} ]] && pin=(taskset -c "$PIN_CLIENT")
  if solo memcpy "memcpy $RING" "${pin[@]}" "$SLIP_PERF" memcpy --size "$RING" \
    --duration "$DURATION" --format csv; then
    slip_value memcpy_gbit - "$(slip_csv_value "$PREFIX.out" memcpy gbit_s)"
    slip_value memcpy_gb - "$(slip_csv_value "$PREFIX.out" memcpy gb_s)"
  fi
}

# --- report --------------------------------------------------------------------------------

# ratio A B: A / B to three significant digits, or nothing.
ratio() {
  [[ -n $1 && -n $2 ]] && awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.3g", a / b }'
}

# row TITLE METRIC KIND [SHM_METRIC]: KIND lat (lower is better, target shm <= 1/5 of tcp,
# aim 1/10), bw (target shm >= 2.5x tcp) or info (no target). The shm column shows
# SHM_METRIC when given, else METRIC.
row() {
  local title=$1 metric=$2 kind=$3 shm_metric=${4:-$2}
  local tcp=${VAL[$metric.tcp]:-} shm=${VAL[$shm_metric.shm]:-} r target verdict
  r=$(ratio "$shm" "$tcp")
  case $kind in
    lat) target="shm <= 0.20x tcp (aim 0.10x)" ;;
    bw) target="shm >= 2.5x tcp" ;;
    *) target="-" ;;
  esac
  if [[ $kind == info ]]; then
    verdict="-"
  elif [[ $PLAIN_ONLY == 1 ]]; then
    verdict="not run"
  elif [[ -z $r ]]; then
    verdict="no data"
  elif [[ $kind == lat ]]; then
    verdict=$(awk -v r="$r" 'BEGIN {
      print (r <= 0.10) ? "met (aim met)" : (r <= 0.20) ? "met (aim not reached)" : "NOT met" }')
  else
    verdict=$(awk -v r="$r" 'BEGIN { print (r >= 2.5) ? "met" : "NOT met" }')
  fi
  local shm_text=${shm:-n/a}
  [[ $PLAIN_ONLY == 1 ]] && shm_text="not run"
  printf '| %s | %s | %s | %s | %s | %s |\n' "$title" "${tcp:-n/a}" "$shm_text" \
    "${r:+${r}x}" "$target" "$verdict"
}

# native_line: the transport itself, and how close the socket API over it comes.
native_line() {
  local lat=${VAL[native_lat.-]:-} bw=${VAL[native_bw.-]:-} reach=""
  [[ -n $lat && -n $bw ]] || return 0
  [[ -n ${VAL[lat_p50.shm]:-} ]] && reach+=$(awk -v a="${VAL[lat_p50.shm]}" -v b="$lat" \
    'BEGIN { printf " latency %.2fx of it,", a / b }')
  [[ -n ${VAL[bw.shm]:-} ]] && reach+=$(awk -v a="${VAL[bw.shm]}" -v b="$bw" \
    'BEGIN { printf " bandwidth %.0f%% of it,", 100 * a / b }')
  [[ -n $reach ]] && reach=" Through the socket API under slip-run:${reach%,}."
  echo "The transport itself (slip-perf native, no sockets): 64 B latency p50 $lat us," \
    "64 KiB bandwidth $bw Gbit/s.${reach}"
}

# memcpy_line: the physical limit, and how much of it tcp_bw reaches in each column.
memcpy_line() {
  local limit=${VAL[memcpy_gbit.-]:-} mode bw reach=""
  [[ -n $limit ]] || return 0
  for mode in "${MODES[@]}"; do
    bw=${VAL[bw.$mode]:-}
    [[ -n $bw ]] && reach+=$(awk -v m="$mode" -v a="$bw" -v b="$limit" \
      'BEGIN { printf " %s %.0f%%,", m, 100 * a / b }')
  done
  [[ -n $reach ]] && reach=" slip-perf tcp_bw reaches${reach%,} of it."
  echo "Physical limit: memcpy of a $RING buffer on one core:" \
    "${VAL[memcpy_gb.-]} GB/s (${limit} Gbit/s).${reach}"
}

report() {
  local cpu
  cpu=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo 2>/dev/null)
  echo "# Slipstream benchmark: kernel TCP vs Slipstream shm"
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'); host: $(uname -srm); CPU: ${cpu:-?}" \
    "($(nproc) CPUs usable)"
  echo "- loopback 127.0.0.1, ${DURATION} s per measurement; CPUs: server" \
    "${PIN_SERVER:-unpinned}, client ${PIN_CLIENT:-unpinned}; ring/memcpy size $RING"
  echo "- tcp: both ends plain; shm: both ends under \`slip-run\`." \
    "Ratio = shm / tcp. Latency is one-way (round trip / 2)."
  echo
  echo "| metric | tcp | shm | ratio | target | verdict |"
  echo "| --- | ---: | ---: | ---: | --- | --- |"
  row "slip-perf tcp_lat 64 B, mean (us)" lat_mean lat
  row "slip-perf tcp_lat 64 B, p50 (us)" lat_p50 info
  row "slip-perf tcp_lat 64 B, p99 (us)" lat_p99 info
  row "slip-perf tcp_lat 64 B, mean, tcp with both ends on one CPU (its best case) (us)" \
    lat_mean_1cpu info lat_mean
  row "sockperf ping-pong 64 B, avg (us)" sockperf lat
  row "slip-perf tcp_bw 64 KiB writes (Gbit/s)" bw bw
  row "iperf3 -l 64K (Gbit/s)" iperf3 bw
  row "slip-perf tcp_rr 64 B, $RR_CONNS connections (transactions/s)" rr info
  row "slip-perf tcp_crr 64 B, connect + request + response + close (connections/s)" crr info
  echo
  native_line
  memcpy_line
  if [[ $PLAIN_ONLY != 1 ]]; then
    echo
    echo "Transports of the connections under slip-run (each end counted by its process):"
    echo
    local name
    for name in slip-perf-lat slip-perf-bw slip-perf-rr slip-perf-crr sockperf iperf3; do
      [[ -n ${TRANSPORT[$name]:-} ]] && echo "- $name: ${TRANSPORT[$name]}"
    done
    if [[ ${#FELL_BACK[@]} -gt 0 ]]; then
      echo
      echo "**Warning:** not every connection of ${FELL_BACK[*]} used shm: those shm" \
        "figures are (partly) kernel TCP."
    fi
  fi
  if [[ ${#FAILURES[@]} -gt 0 ]]; then
    echo
    echo "Failures:"
    echo
    local f
    for f in "${FAILURES[@]}"; do echo "- $f"; done
  fi
}

# --- main ----------------------------------------------------------------------------------

ensure_tools
pick_cpus
echo "Slipstream benchmark: ${MODES[*]}, ${DURATION} s per measurement, raw output in $RAW"
measure_memcpy
measure_native
# Each tool over tcp then shm back to back, so that both columns see the same host state.
for measure in measure_slip_perf measure_slip_perf_one_cpu measure_slip_perf_rates \
  measure_sockperf measure_iperf3; do
  for mode in "${MODES[@]}"; do "$measure" "$mode"; done
done
echo
report | tee "$RESULTS"
echo
echo "written to $RESULTS"
[[ ${#FAILURES[@]} -eq 0 && ${#FELL_BACK[@]} -eq 0 ]]
