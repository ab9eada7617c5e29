#!/usr/bin/env bash
# Real servers, kernel TCP against Slipstream (what `make bench-servers` runs): redis-server
# under redis-benchmark, the same with 1,000 idle connections held open to it, and nginx
# under wrk (keep-alive) and ab (a connection per request). Each measurement runs twice,
# back to back on this host: tcp (every program plain) and shm (the server and each client
# under `slip-run --stats=FILE --`). Prints a markdown table and writes it to
# BUILD/bench-servers/results.md; raw outputs, server logs and stats files go to
# BUILD/bench-servers/raw/. A few minutes with the defaults.
#
#   tests/bench/servers.sh [BUILD_DIR]        (default: build; uses BUILD_DIR/bin/slip-run)
#
# Environment:
#   SLIP_BENCH_DURATION=3        seconds per measurement: wrk runs for that long, and the
#                                redis-benchmark request counts are sized for it (it has no
#                                duration option: the count is the same in both columns)
#   SLIP_BENCH_PLAIN_ONLY=1      kernel TCP only (no slip-run needed)
#   SLIP_BENCH_PORT=16301        first port to try
#   SLIP_BENCH_IDLE=1000         idle connections held open in the idle measurements
#   SLIP_BENCH_OUT=DIR           write results.md and raw/ there (default BUILD_DIR/bench-servers)
#
# Needs redis-server, redis-benchmark, nginx, wrk, ab, jq and /usr/bin/python3; installs
# the missing ones with apt-get (redis-server redis-tools nginx wrk apache2-utils jq
# python3). Raises the open-file limit to 65536 (or the hard limit, if lower).
#
# The last column counts connection ends in the stats file (each process records its own
# ends, so one connection between two slip-run processes counts twice) and how many used
# shm; the connections that did not are listed with their reason below the table.
#
# Exit status: 0 when every measurement ran, 1 when one failed (or timed out) or when
# fewer than most connection ends of a shm measurement used shm, 2 on a setup error.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/bench/lib.sh
source "$ROOT/tests/bench/lib.sh"

BUILD=${1:-build}
DURATION=${SLIP_BENCH_DURATION:-3}
PLAIN_ONLY=${SLIP_BENCH_PLAIN_ONLY:-0}
NEXT_PORT=${SLIP_BENCH_PORT:-16301}
IDLE_CONNS=${SLIP_BENCH_IDLE:-1000}
OUT=${SLIP_BENCH_OUT:-$BUILD/bench-servers}
RAW=$OUT/raw
RESULTS=$OUT/results.md
PYTHON=/usr/bin/python3

# redis-benchmark request rates assumed for sizing -n (requests/s over kernel TCP on a
# 2-CPU VM): N = rate x SLIP_BENCH_DURATION, so a run takes about that long.
REDIS_RATE=35000
REDIS_RATE_PIPELINED=400000
REDIS_CLIENTS=(1 50 200 1000)
WRK_CLIENTS=(50 500)

slip_setup "$BUILD" "$PLAIN_ONLY" || exit 2
for v in DURATION IDLE_CONNS; do
  if ! [[ ${!v} =~ ^[1-9][0-9]*$ ]]; then
    echo "error: SLIP_BENCH_$v must be a positive whole number" >&2
    exit 2
  fi
done
AB_REQUESTS=$((DURATION * 5000 / 3))
((AB_REQUESTS < 1000)) && AB_REQUESTS=1000
# Each side may run for the measurement several times over (shm may be slower, and
# redis-benchmark runs a fixed count), plus start-up under the shim. Nothing waits longer.
PAIR_TIMEOUT=$((DURATION * 8 + 30))
mkdir -p "$RAW" || exit 2
TMP=$(mktemp -d "${TMPDIR:-/tmp}/slip-bench-servers.XXXXXX") || exit 2

MODES=(tcp shm)
[[ $PLAIN_ONLY == 1 ]] && MODES=(tcp)

declare -A VAL=()      # VAL[name.mode] = requests/s
declare -A ENDS=()     # ENDS[name] = "n shm of m" for the shm run
declare -A TRANSPORT=() # TRANSPORT[name] = slip_stats_summary of the shm run, when not all shm
FAILURES=()
NOTES=()
START=$SECONDS

