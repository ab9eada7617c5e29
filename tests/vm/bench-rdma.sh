#!/usr/bin/env bash
# The RDMA benchmark (issue #4): over one Soft-RoCE link, in ONE guest run of tests/vm/rxe-run
# (client and server both in the guest, both on rxe0's address 10.77.0.1), compares
#   kernel TCP   slip-perf tcp_lat (64 B ping-pong) and tcp_bw (one stream of 64 KiB writes)
#   rsocket      the same two, both ends under rsocket's preload (librspreload.so)
#   Slipstream   the same two, both ends under build/bin/slip-run --transports=verbs,tcp; the
#                transport its connections really used (slip-run's stats file) marks the column
#   perftest     the raw limits of the link: ib_write_lat -s 64, ib_write_bw -s 65536 (one QP)
# Every figure is the median of a few runs. Then (the compat part) it runs unmodified
# programs, plainly, under rsocket's preload and under slip-run: iperf3, sockperf ping-pong
# and a Python asyncio echo (tests/vm/asyncio_echo.py), each under a timeout, and reports
# ok/FAIL with the error and the transport that carried the bytes.
#
#   tests/vm/bench-rdma.sh [--bench-only | --compat-only] [BUILD_DIR]     (from the host)
#
# The guest cannot write the host (its root is the host's, read-only), so the guest part
# (--guest) prints machine-readable lines ("@rec JSON", "@raw BASE64-TGZ") on stdout, which
# rxe-run streams back; this host side turns them into BUILD_DIR/bench-rdma/:
#   results.md    the tables as printed     results.json  settings and every record
#   bench.csv     one row per test/column   compat.csv    one row per program/mode
#   guest.log     the guest's whole output  raw/          every program's output and stats
#
# Environment (host side; passed into the guest like every SLIP_* variable):
#   SLIP_BENCH_RDMA_REPEAT=3       runs per figure (the median is reported)
#   SLIP_BENCH_RDMA_DURATION=0.5   seconds per slip-perf run (TCG: keep it short)
#   SLIP_BENCH_RDMA_T=90           timeout of each benchmark program, seconds
#   SLIP_BENCH_RDMA_COMPAT_T=30    timeout of each compat program, seconds
#   SLIP_VM_TIMEOUT=900            the whole guest (rxe-run kills it then)
# Exit status: 0 when every benchmark figure was measured and every program ran plainly and
# under Slipstream (rsocket's failures are findings, not failures); 1 otherwise; rxe-run's
# status (124 timeout, 125 lab failure) when the guest itself failed; 2 on a setup error.
# shellcheck disable=SC2016  # jq programs in single quotes
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
IP=10.77.0.1
DEV=rxe0
GID=1

# ============================================================================= guest side

# rec JQ-ARGS... FILTER: one machine-readable record line.
rec() { echo "@rec $(jq -nc "$@")"; }
say() { echo "guest: $*"; }

# Packets sent by rxe0 (RoCE) and TCP segments sent, guest-wide: which path carried a run.
rxe_sent() { cat "/sys/class/infiniband/$DEV/ports/1/hw_counters/sent_pkts"; }
tcp_out() {
  awk '$1 == "Tcp:" { if (!c) { for (i = 2; i <= NF; i++) if ($i == "OutSegs") c = i }
                      else { print $c; exit } }' /proc/net/snmp
}
snap() { RXE0=$(rxe_sent) TCP0=$(tcp_out); }
# Sets PATHS ("rdma", "tcp", "rdma+tcp" or "none") and PATH_NOTE from the counters since snap.
paths() {
  local drxe=$(($(rxe_sent) - RXE0)) dtcp=$(($(tcp_out) - TCP0))
  PATH_NOTE="rxe0 sent $drxe packets, TCP sent $dtcp segments"
  if ((drxe > 0 && dtcp > 0)); then
    PATHS=rdma+tcp
  elif ((drxe > 0)); then
    PATHS=rdma
  elif ((dtcp > 0)); then
    PATHS=tcp
  else
    PATHS=none
  fi
}

