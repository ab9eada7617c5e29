#!/usr/bin/env bash
# Short connections, kernel TCP against Slipstream (what `make bench-short` runs), each
# measurement in a fresh network namespace of its own (its own TIME_WAIT table, loopback
# only), so that every run starts from the same empty state:
#   churn    tests/integration/progs/churn.py: one connection after another for
#            SLIP_BENCH_DURATION seconds (default 60), 1-64 B each way, every byte
#            checked, the CLIENT closing first (TIME_WAIT stays on the client's ports, the
#            case that collapsed when Slipstream bound a port before each SYN): the rate
#            of every 10 s
#   pgbench  PostgreSQL under `pgbench -C -S` (a new connection per select-only
#            transaction, one client) for SLIP_BENCH_PG_DURATION seconds (default 20)
#   crr      slip-perf tcp_crr 64 B for 5 s (the server closes first)
#   nginx    nginx with 2 workers accepting on one shared listener (its default
#            configuration), `ab -n 4000 -c 16` for a 512-byte file without keep-alive (a
#            connection per request): requests/s, and the 99th percentile and slowest
#            request in ms
# tcp: every program plain; accelerated: the server and the client each under slip-run,
# every connection accelerated however short (SLIP_SHORT_CONNS=accelerate: what setting
# one up costs); default policy: the same under slip-run's default (SLIP_SHORT_CONNS=
# adaptive: a client keeps plain what keeps closing before its setup paid off).
# Prints a markdown table and writes it to BUILD/bench-short/results.md, with the raw
# outputs in BUILD/bench-short/raw/. About 6 minutes with the defaults.
#
#   tests/bench/short_conns.sh [BUILD_DIR]     (default: build)
#
# Needs root (ip netns), PostgreSQL 15 (postgresql: installed when missing) and
# /usr/bin/python3; nginx and ab (apache2-utils) for the last row, skipped without them. Exit status: 0 when every measurement ran and every shm one had its
# connections on shm, 1 otherwise, 2 on a setup error.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/bench/lib.sh
source "$ROOT/tests/bench/lib.sh"

BUILD=${1:-build}
DURATION=${SLIP_BENCH_DURATION:-60}
PG_DURATION=${SLIP_BENCH_PG_DURATION:-20}
OUT=$(realpath -m "${SLIP_BENCH_OUT:-$BUILD/bench-short}")
RAW=$OUT/raw
PYTHON=/usr/bin/python3
CHURN=$ROOT/tests/integration/progs/churn.py
PORT=16401
PG_PORT=16402

slip_setup "$BUILD" 0 || exit 2
SLIP_RUN=$(realpath "$SLIP_RUN")
SLIP_PERF=$(realpath "$SLIP_PERF")
if [[ $(id -u) != 0 ]]; then
  echo "error: needs root (network namespaces)" >&2
  exit 2
fi
PG_BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | tail -n 1)
if [[ -z $PG_BIN ]]; then
  slip_apt_install "$OUT/apt.log" postgresql
  PG_BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | tail -n 1)
fi
if [[ -z $PG_BIN || ! -x $PG_BIN/pgbench ]]; then
  echo "error: PostgreSQL (postgresql, pgbench) is needed" >&2
  exit 2
fi
rm -rf "$OUT"
mkdir -p "$RAW"
chmod 755 "$OUT"
chmod 1777 "$RAW"  # (the postgres user writes its stats there)
status=0

NS=""
new_ns() {
  NS=slipbench-$$-$1
  ip netns add "$NS" && ip -n "$NS" link set lo up
}
del_ns() {
  [[ -n $NS ]] && ip netns pids "$NS" 2>/dev/null | xargs -r kill -9 2>/dev/null
  [[ -n $NS ]] && ip netns del "$NS"
  NS=""
}
trap del_ns EXIT
in_ns() { ip netns exec "$NS" "$@"; }
# run_as MODE CMD...: plain, or under slip-run with its stats to $RAW/<tag>.stats.
under() {
  local mode=$1 tag=$2
  shift 2
  if [[ $mode == shm ]]; then
    SLIP_SHORT_CONNS=accelerate "$SLIP_RUN" --stats="$RAW/$tag.stats" -- "$@"
  elif [[ $mode == adaptive ]]; then
    SLIP_SHORT_CONNS=adaptive "$SLIP_RUN" --stats="$RAW/$tag.stats" -- "$@"
  else
    "$@"
  fi
}
# Every connection end in a stats file on shm? (Prints "shm/all".)
shm_ends() {
  cat "$@" 2>/dev/null | "$PYTHON" -c '
import json, sys
ends = [c for line in sys.stdin if line.strip() for c in json.loads(line)["connections"]]
shm = sum(c["transport"] == "shm" for c in ends)
print(f"{shm}/{len(ends)}")'
}