# Every background process of this script is a timeout(1), which leads its own process
# group (the server and, for nginx, its workers): on exit, each group still there is sent
# SIGINT, then SIGKILL.
cleanup() {
  local pids pid
  pids=$(jobs -p)
  if [[ -n $pids ]]; then
    for pid in $pids; do kill -INT -- "-$pid" 2>/dev/null || kill -INT "$pid" 2>/dev/null; done
    sleep 1
    for pid in $pids; do kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null; done
  fi
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- setup ---------------------------------------------------------------------------------

# Installs the servers and load generators that are missing; any still missing is a setup
# error.
ensure_tools() {
  declare -A pkg=([redis-server]=redis-server [redis-benchmark]=redis-tools [nginx]=nginx
    [wrk]=wrk [ab]=apache2-utils [jq]=jq [$PYTHON]=python3)
  local missing=() packages=() t
  for t in "${!pkg[@]}"; do
    command -v "$t" >/dev/null || { missing+=("$t") && packages+=("${pkg[$t]}"); }
  done
  [[ ${#missing[@]} -eq 0 ]] && return 0
  slip_apt_install "$RAW/apt.log" "${packages[@]}"
  local still=()
  for t in "${missing[@]}"; do command -v "$t" >/dev/null || still+=("$t"); done
  if [[ ${#still[@]} -gt 0 ]]; then
    echo "error: not available: ${still[*]} (install: ${packages[*]})" >&2
    return 1
  fi
}

# 1,000 connections in one process, and as many in the server: 65536 descriptors, or as
# many as the hard limit allows.
raise_fd_limit() {
  ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null
  local n
  n=$(ulimit -n)
  if [[ $n != unlimited ]] && ((n < IDLE_CONNS + 1200)); then
    echo "error: open-file limit $n is too low for $IDLE_CONNS idle + 1000 connections" >&2
    return 1
  fi
}

# The static file nginx serves (612 bytes, the size of nginx's own welcome page) and the
# idle-connection helper.
write_files() {
  mkdir -p "$TMP/html" || return 1
  local head='<!DOCTYPE html><html><head><title>Slipstream</title></head><body><p>'
  local tail=$'</p></body></html>\n' fill
  fill=$(printf '%*s' $((612 - ${#head} - ${#tail})) '' | tr ' ' 's')
  printf '%s%s%s' "$head" "$fill" "$tail" >"$TMP/html/index.html" || return 1

  # idle.py HOST PORT N: opens N connections to a redis server, sends PING on each and
  # reads +PONG (so each is established, and accelerated under slip-run), prints
  # "ready N", then holds them until SIGTERM or SIGINT, on which it exits normally (so
  # that slip-run writes its stats).
  cat >"$TMP/idle.py" <<'EOF' || return 1
import signal, socket, sys

host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda *_: sys.exit(0))
conns = [socket.create_connection((host, port), timeout=10) for _ in range(n)]
for c in conns:
    c.sendall(b"PING\r\n")
for c in conns:
    reply = b""
    while not reply.endswith(b"\r\n"):
        data = c.recv(64)
        if not data:
            sys.exit("connection closed before +PONG")
        reply += data
    if reply != b"+PONG\r\n":
        sys.exit("unexpected reply %r" % reply)
print("ready", n, flush=True)
while True:
    signal.pause()
EOF
}

# --- running -------------------------------------------------------------------------------

# next_port: sets PORT to a free port.
next_port() {
  PORT=$(slip_free_port "$NEXT_PORT")
  NEXT_PORT=$((PORT + 1))
}

# failure_reason PREFIX: the client's last error line, else its last line on stderr.
failure_reason() {
  local why
  why=$(cat "$1.err" "$1.out" 2>/dev/null | tr '\r' '\n' | grep -i 'error' | tail -n 1)
  [[ -z $why ]] && why=$(tail -n 1 "$1.err" 2>/dev/null)
  echo "${why:-no message}"
}

# failed NAME MODE STATUS PREFIX: records and prints a failed measurement.
failed() {
  local why
  why=$(failure_reason "$4")
  [[ $3 == 124 ]] && why="timed out after ${PAIR_TIMEOUT}s"
  echo "FAILED (status $3): $why"
  FAILURES+=("$1 over $2: status $3: $why (files: $4.*)")
}

# count_ends NAME MODE PREFIX: for a shm run, how many connection ends of its stats file
# used shm; fewer than most is a failure.
count_ends() {
  [[ $2 == shm ]] || return 0
  local file=$3.stats.jsonl all shm
  all=$(grep -o '"transport" *: *"[^"]*"' "$file" 2>/dev/null | wc -l)
  shm=$(grep -o '"transport" *: *"shm"' "$file" 2>/dev/null | wc -l)
  ENDS[$1]="$shm shm of $all"
  slip_stats_all_shm "$file" || TRANSPORT[$1]=$(slip_stats_summary "$file")
  if ((shm * 2 <= all)); then
    FAILURES+=("$1 over shm: only $shm of $all connection ends used shm (see $file)")
  fi
}

# pair NAME MODE SERVER... :: CLIENT...: slip_pair on $PORT, the server stopped with SIGINT
# after the client. Sets PREFIX; returns the client's status.
pair() {
  local name=$1 mode=$2
  shift 2
  PREFIX=$RAW/$name.$mode
  printf '  %-5s %-36s ' "$mode" "$name"
  local rc=0
  slip_pair "$mode" "$PREFIX" "$PORT" int "$@" || rc=$?
  if [[ $rc != 0 ]]; then
    failed "$name" "$mode" "$rc" "$PREFIX"
    return 1
  fi
  echo "ok"
  count_ends "$name" "$mode" "$PREFIX"
}

# wrap MODE PREFIX: sets WRAP to the command prefix of a process in MODE.
wrap() {
  WRAP=()
  [[ $1 == shm ]] && WRAP=("$SLIP_RUN" --stats="$2".stats.jsonl --)
}

# redis_cmd: sets REDIS_CMD to the server's command line for $PORT.
redis_cmd() {
  REDIS_CMD=(redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no
    --protected-mode no --daemonize no --maxclients $((IDLE_CONNS + 2000)))
}

# redis_requests PIPELINE: the -n of one redis-benchmark run.
redis_requests() {
  if [[ $1 == 1 ]]; then echo $((REDIS_RATE * DURATION)); else echo $((REDIS_RATE_PIPELINED * DURATION)); fi
}

redis_rate() {
  tr '\r' '\n' <"$1.out" 2>/dev/null | sed -n 's/^ *GET: \([0-9.]*\) requests per second.*/\1/p' |
    tail -n 1
}

# measure_redis MODE CLIENTS PIPELINE
measure_redis() {
  local mode=$1 c=$2 p=$3 name
  name=redis-c$c-p$p
  next_port
  redis_cmd
  if pair "$name" "$mode" "${REDIS_CMD[@]}" :: \
    redis-benchmark -h 127.0.0.1 -p "$PORT" -t get -d 64 -n "$(redis_requests "$p")" \
    -c "$c" -P "$p" -q; then
    slip_value "$name" "$mode" "$(redis_rate "$PREFIX")"
  fi
}

# measure_redis_idle MODE PIPELINE: redis-benchmark -c 50 while $PYTHON idle.py holds
# IDLE_CONNS connections open to the same server, all three in MODE. slip_pair runs two
# processes only, so this one starts its three itself (the same way, under timeout).
measure_redis_idle() {
  local mode=$1 p=$2 name prefix
  name=redis-idle-c50-p$p
  prefix=$RAW/$name.$mode
  next_port
  printf '  %-5s %-36s ' "$mode" "$name"
  rm -f "$prefix".out "$prefix".err "$prefix".server.log "$prefix".idle.log "$prefix".stats.jsonl
  wrap "$mode" "$prefix"
  redis_cmd
  timeout -s INT -k 5 "$PAIR_TIMEOUT" "${WRAP[@]}" "${REDIS_CMD[@]}" >"$prefix".server.log 2>&1 &
  local server_pid=$!
  if ! slip_wait_listen "$PORT" "$server_pid"; then
    echo "server did not listen on port $PORT (see $prefix.server.log)" >"$prefix".err
    slip_stop "$server_pid" 0
    failed "$name" "$mode" 1 "$prefix"
    return 1
  fi
  timeout -s INT -k 5 "$PAIR_TIMEOUT" "${WRAP[@]}" "$PYTHON" "$TMP/idle.py" 127.0.0.1 "$PORT" \
    "$IDLE_CONNS" >"$prefix".idle.log 2>&1 &
  local idle=$! i ready=0
  for ((i = 0; i < 600; i++)); do
    grep -q '^ready' "$prefix".idle.log 2>/dev/null && { ready=1 && break; }
    kill -0 "$idle" 2>/dev/null || break
    sleep 0.05
  done
  local rc=0
  if [[ $ready != 1 ]]; then
    echo "idle helper not ready: $(tail -n 1 "$prefix".idle.log 2>/dev/null)" >"$prefix".err
    rc=1
  else
    timeout -s INT -k 5 "$PAIR_TIMEOUT" "${WRAP[@]}" redis-benchmark -h 127.0.0.1 -p "$PORT" \
      -t get -d 64 -n "$(redis_requests "$p")" -c 50 -P "$p" -q >"$prefix".out \
      2>"$prefix".err || rc=$?
  fi
  slip_stop "$idle" 0
  slip_stop "$server_pid" 0
  if [[ $rc != 0 ]]; then
    failed "$name" "$mode" "$rc" "$prefix"
    return 1
  fi
  echo "ok"
  count_ends "$name" "$mode" "$prefix"
  PREFIX=$prefix
  slip_value "$name" "$mode" "$(redis_rate "$prefix")"
}

# nginx_conf WORKERS ERROR_LOG: writes a config for $PORT, prints its path.
nginx_conf() {
  local dir=$TMP/nginx-$PORT
  mkdir -p "$dir"
  {
    [[ $(id -u) == 0 ]] && echo "user root;"
    cat <<EOF
daemon off;
master_process on;
worker_processes $1;
pid $dir/nginx.pid;
error_log $2 warn;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 100000;
  client_body_temp_path $dir/body;
  proxy_temp_path $dir/proxy;
  fastcgi_temp_path $dir/fastcgi;
  uwsgi_temp_path $dir/uwsgi;
  scgi_temp_path $dir/scgi;
  server {
    listen 127.0.0.1:$PORT;
    root $TMP/html;
  }
}
EOF
  } >"$dir/nginx.conf"
  echo "$dir/nginx.conf"
}

# nginx_pair NAME MODE WORKERS CLIENT...: nginx on $PORT ("{url}" in CLIENT is replaced).
nginx_pair() {
  local name=$1 mode=$2 workers=$3 conf
  shift 3
  next_port
  conf=$(nginx_conf "$workers" "$RAW/$name.$mode.nginx-error.log")
  pair "$name" "$mode" nginx -p "$TMP" -c "$conf" -e "$RAW/$name.$mode.nginx-error.log" :: \
    "${@//\{url\}/http://127.0.0.1:$PORT/index.html}"
}

# measure_wrk MODE WORKERS CLIENTS
measure_wrk() {
  local mode=$1 w=$2 c=$3 name errors
  name=nginx-w$w-wrk-c$c
  if nginx_pair "$name" "$mode" "$w" wrk -t2 -c "$c" -d "${DURATION}s" '{url}'; then
    slip_value "$name" "$mode" "$(awk '/^Requests\/sec:/ { print $2 }' "$PREFIX.out")"
    errors=$(grep -E 'Socket errors|Non-2xx' "$PREFIX.out" | sed 's/^ *//' | paste -sd ';')
    [[ -n $errors ]] && NOTES+=("$name over $mode: wrk reported: $errors")
  fi
}

# measure_ab MODE: ab without keep-alive, one request at a time: a connection per request.
measure_ab() {
  local mode=$1 name=nginx-w1-ab-c1 failed
  if nginx_pair "$name" "$mode" 1 ab -n "$AB_REQUESTS" -c 1 '{url}'; then
    slip_value "$name" "$mode" "$(awk '/^Requests per second:/ { print $4 }' "$PREFIX.out")"
    failed=$(awk '/^Failed requests:/ { print $3 }' "$PREFIX.out")
    [[ -n $failed && $failed != 0 ]] && NOTES+=("$name over $mode: ab: $failed failed requests")
  fi
}

# --- report --------------------------------------------------------------------------------

# ratio A B: A / B to three significant digits, or nothing.
ratio() {
  [[ -n $1 && -n $2 ]] && awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.3g", a / b }'
}

# row TITLE NAME
row() {
  local tcp=${VAL[$2.tcp]:-} shm=${VAL[$2.shm]:-} r shm_text ends
  r=$(ratio "$shm" "$tcp")
  shm_text=${shm:-n/a} ends=${ENDS[$2]:-n/a}
  [[ $PLAIN_ONLY == 1 ]] && shm_text="not run" ends="-"
  printf '| %s | %s | %s | %s | %s |\n' "$1" "${tcp:-n/a}" "$shm_text" "${r:+${r}x}" "$ends"
}

# idle_line PIPELINE: the rate with idle connections over the rate without, per column.
idle_line() {
  local p=$1 mode r line="- redis GET -c 50"
  [[ $p != 1 ]] && line+=" -P $p"
  line+=" with $IDLE_CONNS idle connections / without:"
  for mode in "${MODES[@]}"; do
    r=$(ratio "${VAL[redis-idle-c50-p$p.$mode]:-}" "${VAL[redis-c50-p$p.$mode]:-}")
    line+=" $mode ${r:-n/a}${r:+x},"
  done
  echo "${line%,}"
}

report() {
  local cpu
  cpu=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo 2>/dev/null)
  echo "# Slipstream benchmark: real servers, kernel TCP vs Slipstream shm"
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'); host: $(uname -srm); CPU: ${cpu:-?}" \
    "($(nproc) CPUs usable); load average at start: $LOAD"
  echo "- $(redis-server --version | awk '{ print $1, $2, $3 }'); $(nginx -v 2>&1 |
    sed 's/^nginx version: //'); wrk; ab; open-file limit $(ulimit -n); took" \
    "$((SECONDS - START)) s"
  echo "- loopback 127.0.0.1; tcp: every program plain; shm: the server and every client" \
    "under \`slip-run\`. Figures are requests/s (higher is better); shm/tcp > 1: shm faster."
  echo "- redis: \`redis-benchmark -t get -d 64 -n N -c C [-P 16] -q\`, N =" \
    "$((REDIS_RATE * DURATION)) ($((REDIS_RATE_PIPELINED * DURATION)) with -P 16), the same" \
    "in both columns. nginx: a 612-byte index.html, \`wrk -t2 -c C -d ${DURATION}s\`" \
    "(keep-alive), and \`ab -n $AB_REQUESTS -c 1\` (no keep-alive: a connection per request)."
  echo "- last column: connection ends in the shm run's stats file (each process records its" \
    "own), and how many used shm."
  echo
  echo "| measurement | tcp | shm | shm/tcp | shm connections |"
  echo "| --- | ---: | ---: | ---: | --- |"
  local c p label
  for c in "${REDIS_CLIENTS[@]}"; do
    for p in 1 16; do
      label="redis GET 64 B, -c $c"
      [[ $p != 1 ]] && label+=" -P $p"
      row "$label" "redis-c$c-p$p"
    done
  done
  for p in 1 16; do
    label="redis GET 64 B, -c 50"
    [[ $p != 1 ]] && label+=" -P $p"
    row "$label, $IDLE_CONNS idle connections open" "redis-idle-c50-p$p"
  done
  local w workers
  for w in 1 2; do
    workers="$w worker"
    [[ $w != 1 ]] && workers+=s
    for c in "${WRK_CLIENTS[@]}"; do
      row "nginx $workers, wrk -t2 -c $c, keep-alive" "nginx-w$w-wrk-c$c"
    done
  done
  row "nginx 1 worker, ab -c 1, no keep-alive (connection per request)" nginx-w1-ab-c1
  echo
  echo "Idle connections (rate with them / rate without, each column against itself):"
  echo
  idle_line 1
  idle_line 16
  local ends=() name
  for name in $(printf '%s\n' "${!TRANSPORT[@]}" | sort); do ends+=("$name: ${TRANSPORT[$name]}"); done
  section "Connection ends of shm runs that did not all use shm (transport (reason)):" \
    "${ends[@]}"
  section "Client-side errors:" "${NOTES[@]}"
  section "Failures:" "${FAILURES[@]}"
}

# section TITLE ITEM...: a titled markdown list, nothing when there is no item.
section() {
  [[ $# -gt 1 ]] || return 0
  printf '\n%s\n\n' "$1"
  shift
  printf -- '- %s\n' "$@"
}

# --- main ----------------------------------------------------------------------------------

ensure_tools || exit 2
raise_fd_limit || exit 2
write_files || { echo "error: cannot write to $TMP" >&2 && exit 2; }
LOAD=$(cut -d' ' -f1-3 /proc/loadavg)
echo "Slipstream server benchmark: ${MODES[*]}, ${DURATION} s per measurement, raw output in $RAW"
# Each measurement over tcp then shm back to back, so that both columns see the same host.
for c in "${REDIS_CLIENTS[@]}"; do
  for p in 1 16; do
    for mode in "${MODES[@]}"; do measure_redis "$mode" "$c" "$p"; done
  done
done
for p in 1 16; do
  for mode in "${MODES[@]}"; do measure_redis_idle "$mode" "$p"; done
done
for w in 1 2; do
  for c in "${WRK_CLIENTS[@]}"; do
    for mode in "${MODES[@]}"; do measure_wrk "$mode" "$w" "$c"; done
  done
done
for mode in "${MODES[@]}"; do measure_ab "$mode"; done
echo
report | tee "$RESULTS"
echo
echo "written to $RESULTS"
[[ ${#FAILURES[@]} -eq 0 ]]