# wait_ready PORT PID: until something listens on PORT, by TCP or by rdma_cm (rsocket's
# listeners are rdma_cm ids, invisible to ss), while PID lives; at most 30 s.
wait_ready() {
  local port=$1 pid=$2 i
  for ((i = 0; i < 300; i++)); do
    ss -Hltn "sport = :$port" | grep -q . && return 0
    rdma res show cm_id 2>/dev/null | grep -qE "state LISTEN .*src-addr [^ ]*:$port( |\$)" &&
      return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

# stop PID GRACE: lets PID end by itself for GRACE seconds, then SIGINT (timeout(1) passes
# it on and kills 5 s later); sets SRC to its status.
stop() {
  local pid=$1 grace=$2 i
  for ((i = 0; i < grace * 10; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -INT "$pid" 2>/dev/null
  wait "$pid"
  SRC=$?
}

# pair NAME MODE PORT LIMIT GRACE SERVER... :: CLIENT...
#   MODE: plain, rsocket (both ends with LD_PRELOAD=$RS) or slip (both under slip-run
#   --transports=verbs,tcp). The client may run LIMIT seconds; the server 30 s more (it
#   starts first, and starting is slow in an emulated guest on a busy host); after the
#   client, the server has GRACE seconds to end by itself, then gets SIGINT.
#   Files: $RAW/NAME.{server.log,out,err,stats.jsonl}.
#   Sets CRC, SRC (124: timed out), PATHS, PATH_NOTE, PRE.
pair() {
  local name=$1 mode=$2 port=$3 limit=$4 grace=$5
  shift 5
  local server=() client=() wrap=()
  while [[ $# -gt 0 && $1 != "::" ]]; do server+=("$1"); shift; done
  shift
  client=("$@")
  PRE=$RAW/$name
  case $mode in
    rsocket) wrap=(env "LD_PRELOAD=$RS") ;;
    slip) wrap=("$SLIP_RUN" "--transports=verbs,tcp" --stats="$PRE.stats.jsonl" --) ;;
  esac
  snap
  timeout -s INT -k 5 $((limit + 30)) "${wrap[@]}" "${server[@]}" >"$PRE.server.log" 2>&1 &
  local spid=$!
  if ! wait_ready "$port" "$spid"; then
    echo "(the server did not listen on $port within 30 s)" >>"$PRE.server.log"
  fi
  timeout -s INT -k 5 "$limit" "${wrap[@]}" "${client[@]}" >"$PRE.out" 2>"$PRE.err"
  CRC=$?
  stop "$spid" "$grace"
  paths
}

# why LIMIT: the most telling error line of the last pair (client first, then server).
why() {
  local f line
  for f in "$PRE.err" "$PRE.out" "$PRE.server.log"; do
    line=$(grep -aiE 'error|fail|not supported|unable|denied|exception|refused|reset|abort' \
      "$f" 2>/dev/null | grep -v '^ *$' | tail -n 1)
    [[ -n $line ]] && break
  done
  [[ -z $line ]] && line=$(cat "$PRE.err" "$PRE.out" 2>/dev/null | grep -v '^ *$' | tail -n 1)
  local t=""
  [[ $CRC == 124 ]] && t="client timed out after ${1}s"
  [[ $CRC == 0 && $SRC == 124 ]] && t="the server did not end after the client (nor on SIGINT)"
  [[ $CRC != 0 && $SRC == 124 ]] && t="${t:+$t, }server timed out"
  echo "${t:+$t: }${line:-no message} (client status $CRC, server status $SRC)" | tr -s ' \t' ' '
}

# transport MODE: what carried the last pair: slip-run's stats under slip, else the counters.
transport() {
  if [[ $1 == slip ]]; then
    local s
    s=$(slip_stats_summary "$PRE.stats.jsonl")
    echo "$s"
  else
    echo "$PATHS"
  fi
}

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'; }

# ---- the benchmark

# slipperf COLUMN MODE PORT: tcp_lat and tcp_bw, each --repeat REPEAT, in one session.
slipperf() {
  local column=$1 mode=$2 port=$3 t0=$SECONDS
  pair "slip-perf.$column" "$mode" "$port" "$T" 10 \
    "$SLIP_PERF" server -p "$port" --once :: \
    "$SLIP_PERF" client "$IP" -p "$port" tcp_lat tcp_bw --duration "$DURATION" \
    --repeat "$REPEAT" --format csv --label "$column"
  local tr status=ok err="" test metric
  tr=$(transport "$mode")
  # The client's figures stand when only the server reported a failure (e.g. a connection
  # broken at the end): "warn", with the reason.
  if [[ $CRC != 0 ]]; then
    status=FAIL err=$(why "$T")
  elif [[ $SRC != 0 ]]; then
    status=warn err=$(why "$T")
  fi
  for test in tcp_lat tcp_bw; do
    local val="" min="" max="" unit
    metric=p50_us unit=us
    [[ $test == tcp_bw ]] && metric=gbit_s unit=Gbit/s
    if [[ $status != FAIL ]]; then
      # (A here-string, not a process substitution: the guest has no /dev/fd.)
      IFS=, read -r val min max <<<"$(awk -F, -v t="$test" '
        NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
        $c["test"] == t { print $c["median"] "," $c["min"] "," $c["max"]; exit }' "$PRE.out")"
    fi
    local st=$status e=$err
    [[ $st != FAIL && -z $val ]] && st=FAIL e="no $test row in $(basename "$PRE.out")"
    rec --arg test "${test#tcp_}" --arg column "$column" --arg value "$val" --arg min "$min" \
      --arg max "$max" --arg unit "$unit" --arg metric "$metric" --arg transport "$tr" \
      --arg paths "$PATH_NOTE" --arg status "$st" --arg error "$e" --argjson n "$REPEAT" \
      '{kind: "bench", test: $test, column: $column, value: $value, min: $min, max: $max,
        unit: $unit, metric: $metric, runs: $n, transport: $transport, paths: $paths,
        status: $status, error: $error}'
  done
  say "$column: $status [$tr; $PATH_NOTE] in $((SECONDS - t0)) s${err:+: $err}"
}

# perftest TEST SIZE FIELD UNIT EXTRA...: REPEAT runs of ib_TEST, FIELD of the client's
# row for SIZE, their median.
perftest() {
  local test=$1 size=$2 field=$3 unit=$4 t0=$SECONDS
  shift 4
  local vals=() r port status=ok err="" v note=""
  for ((r = 1; r <= REPEAT; r++)); do
    port=$((PORT_PERFTEST++))
    local args=(-d "$DEV" -x "$GID" -F -p "$port" -s "$size" "$@")
    pair "perftest.$test.$r" plain "$port" "$T" 5 "$test" "${args[@]}" :: "$test" "${args[@]}" "$IP"
    v=$(awk -v s="$size" -v f="$field" '$1 == s && NF >= f { print $f; exit }' "$PRE.out")
    # (0: no completion counted, seen when the emulated guest was starved.)
    if [[ $CRC != 0 || $SRC != 0 || ! $v =~ ^[0-9.]+$ || $v =~ ^[0.]+$ ]]; then
      status=FAIL err="run $r: $(why "$T")"
      break
    fi
    vals+=("$v")
    note=$PATH_NOTE
  done
  local val="" min="" max=""
  if [[ $status == ok ]]; then
    val=$(printf '%s\n' "${vals[@]}" | median)
    min=$(printf '%s\n' "${vals[@]}" | sort -g | head -n 1)
    max=$(printf '%s\n' "${vals[@]}" | sort -g | tail -n 1)
  fi
  local name=lat metric=t_typical_us
  [[ $test == ib_write_bw ]] && name=bw metric=bw_average_gbit_s
  rec --arg test "$name" --arg value "$val" --arg min "$min" --arg max "$max" \
    --arg unit "$unit" --arg metric "$metric" --arg paths "$note" --arg status "$status" \
    --arg error "$err" --arg cmd "$test ${*} -d $DEV -x $GID -F -s $size" --argjson n "$REPEAT" \
    '{kind: "bench", test: $test, column: "perftest", value: $value, min: $min, max: $max,
      unit: $unit, metric: $metric, runs: $n, transport: "rdma (verbs, one RC QP)",
      paths: $paths, status: $status, error: $error, command: $cmd}'
  say "perftest $test: $status (${vals[*]:-}) in $((SECONDS - t0)) s${err:+: $err}"
}

bench() {
  say "benchmark: $REPEAT runs per figure, slip-perf --duration $DURATION"
  slipperf tcp plain 7101
  slipperf rsocket rsocket 7102
  slipperf slipstream slip 7103
  perftest ib_write_lat 64 5 us -n 2000
  perftest ib_write_bw 65536 4 Gbit/s -n 300 --report_gbits
}

# ---- the compat part: unmodified programs

# compat PROGRAM MODE PORT CHECK SERVER... :: CLIENT...: CHECK is a regex the client's
# stdout must match (its last match is the result: the program's own figure).
compat() {
  local prog=$1 mode=$2 port=$3 check=$4 t0=$SECONDS
  shift 4
  pair "compat.$prog.$mode" "$mode" "$port" "$CT" 3 "$@"
  local status=ok err="" tr result=""
  tr=$(transport "$mode")
  if [[ $CRC != 0 || ($SRC != 0 && $SRC != 130) ]] || ! grep -qaE "$check" "$PRE.out"; then
    status=FAIL err=$(why "$CT")
  else
    result=$(grep -oaE "$check" "$PRE.out" | tail -n 1 | tr -s ' \t' ' ')
  fi
  rec --arg program "$prog" --arg mode "$mode" --arg status "$status" --arg error "$err" \
    --arg transport "$tr" --arg paths "$PATH_NOTE" --arg result "$result" \
    '{kind: "compat", program: $program, mode: $mode, status: $status, error: $error,
      transport: $transport, paths: $paths, result: $result}'
  say "compat $prog $mode: $status [$tr; $PATH_NOTE] in $((SECONDS - t0)) s${err:+: $err}"
}