declare -A RESULT
churn() {
  local mode=$1
  new_ns "churn-$mode" || return 1
  in_ns bash -c "$(declare -f under); SLIP_RUN=$SLIP_RUN RAW=$RAW; under $mode churn-server-$mode \
    $PYTHON $CHURN server --port $PORT --max-payload 64" >"$RAW/churn-server-$mode.out" 2>&1 &
  local server=$!
  sleep 1
  in_ns bash -c "$(declare -f under); SLIP_RUN=$SLIP_RUN RAW=$RAW; under $mode churn-client-$mode \
    $PYTHON $CHURN client --port $PORT --max-payload 64 --duration $DURATION --window 10" \
    >"$RAW/churn-client-$mode.out" 2>&1 || status=1
  in_ns pkill -TERM -f "$CHURN server" 2>/dev/null
  wait "$server"
  RESULT[churn-$mode]=$(tail -n 1 "$RAW/churn-client-$mode.out")
  del_ns
}

pgbench_run() {
  local mode=$1 data=$OUT/pgdata-$1
  new_ns "pg-$mode" || return 1
  mkdir -p "$data" && chown postgres "$data"
  runuser -u postgres -- "$PG_BIN/initdb" -D "$data" >"$RAW/pg-initdb-$mode.out" 2>&1 || return 1
  in_ns runuser -u postgres -- bash -c "$(declare -f under); SLIP_RUN=$SLIP_RUN RAW=$RAW; \
    under $mode pg-server-$mode $PG_BIN/postgres -D $data -p $PG_PORT -k $data \
    -c listen_addresses=127.0.0.1 -c max_connections=20" >"$RAW/pg-server-$mode.out" 2>&1 &
  for _ in $(seq 50); do
    in_ns "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" && break
    sleep 0.2
  done
  in_ns runuser -u postgres -- "$PG_BIN/pgbench" -i -q -s 1 -h 127.0.0.1 -p "$PG_PORT" postgres \
    >"$RAW/pg-init-$mode.out" 2>&1 || status=1
  in_ns runuser -u postgres -- bash -c "$(declare -f under); SLIP_RUN=$SLIP_RUN RAW=$RAW; \
    under $mode pg-client-$mode $PG_BIN/pgbench -C -S -c 1 -T $PG_DURATION -h 127.0.0.1 \
    -p $PG_PORT postgres" >"$RAW/pg-client-$mode.out" 2>&1 || status=1
  RESULT[pg-$mode]=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$RAW/pg-client-$mode.out" | head -n 1)
  in_ns runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$data" -m fast stop >/dev/null 2>&1
  sleep 1
  del_ns
  rm -rf "$data"
}

crr() {
  local mode=$1
  new_ns "crr-$mode" || return 1
  in_ns bash -c "$(declare -f under); SLIP_RUN=$SLIP_RUN RAW=$RAW; under $mode crr-server-$mode \
    $SLIP_PERF server -p $PORT --once" >"$RAW/crr-server-$mode.out" 2>&1 &
  sleep 1
  in_ns bash -c "$(declare -f under); SLIP_RUN=$SLIP_RUN RAW=$RAW; under $mode crr-client-$mode \
    $SLIP_PERF client 127.0.0.1 -p $PORT tcp_crr --duration 5" >"$RAW/crr-client-$mode.out" 2>&1 \
    || status=1
  wait
  RESULT[crr-$mode]=$(awk '$2 == "tcp_crr" {print $(NF-2)}' "$RAW/crr-client-$mode.out")
  del_ns
}

