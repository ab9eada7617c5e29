#!/usr/bin/env bash
# The RDMA benchmark: over one Soft-RoCE link, in ONE guest run of tests/vm/rxe-run
# (client and server both in the guest, both on rxe0's address 10.77.0.1), compares
#   kernel TCP   slip-perf tcp_lat (64 B ping-pong) and tcp_bw (one stream of 64 KiB writes)
#   rsocket      the same two, both ends under rsocket's preload (librspreload.so)
#   Slipstream   the same two, both ends under build/bin/slip-run --transports=verbs,tcp; the
#                transport its connections really used (slip-run's stats file) marks the column
#   fabric       the same two, both ends under slip-run --transports=fabric,tcp
#                --fabric-provider=verbs (the streams over libfabric's verbs provider,
#                ofi_rxm), the transport and provider from the stats again
#   perftest     the raw limits of the link: ib_write_lat -s 64, ib_write_bw -s 65536 (one QP)
# Every figure is the median of a few runs. Then (the compat part) it runs unmodified
# programs, plainly, under rsocket's preload and under slip-run: iperf3, sockperf ping-pong
# and a Python asyncio echo (tests/vm/asyncio_echo.py), each under a timeout, and reports
# ok/FAIL with the error and the transport that carried the bytes. Then (the setup part)
# connection setup: tests/stress/storm.c, rebuilt here with 10.77.0.1 in place of 127.0.0.1
# (rdma_cm has no loopback), plain, both ends under slip-run --transports=verbs,tcp and
# under rsocket's preload: "storm" (rounds of short-lived connections, C in flight:
# nonblocking connect, request, reply, server close, EOF, close), "serial" (the same, one in
# flight) and "sequential" (blocking connects one after another, all held open), in
# connections/s; cmtime (rdmacm-utils) gives the raw
# rdma_cm cost of the same link, step by step. Slipstream's connections must all be verbs
# (slip-run's stats, both ends) and move RoCE packets (rxe0's counter).
#
#   tests/vm/bench-rdma.sh [--bench-only | --compat-only | --setup-only] [BUILD_DIR]  (host)
#
# The guest cannot write the host (its root is the host's, read-only), so the guest part
# (--guest) prints machine-readable lines ("@rec JSON", "@raw BASE64-TGZ") on stdout, which
# rxe-run streams back; this host side turns them into BUILD_DIR/bench-rdma/:
#   results.md    the tables as printed     results.json  settings and every record
#   bench.csv     one row per test/column   compat.csv    one row per program/mode
#   setup.csv     one row per setup test    bin/          storm, built for the link
#   guest.log     the guest's whole output  raw/          every program's output and stats
#
# Environment (host side; passed into the guest like every SLIP_* variable):
#   SLIP_BENCH_RDMA_REPEAT=3       runs per figure (the median is reported)
#   SLIP_BENCH_RDMA_DURATION=0.5   seconds per slip-perf run (TCG: keep it short)
#   SLIP_BENCH_RDMA_T=90           timeout of each benchmark program, seconds
#   SLIP_BENCH_RDMA_COMPAT_T=30    timeout of each compat program, seconds
#   SLIP_BENCH_RDMA_SETUP_CONNS=100    setup: storm connections per round
#   SLIP_BENCH_RDMA_SETUP_ROUNDS=3     setup: storm rounds (the median round is reported)
#   SLIP_BENCH_RDMA_SETUP_INFLIGHT=20  setup: storm connections in flight (cmtime's batch)
#   SLIP_BENCH_RDMA_SETUP_SEQ=50       setup: sequential connects per run (REPEAT runs)
#   SLIP_BENCH_RDMA_SETUP_T=120        setup: timeout of each storm client, seconds
#   SLIP_BENCH_RDMA_SETUP_RSOCKET=1    setup: 0 skips the rsocket column
#   SLIP_VM_TIMEOUT=1500           the whole guest (rxe-run kills it then)
# Exit status: 0 when every benchmark figure was measured, every program ran plainly and
# under Slipstream, and every setup figure was measured with Slipstream's connections all on
# verbs (rsocket's failures are findings, not failures); 1 otherwise; rxe-run's
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