compat_all() {
  say "compat: each program under a ${CT} s timeout"
  local mode port=7200
  for mode in plain rsocket slip; do
    compat iperf3 "$mode" $((++port)) '[0-9.]+ [KMG]?bits/sec' \
      iperf3 -s -1 -B "$IP" -p "$port" :: iperf3 -c "$IP" -p "$port" -t 1 -l 64K
    compat sockperf "$mode" $((++port)) 'Latency is [0-9.]+ usec' \
      sockperf server --tcp -i "$IP" -p "$port" :: \
      sockperf ping-pong --tcp -i "$IP" -p "$port" -m 64 -t 1
    compat asyncio "$mode" $((++port)) 'latency [0-9.]+ us' \
      /usr/bin/python3 "$HERE/asyncio_echo.py" server "$IP" "$port" :: \
      /usr/bin/python3 "$HERE/asyncio_echo.py" client "$IP" "$port" 200
  done
}

guest_main() {
  local parts=$1 build=$2
  REPEAT=${SLIP_BENCH_RDMA_REPEAT:-3}
  DURATION=${SLIP_BENCH_RDMA_DURATION:-0.5}
  T=${SLIP_BENCH_RDMA_T:-90}
  CT=${SLIP_BENCH_RDMA_COMPAT_T:-30}
  # The shim warns about every SLIP_* variable it does not know (the lab's included).
  local own=("${!SLIP_BENCH_RDMA_@}" "${!SLIP_VM_@}")
  [[ ${#own[@]} -gt 0 ]] && unset "${own[@]}"
  # shellcheck source=tests/bench/lib.sh
  source "$ROOT/tests/bench/lib.sh"
  SLIP_PERF=$build/bin/slip-perf
  SLIP_RUN=$build/bin/slip-run
  RS=$(dpkg -L librdmacm1 2>/dev/null | grep '/librspreload\.so$' | head -n 1)
  [[ -n $RS ]] || RS=/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so
  RAW=/tmp/bench-rdma
  PORT_PERFTEST=7150
  mkdir -p "$RAW"
  local start=$SECONDS
  rec --arg kernel "$(uname -r)" --arg rs "$RS" --arg repeat "$REPEAT" \
    --arg duration "$DURATION" --arg cpus "$(nproc)" \
    --arg dev "$DEV $(ibv_devinfo -d "$DEV" | awk '/active_mtu/ { print "active_mtu " $2 }')" \
    '{kind: "settings", kernel: $kernel, vcpus: $cpus, device: $dev, rsocket_preload: $rs,
      repeat: $repeat, duration_s: $duration}'
  [[ $parts != compat ]] && bench
  [[ $parts != bench ]] && compat_all
  say "done in $((SECONDS - start)) s"
  echo "@raw $(tar -C "$RAW" -czf - . | base64 -w 0)"
}

if [[ ${1:-} == --guest ]]; then
  guest_main "$2" "$3"
  exit 0
fi

# ============================================================================= host side

PARTS=all
case ${1:-} in
  --bench-only) PARTS=bench; shift ;;
  --compat-only) PARTS=compat; shift ;;
  -h | --help) sed -n '2,/^# shellcheck/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