nginx_ab() {
  local mode=$1 dir=$OUT/nginx-$1
  new_ns "nginx-$mode" || return 1
  mkdir -p "$dir/root" && head -c 512 /dev/urandom >"$dir/root/f"
  cat >"$dir/nginx.conf" <<CONF
$([[ $(id -u) == 0 ]] && echo "user root;")
daemon off; master_process on; worker_processes 2; pid $dir/nginx.pid;
error_log $dir/error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path $dir/cb; proxy_temp_path $dir/p; fastcgi_temp_path $dir/fc;
  uwsgi_temp_path $dir/u; scgi_temp_path $dir/s;
  server { listen 127.0.0.1:$PORT; root $dir/root; }
}
CONF
  in_ns bash -c "$(declare -f under); SLIP_RUN=$SLIP_RUN RAW=$RAW; under $mode nginx-server-$mode \
    $NGINX -p $dir -c $dir/nginx.conf -e $dir/error.log" >"$RAW/nginx-server-$mode.out" 2>&1 &
  sleep 1.5
  in_ns bash -c "$(declare -f under); SLIP_RUN=$SLIP_RUN RAW=$RAW; under $mode nginx-ab-$mode \
    ab -q -n 4000 -c 16 http://127.0.0.1:$PORT/f" >"$RAW/nginx-ab-$mode.out" 2>&1 || status=1
  in_ns kill -TERM "$(cat "$dir/nginx.pid" 2>/dev/null)" 2>/dev/null
  sleep 1
  local rps p99 max
  rps=$(awk '/^Requests per second/ {printf "%.0f", $4}' "$RAW/nginx-ab-$mode.out")
  p99=$(awk '$1 == "99%" {print $2}' "$RAW/nginx-ab-$mode.out")
  max=$(awk '$1 == "100%" {print $2}' "$RAW/nginx-ab-$mode.out")
  RESULT[nginx-$mode]="$rps req/s, p99 $p99 ms, slowest $max ms"
  RESULT[nginx-rps-$mode]=$rps
  del_ns
  rm -rf "$dir"
}

NGINX=$(command -v nginx || echo /usr/sbin/nginx)
for mode in tcp shm adaptive; do
  churn "$mode" || status=1
  pgbench_run "$mode" || status=1
  crr "$mode" || status=1
  if [[ -x $NGINX ]] && command -v ab >/dev/null; then
    nginx_ab "$mode" || status=1
  fi
done

chmod -R a+r "$RAW"
rates() { "$PYTHON" -c 'import json,sys; r=json.loads(sys.argv[1]); print(" ".join(map(str, r["rates"])), "(%d in all)" % r["connections"])' "$1" 2>/dev/null; }
ratio() { "$PYTHON" -c 'import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); print(f"{b/a:.2f}x")' "$1" "$2" 2>/dev/null || echo "-"; }
churn_tcp=$(rates "${RESULT[churn-tcp]:-}")
churn_shm=$(rates "${RESULT[churn-shm]:-}")
churn_adaptive=$(rates "${RESULT[churn-adaptive]:-}")
last() { echo "$1" | awk -F'(' '{n=split($1, r, " "); print r[n]}'; }
{
  echo "| test | kernel TCP | accelerated | accelerated / TCP | shm ends | default policy | default / TCP |"
  echo "| --- | ---: | ---: | ---: | --- | ---: | ---: |"
  echo "| churn, client closes first: conn/s in each 10 s | ${churn_tcp} | ${churn_shm} |" \
    "$(ratio "$(last "$churn_tcp")" "$(last "$churn_shm")") (last 10 s) |" \
    "$(shm_ends "$RAW"/churn-*-shm.stats) | ${churn_adaptive} |" \
    "$(ratio "$(last "$churn_tcp")" "$(last "$churn_adaptive")") (last 10 s) |"
  echo "| pgbench -C -S, 1 client (tps) | ${RESULT[pg-tcp]:-} | ${RESULT[pg-shm]:-} |" \
    "$(ratio "${RESULT[pg-tcp]:-0}" "${RESULT[pg-shm]:-0}") | $(shm_ends "$RAW"/pg-*-shm.stats*) |" \
    "${RESULT[pg-adaptive]:-} | $(ratio "${RESULT[pg-tcp]:-0}" "${RESULT[pg-adaptive]:-0}") |"
  echo "| slip-perf tcp_crr 64 B (conn/s) | ${RESULT[crr-tcp]:-} | ${RESULT[crr-shm]:-} |" \
    "$(ratio "${RESULT[crr-tcp]:-0}" "${RESULT[crr-shm]:-0}") | $(shm_ends "$RAW"/crr-*-shm.stats) |" \
    "${RESULT[crr-adaptive]:-} | $(ratio "${RESULT[crr-tcp]:-0}" "${RESULT[crr-adaptive]:-0}") |"
  echo "| nginx 2 workers, shared listener, ab -c 16, no keep-alive | ${RESULT[nginx-tcp]:-} |" \
    "${RESULT[nginx-shm]:-} | $(ratio "${RESULT[nginx-rps-tcp]:-0}" "${RESULT[nginx-rps-shm]:-0}") |" \
    "$(shm_ends "$RAW"/nginx-ab-shm.stats) (ab's ends) | ${RESULT[nginx-adaptive]:-} |" \
    "$(ratio "${RESULT[nginx-rps-tcp]:-0}" "${RESULT[nginx-rps-adaptive]:-0}") |"
} | tee "$OUT/results.md"
exit $status