# drain PORT PID: waits (at most 60 s, while PID lives) until the server has no connection
# on PORT left open (ESTAB or CLOSE-WAIT): a server that never ends by itself then gets its
# SIGINT only once it has closed every connection (closing a verbs connection is slow).
drain() {
  local port=$1 pid=$2 i
  for ((i = 0; i < 300; i++)); do
    ss -Htn "sport = :$port" | grep -qE '^(ESTAB|CLOSE-WAIT) ' || return 0
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.2
  done
}

# pair NAME MODE PORT LIMIT GRACE SERVER... :: CLIENT...
#   MODE: plain, rsocket (both ends with LD_PRELOAD=$RS) or slip (both under slip-run
#   --transports=verbs,tcp), fabric likewise; Slipstream's lanes carry every connection,
#   however short (SLIP_SHORT_CONNS=accelerate: the default policy would keep the setup
#   tests' one-request connections plain). The client may run LIMIT seconds; the server 30 s more (it
#   starts first, and starting is slow in an emulated guest on a busy host); after the
#   client, the server has GRACE seconds to end by itself, then gets SIGINT.
#   Files: $RAW/NAME.{server.log,out,err,stats.jsonl}.
#   With DRAIN=1, the server's GRACE starts once it has closed every connection (drain).
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
    slip)
      wrap=(env SLIP_SHORT_CONNS=accelerate "$SLIP_RUN" "--transports=verbs,tcp"
        --stats="$PRE.stats.jsonl" --)
      ;;
    fabric)
      wrap=(env SLIP_SHORT_CONNS=accelerate FI_UNIVERSE_SIZE=64 "$SLIP_RUN" "--transports=fabric,tcp"
        --fabric-provider=verbs --stats="$PRE.stats.jsonl" --)
      ;;
  esac
  snap
  timeout -s INT -k 5 $((limit + 30)) "${wrap[@]}" "${server[@]}" >"$PRE.server.log" 2>&1 &
  local spid=$!
  if ! wait_ready "$port" "$spid"; then
    echo "(the server did not listen on $port within 30 s)" >>"$PRE.server.log"
  fi
  timeout -s INT -k 5 "$limit" "${wrap[@]}" "${client[@]}" >"$PRE.out" 2>"$PRE.err"
  CRC=$?
  [[ ${DRAIN:-0} == 1 ]] && drain "$port" "$spid"
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
  if [[ $1 == slip || $1 == fabric ]]; then
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
  slipperf fabric fabric 7104
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

# ---- the setup part: connections per second

# verbs_check TOTAL: under slip, every one of the TOTAL connections must be verbs at both
# ends (slip-run's stats: one record per process, 2 x TOTAL ends) and RoCE packets must have
# moved. Prints what is wrong, nothing when all is well.
verbs_check() {
  local total=$1 verbs others
  verbs=$(jq -rR 'fromjson? | .connections[]? | select(.transport == "verbs") | 1' \
    "$PRE.stats.jsonl" 2>/dev/null | wc -l)
  others=$(jq -rR 'fromjson? | .connections[]? | select(.transport != "verbs") | 1' \
    "$PRE.stats.jsonl" 2>/dev/null | wc -l)
  if ((verbs != 2 * total || others != 0)); then
    echo "expected $((2 * total)) connection ends on verbs, the stats list $verbs on verbs" \
      "and $others other: $(slip_stats_summary "$PRE.stats.jsonl")"
  elif [[ $PATHS != rdma* ]]; then
    echo "the stats say verbs but rxe0 sent no packet ($PATH_NOTE)"
  fi
}