esac
BUILD=${1:-build}
cd "$ROOT" || exit 2
for f in "$BUILD/bin/slip-perf" "$BUILD/bin/slip-run"; do
  [[ -x $f ]] || { echo "error: $f not found: build first (make build)" >&2; exit 2; }
done
case $BUILD in /*) echo "error: BUILD_DIR must be relative to the repository" >&2; exit 2 ;; esac
for t in jq iperf3 sockperf; do
  command -v "$t" >/dev/null && continue
  echo "bench-rdma: installing $t" >&2
  sudo=()
  [[ $(id -u) != 0 ]] && sudo=(sudo -n)
  timeout 300 "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$t" \
    >/dev/null 2>&1 || { echo "error: cannot install $t" >&2; exit 2; }
done

OUT=$BUILD/bench-rdma
rm -rf "$OUT"
mkdir -p "$OUT/raw" || exit 2
: "${SLIP_VM_TIMEOUT:=900}"
export SLIP_VM_TIMEOUT
echo "bench-rdma: one guest run (tests/vm/rxe-run), output in $OUT/"
start=$SECONDS
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
tests/vm/rxe-run "bash tests/vm/bench-rdma.sh --guest $PARTS $BUILD" |
  tee "$OUT/guest.log" | grep --line-buffered -v '^@'
vm_rc=${PIPESTATUS[0]}
echo "bench-rdma: the guest run took $((SECONDS - start)) s (status $vm_rc)"

grep '^@raw ' "$OUT/guest.log" | cut -c6- | base64 -d 2>/dev/null | tar -xzf - -C "$OUT/raw" ||
  echo "bench-rdma: no raw outputs came back" >&2
sed -i 's/^@raw .*/@raw (unpacked into raw\/)/' "$OUT/guest.log"
LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)
grep '^@rec ' "$OUT/guest.log" | cut -c6- | jq -s --arg l0 "$LOAD0" --arg l1 "$LOAD1" \
  --arg vm_s "$((SECONDS - start))" '{
    settings: (map(select(.kind == "settings")) | first |
      . + {host_load_before: $l0, host_load_after: $l1, guest_run_s: $vm_s}),
    bench: map(select(.kind == "bench")), compat: map(select(.kind == "compat"))}' \
  >"$OUT/results.json" || { echo "bench-rdma: no results" >&2; exit "${vm_rc/#0/1}"; }