# setup_rec TEST COLUMN STATUS ERROR UNIT VALUES...: the median (min-max) of VALUES.
setup_rec() {
  local test=$1 column=$2 status=$3 err=$4 unit=$5 tr=$6
  shift 6
  local val="" min="" max=""
  if [[ $# -gt 0 ]]; then
    val=$(printf '%s\n' "$@" | median)
    min=$(printf '%s\n' "$@" | sort -g | head -n 1)
    max=$(printf '%s\n' "$@" | sort -g | tail -n 1)
  fi
  [[ $status == ok && -z $val ]] && status=FAIL err="no figure"
  rec --arg test "$test" --arg column "$column" --arg value "$val" --arg min "$min" \
    --arg max "$max" --arg unit "$unit" --arg transport "$tr" --arg paths "$PATH_NOTE" \
    --arg status "$status" --arg error "$err" --argjson n "$#" \
    --argjson conns "${SETUP_TOTAL:-0}" --argjson inflight "${SETUP_INFLIGHT:-0}" \
    --arg close "${CLOSE_MS:-}" \
    '{kind: "setup", test: $test, column: $column, value: $value, min: $min, max: $max,
      unit: $unit, runs: $n, conns: $conns, inflight: $inflight, transport: $transport,
      paths: $paths, status: $status, error: $error, close_ms_per_conn: $close}'
  say "setup $test $column: $status ${val:+$val $unit }[$tr; $PATH_NOTE]${err:+: $err}"
}

# gates NAME N: a gate directory for storm's client with go.0..go.N already there, so it
# never waits.
gates() {
  local dir=$RAW/gate.$1 k
  mkdir -p "$dir"
  for ((k = 0; k <= $2; k++)); do : >"$dir/go.$k"; done
  echo "$dir"
}

# setup_storm COLUMN MODE PORT LIMIT [TEST INFLIGHT]: one storm run, SETUP_ROUNDS rounds of
# SETUP_CONNS connections with INFLIGHT (default SETUP_INFLIGHT) in flight; the figure is
# each round's connections/s. TEST "serial" (1 in flight: one short-lived connection after
# another) is the pattern a process that reconnects for every request makes.
setup_storm() {
  local column=$1 mode=$2 port=$3 limit=$4 test=${5:-storm} inflight=${6:-$SETUP_INFLIGHT}
  local t0=$SECONDS gate total=$((SETUP_CONNS * SETUP_ROUNDS))
  gate=$(gates "$test.$column" "$SETUP_ROUNDS")
  DRAIN=1 pair "setup.$test.$column" "$mode" "$port" "$limit" 1 \
    "$STORM" serve --port "$port" --mode close :: \
    "$STORM" client --port "$port" --mode storm --conns "$SETUP_CONNS" \
    --concurrency "$inflight" --rounds "$SETUP_ROUNDS" --gate "$gate"
  local status=ok err="" tr vals=() ok
  tr=$(transport "$mode")
  ok=$(jq -rR 'fromjson? | select(.role == "client") | .ok' "$PRE.out" 2>/dev/null)
  if [[ $CRC != 0 || ($SRC != 0 && $SRC != 130) || $ok != "$total" ]]; then
    status=FAIL err="$(why "$limit"); ${ok:-no} of $total connections completed"
  else
    read -r -a vals <<<"$(jq -rR 'fromjson? | select(.event == "round") | .conns_per_s' \
      "$PRE.out" | tr '\n' ' ')"
  fi
  if [[ $mode == slip && $status == ok ]]; then
    err=$(verbs_check "$total")
    [[ -n $err ]] && status=FAIL
  fi
  SETUP_TOTAL=$total SETUP_INFLIGHT=$inflight \
    setup_rec "$test" "$column" "$status" "$err" conn/s "$tr" "${vals[@]}"
  say "setup $test $column: $((SECONDS - t0)) s"
}

# setup_seq COLUMN MODE PORT RUNS: RUNS runs of SETUP_SEQ blocking connects one after
# another (storm's hold mode; then a request and reply on each, then all closed); the figure
# is SETUP_SEQ / the time of the connects.
setup_seq() {
  local column=$1 mode=$2 port=$3 runs=$4 t0=$SECONDS r gate
  local status=ok err="" tr="" vals=() closes=() v
  for ((r = 1; r <= runs; r++)); do
    gate=$(gates "seq.$column.$r" 2)
    DRAIN=1 pair "setup.seq.$column.$r" "$mode" "$port" "$ST" 1 \
      "$STORM" serve --port "$port" --mode hold :: \
      "$STORM" client --port "$port" --mode hold --conns "$SETUP_SEQ" --gate "$gate"
    port=$((port + 1))
    tr=$(transport "$mode")
    v=$(jq -rR --argjson n "$SETUP_SEQ" 'fromjson? | select(.event == "open" and .ok == $n) |
      $n / .connect_s | . * 10 | round / 10' "$PRE.out" 2>/dev/null)
    if [[ $CRC != 0 || ($SRC != 0 && $SRC != 130) || -z $v ]]; then
      status=FAIL err="run $r: $(why "$ST")"
      break
    fi
    if [[ $mode == slip ]]; then
      err=$(verbs_check "$SETUP_SEQ")
      [[ -n $err ]] && { status=FAIL err="run $r: $err"; break; }
    fi
    vals+=("$v")
    closes+=("$(jq -rR --argjson n "$SETUP_SEQ" 'fromjson? | select(.event == "closed") |
      .close_s * 1e6 / $n | round / 1000' "$PRE.out" 2>/dev/null)")
  done
  [[ $status == FAIL ]] && vals=()
  CLOSE_MS=$(printf '%s\n' "${closes[@]}" | grep . | median)
  SETUP_TOTAL=$((SETUP_SEQ * runs)) SETUP_INFLIGHT=1 \
    setup_rec sequential "$column" "$status" "$err" conn/s "$tr" "${vals[@]}"
  CLOSE_MS=""
  say "setup sequential $column: $((SECONDS - t0)) s"
}

# cmtime_steps FILE: "step=total_ms ..." from cmtime's table (its first figure per step).
cmtime_steps() {
  awk -F: '/^[a-z ]+: / { gsub(/ +$/, "", $1); split($2, f, " "); gsub(/ /, "_", $1)
    printf "%s%s=%s", sep, $1, f[1]; sep = " " } END { print "" }' "$1"
}

# setup_cmtime PORT: cmtime, the raw rdma_cm cost on this link, against one cmtime server.
# Sequential: REPEAT runs of one connection (create id, resolve addr, resolve route, create
# qp, connect: 1000 / their ms). Storm: REPEAT runs of SETUP_INFLIGHT connections, each
# step for all at once (the whole life, disconnect and destroy included: SETUP_INFLIGHT *
# 1000 / the sum of the steps' ms). Also one "cmtime" record: each step's median.
setup_cmtime() {
  local port=$1 t0=$SECONDS r n test line sum v tr="rdma (rdma_cm, no data)"
  local -A steps=()
  PRE=$RAW/setup.cmtime
  timeout -s INT -k 5 $((4 * T)) cmtime -p "$port" >"$PRE.server.log" 2>&1 &
  local spid=$!
  if ! wait_ready "$port" "$spid"; then
    echo "(the server did not listen on $port within 30 s)" >>"$PRE.server.log"
  fi
  for test in sequential storm; do
    n=1
    [[ $test == storm ]] && n=$SETUP_INFLIGHT
    local vals=() status=ok err=""
    snap
    for ((r = 1; r <= REPEAT; r++)); do
      PRE=$RAW/setup.cmtime.$test.$r
      cp "$RAW/setup.cmtime.server.log" "$PRE.server.log"
      timeout -s INT -k 5 "$T" cmtime -s "$IP" -p "$port" -c "$n" >"$PRE.out" 2>"$PRE.err"
      CRC=$? SRC=0
      line=$(cmtime_steps "$PRE.out")
      if [[ $CRC != 0 || $line != *connect=* ]]; then
        status=FAIL err="run $r: $(why "$T")"
        break
      fi
      steps[$test]+="$line "
      if [[ $test == sequential ]]; then
        sum=$(tr ' ' '\n' <<<"$line" | awk -F= '$1 !~ /^(disconnect|destroy)$/ { s += $2 }
          END { print s }')
      else
        sum=$(tr ' ' '\n' <<<"$line" | awk -F= '{ s += $2 } END { print s }')
      fi
      v=$(awk -v n="$n" -v s="$sum" 'BEGIN { if (s > 0) printf "%.1f", n * 1000 / s }')
      [[ -n $v ]] && vals+=("$v")
    done
    paths
    [[ $status == FAIL ]] && vals=()
    SETUP_TOTAL=$((n * REPEAT)) SETUP_INFLIGHT=$n \
      setup_rec "$test" rdma_cm "$status" "$err" conn/s "$tr" "${vals[@]}"
  done
  stop "$spid" 0
  # Each step's median over the runs: ms for one connection alone, us per connection for
  # SETUP_INFLIGHT at once.
  local json="{}" step
  for test in sequential storm; do
    for step in create_id resolve_addr resolve_route create_qp connect disconnect destroy; do
      v=$(tr ' ' '\n' <<<"${steps[$test]:-}" | awk -F= -v k="$step" '$1 == k { print $2 }' |
        median)
      [[ -z $v ]] && continue
      [[ $test == storm ]] &&
        v=$(awk -v v="$v" -v n="$SETUP_INFLIGHT" 'BEGIN { printf "%.0f", v * 1000 / n }')
      json=$(jq -c --arg t "$test" --arg s "$step" --arg v "$v" '.[$t][$s] = ($v | tonumber)' \
        <<<"$json")
    done
  done
  rec --argjson steps "$json" --argjson n "$SETUP_INFLIGHT" \
    '{kind: "cmtime", inflight: $n, sequential_ms: ($steps.sequential // {}),
      storm_us_per_conn: ($steps.storm // {})}'
  say "setup cmtime: $((SECONDS - t0)) s"
}

setup_all() {
  say "setup: storm $SETUP_ROUNDS x $SETUP_CONNS connections, $SETUP_INFLIGHT in flight;" \
    "sequential $REPEAT x $SETUP_SEQ connects"
  if [[ ! -x $STORM ]]; then
    local c
    for c in tcp rsocket slipstream rdma_cm; do
      PATH_NOTE="" setup_rec storm "$c" FAIL "$STORM not built (the host side builds it)" conn/s ""
    done
    return
  fi
  setup_storm tcp plain 7301 "$ST"
  setup_storm tcp plain 7304 "$ST" serial 1
  setup_seq tcp plain 7311 "$REPEAT"
  setup_storm slipstream slip 7302 "$ST"
  setup_storm slipstream slip 7305 "$ST" serial 1
  setup_seq slipstream slip 7321 "$REPEAT"
  if [[ $SETUP_RSOCKET == 1 ]]; then
    # One run each, on a short leash: rsocket's preload does not implement epoll.
    setup_storm rsocket rsocket 7303 "$CT"
    setup_seq rsocket rsocket 7331 1
  fi
  setup_cmtime 7341
}

guest_main() {
  local parts=$1 build=$2
  REPEAT=${SLIP_BENCH_RDMA_REPEAT:-3}
  DURATION=${SLIP_BENCH_RDMA_DURATION:-0.5}
  T=${SLIP_BENCH_RDMA_T:-90}
  CT=${SLIP_BENCH_RDMA_COMPAT_T:-30}
  SETUP_CONNS=${SLIP_BENCH_RDMA_SETUP_CONNS:-100}
  SETUP_ROUNDS=${SLIP_BENCH_RDMA_SETUP_ROUNDS:-3}
  SETUP_INFLIGHT=${SLIP_BENCH_RDMA_SETUP_INFLIGHT:-20}
  SETUP_SEQ=${SLIP_BENCH_RDMA_SETUP_SEQ:-50}
  SETUP_RSOCKET=${SLIP_BENCH_RDMA_SETUP_RSOCKET:-1}
  ST=${SLIP_BENCH_RDMA_SETUP_T:-120}
  # The shim warns about every SLIP_* variable it does not know (the lab's included).
  local own=("${!SLIP_BENCH_RDMA_@}" "${!SLIP_VM_@}")
  [[ ${#own[@]} -gt 0 ]] && unset "${own[@]}"
  # shellcheck source=tests/bench/lib.sh
  source "$ROOT/tests/bench/lib.sh"
  SLIP_PERF=$build/bin/slip-perf
  SLIP_RUN=$build/bin/slip-run
  STORM=$build/bench-rdma/bin/storm
  RS=$(dpkg -L librdmacm1 2>/dev/null | grep '/librspreload\.so$' | head -n 1)
  [[ -n $RS ]] || RS=/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so
  RAW=/tmp/bench-rdma
  PORT_PERFTEST=7150
  mkdir -p "$RAW"
  local start=$SECONDS
  rec --arg kernel "$(uname -r)" --arg rs "$RS" --arg repeat "$REPEAT" \
    --arg duration "$DURATION" --arg cpus "$(nproc)" --arg parts "$parts" \
    --arg setup "storm ${SETUP_ROUNDS}x${SETUP_CONNS} (${SETUP_INFLIGHT} in flight), sequential ${REPEAT}x${SETUP_SEQ}" \
    --arg dev "$DEV $(ibv_devinfo -d "$DEV" | awk '/active_mtu/ { print "active_mtu " $2 }')" \
    '{kind: "settings", kernel: $kernel, vcpus: $cpus, device: $dev, rsocket_preload: $rs,
      repeat: $repeat, duration_s: $duration, parts: $parts, setup: $setup}'
  [[ $parts == all || $parts == bench ]] && bench
  [[ $parts == all || $parts == compat ]] && compat_all
  [[ $parts == all || $parts == setup ]] && setup_all
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
  --setup-only) PARTS=setup; shift ;;
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
if [[ $PARTS == all || $PARTS == setup ]]; then
  # storm.c connects to and listens on 127.0.0.1 (INADDR_LOOPBACK), which rdma_cm cannot
  # reach: the same source, built with the link's address in its place.
  mkdir -p "$OUT/bin" || exit 2
  # shellcheck disable=SC2086  # the address's four numbers
  printf '#define _GNU_SOURCE\n#include <netinet/in.h>\n#undef INADDR_LOOPBACK\n#define INADDR_LOOPBACK ((in_addr_t)0x%02x%02x%02x%02x) /* %s */\n' \
    ${IP//./ } "$IP" >"$OUT/bin/storm-addr.h"
  cc -O2 -Wall -Wextra -include "$OUT/bin/storm-addr.h" -o "$OUT/bin/storm" \
    tests/stress/storm.c || { echo "error: cannot build tests/stress/storm.c" >&2; exit 2; }
fi
: "${SLIP_VM_TIMEOUT:=1500}"
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
    bench: map(select(.kind == "bench")), compat: map(select(.kind == "compat")),
    setup: map(select(.kind == "setup")), cmtime: (map(select(.kind == "cmtime")) | first)}' \
  >"$OUT/results.json" || { echo "bench-rdma: no results" >&2; exit "${vm_rc/#0/1}"; }

jq -r '(["test", "column", "value", "min", "max", "unit", "metric", "runs", "transport",
         "status", "error"] | @csv),
       (.bench[] | [.test, .column, .value, .min, .max, .unit, .metric, .runs, .transport,
         .status, .error] | @csv)' "$OUT/results.json" >"$OUT/bench.csv"
jq -r '(["program", "mode", "status", "transport", "result", "error"] | @csv),
       (.compat[] | [.program, .mode, .status, .transport, .result, .error] | @csv)' \
  "$OUT/results.json" >"$OUT/compat.csv"
jq -r '(["test", "column", "value", "min", "max", "unit", "runs", "conns", "inflight",
         "transport", "status", "error"] | @csv),
       (.setup[] | [.test, .column, .value, .min, .max, .unit, .runs, .conns, .inflight,
         .transport, .status, .error] | @csv)' "$OUT/results.json" >"$OUT/setup.csv"

# The tables (markdown), from results.json: those of the parts that ran.
part() { [[ $PARTS == all || $PARTS == "$1" ]]; }
settings=$(jq -r '.settings | "\(.kernel), \(.vcpus) vCPUs, \(.device)"' "$OUT/results.json")
{
if part bench; then
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
    ["| test | kernel TCP | rsocket | Slipstream | Slipstream fabric | perftest | Slipstream/rsocket | Slipstream/perftest | fabric/Slipstream | fabric/perftest |",
     "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"][],
    (["lat", "latency 64 B, p50 us (lower is better)"], ["bw", "bandwidth 64 KiB, Gbit/s"]) as [$t, $title] |
    fig($t; "tcp") as $k | fig($t; "rsocket") as $r | fig($t; "slipstream") as $s |
    fig($t; "fabric") as $f | fig($t; "perftest") as $p |
    "| \($title) | \(show($k)) | \(show($r)) | \(show($s))\(slipmark($s)) | " +
    "\(show($f))\(slipmark($f)) | \(show($p)) | " +
    "\(ratio(num($s); num($r))) | \(ratio(num($s); num($p))) | " +
    "\(ratio(num($f); num($s))) | \(ratio(num($f); num($p))) |"' "$OUT/results.json"
  echo
  echo "Figures: median of $(jq -r '.settings.repeat' "$OUT/results.json") runs (min-max)," \
    "one guest ($settings)," \
    "TCG: ratios only; host load average before/after: $LOAD0 / $LOAD1)."
  echo "(!): measured, but a side reported an error. Path of each column (rxe0 and TCP" \
    "counters in the guest; Slipstream: slip-run's stats file):"
  jq -r '.bench[] | "- \(.column) \(.test): \(.status), \(.transport); \(.paths)\(if .error != "" then "; " + .error else "" end)"' \
    "$OUT/results.json"
fi
if part compat; then
  [[ $PARTS == all ]] && echo
  echo "| program | plain | rsocket (librspreload.so) | Slipstream (verbs,tcp) |"
  echo "| --- | --- | --- | --- |"
  jq -r '
    def cell($p; $m): (.compat[] | select(.program == $p and .mode == $m)) // null |
      if . == null then "-" elif .status == "ok" then "ok [\(.transport)] \(.result)"
      else "FAIL [\(.transport)]: \(.error | gsub("\\|"; "/"))" end;
    (.compat | map(.program) | unique)[] as $p |
    "| \($p) | \(cell($p; "plain")) | \(cell($p; "rsocket")) | \(cell($p; "slip")) |"' \
    "$OUT/results.json"
fi
if part setup; then
  [[ $PARTS == all ]] && echo
  jq -r '
    def fig($t; $c): (.setup[] | select(.test == $t and .column == $c)) // null;
    def show($r): if $r == null then "-" elif $r.value == "" then "FAIL"
      else $r.value + (if $r.min != $r.max then " (" + $r.min + "-" + $r.max + ")" else "" end) +
        (if $r.status != "ok" then " (FAIL)" else "" end) end;
    def num($r): if $r == null or $r.value == "" then null else ($r.value | tonumber) end;
    def ratio($a; $b): if $a == null or $b == null or $b == 0 then "-"
      else (($a / $b * 1000 | round) / 1000 | tostring) + "x" end;
    def slipmark($r): if $r == null or $r.value == "" then ""
      elif ($r.transport | test("^[0-9]+x verbs$")) then " [verbs]"
      else " [" + $r.transport + "]" end;
    (fig("storm"; "tcp") // fig("storm"; "slipstream") // {conns: 0, inflight: 0}) as $st |
    ["| connections/s (higher is better) | kernel TCP | rsocket | Slipstream | rdma_cm (cmtime) | Slipstream/TCP | Slipstream/rdma_cm |",
     "| --- | --- | --- | --- | --- | --- | --- |"][],
    (["storm", "storm: \($st.conns) short-lived, \($st.inflight) in flight (connect, request, reply, close)"],
     ["serial", "serial: \($st.conns) short-lived, one after another"],
     ["sequential", "sequential: blocking connects, one after another, all held open"]) as [$t, $title] |
    fig($t; "tcp") as $k | fig($t; "rsocket") as $r | fig($t; "slipstream") as $s |
    fig($t; "rdma_cm") as $c |
    "| \($title) | \(show($k)) | \(show($r)) | \(show($s))\(slipmark($s)) | \(show($c)) | " +
    "\(ratio(num($s); num($k))) | \(ratio(num($s); num($c))) |"' "$OUT/results.json"
  echo
  echo "Connection setup: storm, serial and sequential are tests/stress/storm.c on $IP" \
    "(storm and serial: the median of its rounds; sequential: the median of the runs), one guest" \
    "($settings, TCG: ratios only; host load average before/after: $LOAD0 / $LOAD1)." \
    "rdma_cm: cmtime (rdmacm-utils) on the same link, no data: sequential one connection" \
    "alone (create id to established), storm the whole life of each batch. Slipstream's" \
    "connections must all be verbs at both ends (slip-run's stats) and rxe0 must have sent" \
    "packets. Each column's path and any error:"
  jq -r '.setup[] | "- \(.column) \(.test): \(.status), \(.runs) figure(s), \(.transport)\(if (.close_ms_per_conn // "") != "" then "; closing all: \(.close_ms_per_conn) ms per connection" else "" end)\(if .paths != "" then "; " + .paths else "" end)\(if .error != "" then "; " + .error else "" end)"' \
    "$OUT/results.json"
  jq -r '.cmtime // empty |
    def line($o; $u): [$o | to_entries[] | "\(.key | gsub("_"; " ")) \(.value)"] | join(", ") + " " + $u;
    "- rdma_cm steps (cmtime, median): one connection alone: " + line(.sequential_ms; "ms") +
    "; \(.inflight) at once: " + line(.storm_us_per_conn; "us per connection")' \
    "$OUT/results.json"
fi
} >"$OUT/results.md"
echo
cat "$OUT/results.md"
echo
echo "bench-rdma: results in $OUT/ (results.md results.json bench.csv compat.csv setup.csv" \
  "guest.log raw/)"

[[ $vm_rc != 0 ]] && exit "$vm_rc"
bad=$(jq '[.bench[] | select(.status != "ok")] + [.compat[] | select(.mode != "rsocket" and
  .status != "ok")] + [.setup[] | select(.column != "rsocket" and .status != "ok")] | length' \
  "$OUT/results.json")
[[ $bad == 0 ]] || { echo "bench-rdma: $bad measurement(s) or run(s) failed" >&2; exit 1; }
exit 0