jq -r '(["test", "column", "value", "min", "max", "unit", "metric", "runs", "transport",
         "status", "error"] | @csv),
       (.bench[] | [.test, .column, .value, .min, .max, .unit, .metric, .runs, .transport,
         .status, .error] | @csv)' "$OUT/results.json" >"$OUT/bench.csv"
jq -r '(["program", "mode", "status", "transport", "result", "error"] | @csv),
       (.compat[] | [.program, .mode, .status, .transport, .result, .error] | @csv)' \
  "$OUT/results.json" >"$OUT/compat.csv"

# The tables (markdown), from results.json.
jq -r '
  def fig($t; $c): (.bench[] | select(.test == $t and .column == $c)) // null;
  def show($r): if $r == null then "-" elif $r.status == "FAIL" then "FAIL"
    else $r.value + (if $r.min != "" then " (" + $r.min + "-" + $r.max + ")" else "" end) +
      (if $r.status == "warn" then " (!)" else "" end) end;
  def num($r): if $r == null or $r.status == "FAIL" then null else ($r.value | tonumber) end;
  def ratio($a; $b): if $a == null or $b == null or $b == 0 then "-"
    else (($a / $b * 100 | round) / 100 | tostring) + "x" end;
  def slipmark($r): if $r == null or $r.status == "FAIL" then ""
    elif ($r.transport | test("^[0-9]+x verbs$")) then " [verbs]"
    else " [" + $r.transport + "]" end;
  ["| test | kernel TCP | rsocket | Slipstream | perftest | Slipstream/rsocket | Slipstream/perftest |",
   "| --- | --- | --- | --- | --- | --- | --- |"][],
  (["lat", "latency 64 B, p50 us (lower is better)"], ["bw", "bandwidth 64 KiB, Gbit/s"]) as [$t, $title] |
  fig($t; "tcp") as $k | fig($t; "rsocket") as $r | fig($t; "slipstream") as $s |
  fig($t; "perftest") as $p |
  "| \($title) | \(show($k)) | \(show($r)) | \(show($s))\(slipmark($s)) | \(show($p)) | " +
  "\(ratio(num($s); num($r))) | \(ratio(num($s); num($p))) |"' "$OUT/results.json" >"$OUT/results.md"
{
  echo
  echo "Figures: median of $(jq -r '.settings.repeat' "$OUT/results.json") runs (min-max)," \
    "one guest ($(jq -r '.settings | "\(.kernel), \(.vcpus) vCPUs, \(.device)"' "$OUT/results.json")," \
    "TCG: ratios only; host load average before/after: $LOAD0 / $LOAD1)."
  echo "(!): measured, but a side reported an error. Path of each column (rxe0 and TCP" \
    "counters in the guest; Slipstream: slip-run's stats file):"
  jq -r '.bench[] | "- \(.column) \(.test): \(.status), \(.transport); \(.paths)\(if .error != "" then "; " + .error else "" end)"' \
    "$OUT/results.json"
  echo
  echo "| program | plain | rsocket (librspreload.so) | Slipstream (verbs,tcp) |"
  echo "| --- | --- | --- | --- |"
  jq -r '
    def cell($p; $m): (.compat[] | select(.program == $p and .mode == $m)) // null |
      if . == null then "-" elif .status == "ok" then "ok [\(.transport)] \(.result)"
      else "FAIL [\(.transport)]: \(.error | gsub("\\|"; "/"))" end;
    (.compat | map(.program) | unique)[] as $p |
    "| \($p) | \(cell($p; "plain")) | \(cell($p; "rsocket")) | \(cell($p; "slip")) |"' \
    "$OUT/results.json"
} >>"$OUT/results.md"
echo
cat "$OUT/results.md"
echo
echo "bench-rdma: results in $OUT/ (results.md results.json bench.csv compat.csv guest.log raw/)"

[[ $vm_rc != 0 ]] && exit "$vm_rc"
bad=$(jq '[.bench[] | select(.status != "ok")] + [.compat[] | select(.mode != "rsocket" and
  .status != "ok")] | length' "$OUT/results.json")
[[ $bad == 0 ]] || { echo "bench-rdma: $bad measurement(s) or run(s) failed" >&2; exit 1; }
exit 0
