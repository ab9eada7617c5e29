# shellcheck shell=bash
# Shared by tests/bench/bench.sh and scripts/demo.sh (sourced, not run): finding the
# binaries, running a server/client pair plain or under slip-run with timeouts, and reading
# the slip-run stats file. Nothing here can hang: every process runs under timeout(1).

# slip_setup BUILD_DIR PLAIN_ONLY
# Sets SLIP_PERF and SLIP_RUN. Without PLAIN_ONLY=1, build/bin/slip-run must exist. Call it
# after reading the scripts' own settings: it removes SLIP_BENCH_* and SLIP_DEMO_* from the
# environment, since the shim warns about every SLIP_* variable it does not know.
slip_setup() {
  local build=$1 plain_only=$2
  local own=("${!SLIP_BENCH_@}" "${!SLIP_DEMO_@}")
  [[ ${#own[@]} -gt 0 ]] && unset "${own[@]}"
  SLIP_PERF=$build/bin/slip-perf
  SLIP_RUN=$build/bin/slip-run
  if [[ ! -x $SLIP_PERF ]]; then
    echo "error: $SLIP_PERF not found: build it first (make)" >&2
    return 1
  fi
  if [[ $plain_only != 1 && ! -x $SLIP_RUN ]]; then
    echo "error: $SLIP_RUN not found: build the shim first (make)," \
      "or set SLIP_BENCH_PLAIN_ONLY=1 to measure kernel TCP only" >&2
    return 1
  fi
  if ! command -v timeout >/dev/null; then
    echo "error: timeout(1) (coreutils) is needed" >&2
    return 1
  fi
}

# slip_port_used PORT [STATE]: has some TCP socket (IPv4 or IPv6) local port PORT, in
# STATE when given (hex, as in /proc/net/tcp: 0A is LISTEN)?
# slip_apt_install LOG PACKAGE...: installs the packages with apt-get (updating its lists
# when the first try fails), as root or through sudo -n; output to LOG. Installs nothing
# where there is no apt-get; the caller checks what is there afterwards.
slip_apt_install() {
  local log=$1
  shift
  local sudo=()
  [[ $(id -u) != 0 ]] && command -v sudo >/dev/null && sudo=(sudo -n)
  command -v apt-get >/dev/null || return 0
  echo "installing $* with apt-get (log: $log)"
  {
    timeout 300 "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" ||
      { timeout 300 "${sudo[@]}" apt-get update -q &&
        timeout 300 "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@"; }
  } >"$log" 2>&1
}

# slip_value NAME MODE TEXT: stores TEXT in the caller's VAL[NAME.MODE] when it is a number;
# otherwise adds a failure naming the raw files ($PREFIX.*) to the caller's FAILURES.
slip_value() {
  if [[ $3 =~ ^[0-9]+(\.[0-9]+)?$ ]]; then
    # shellcheck disable=SC2034  # (the caller's)
    VAL[$1.$2]=$3
  else
    FAILURES+=("$1 over $2: no value in the output (see $PREFIX.*)")
  fi
}

slip_port_used() {
  local hex
  hex=$(printf ':%04X' "$1")
  awk -v p="$hex" -v st="${2:-}" '
    substr($2, length($2) - 4) == p && (st == "" || $4 == st) { found = 1 }
    END { exit !found }' /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

slip_listening() { slip_port_used "$1" 0A; }

# slip_free_port PORT: prints PORT or the next port above it with no socket on it at all
# (a connection in TIME_WAIT keeps servers without SO_REUSEADDR, like sockperf, from
# binding).
slip_free_port() {
  local port=$1
  while slip_port_used "$port"; do port=$((port + 1)); done
  echo "$port"
}

# slip_wait_listen PORT PID: waits up to 10 s for PORT to listen while PID lives.
slip_wait_listen() {
  local port=$1 pid=$2 i
  for ((i = 0; i < 200; i++)); do
    slip_listening "$port" && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

# slip_stop PID GRACE: lets PID end by itself for GRACE seconds, then sends SIGINT (which
# timeout(1) passes on, killing after its -k delay), and reaps it.
slip_stop() {
  local pid=$1 grace=$2 i
  for ((i = 0; i < grace * 20; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  kill -INT "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

# slip_pair MODE PREFIX PORT SERVER_END SERVER_CMD... :: CLIENT_CMD...
#   MODE        tcp: both plain; shm: both under "$SLIP_RUN --stats=PREFIX.stats.jsonl --"
#   PREFIX      files: PREFIX.out (client stdout), PREFIX.err (client stderr),
#               PREFIX.server.log, PREFIX.stats.jsonl
#   SERVER_END  exits: the server ends by itself after the test; int: it is sent SIGINT
#   PORT        the server's port: the client starts once it listens
# Optional: PIN_SERVER / PIN_CLIENT (CPU lists for taskset), PAIR_TIMEOUT
# (seconds for each side, default 60). Returns the client's status (124: timed out).
slip_pair() {
  local mode=$1 prefix=$2 port=$3 server_end=$4
  shift 4
  local server=() client=()
  while [[ $# -gt 0 && $1 != "::" ]]; do server+=("$1"); shift; done
  shift
  client=("$@")

  local limit=${PAIR_TIMEOUT:-60} wrap_server=() wrap_client=()
  [[ -n ${PIN_SERVER:-} ]] && wrap_server=(taskset -c "$PIN_SERVER")
  [[ -n ${PIN_CLIENT:-} ]] && wrap_client=(taskset -c "$PIN_CLIENT")
  rm -f "$prefix".out "$prefix".err "$prefix".server.log "$prefix".stats.jsonl
  if [[ $mode == shm ]]; then
    wrap_server+=("$SLIP_RUN" --stats="$prefix".stats.jsonl --)
    wrap_client+=("$SLIP_RUN" --stats="$prefix".stats.jsonl --)
  fi

  timeout -s INT -k 5 "$limit" "${wrap_server[@]}" "${server[@]}" >"$prefix".server.log 2>&1 &
  local server_pid=$!
  if ! slip_wait_listen "$port" "$server_pid"; then
    echo "server did not listen on port $port (see $prefix.server.log)" >"$prefix".err
    slip_stop "$server_pid" 0
    return 1
  fi
  local rc=0
  timeout -s INT -k 5 "$limit" "${wrap_client[@]}" "${client[@]}" >"$prefix".out 2>"$prefix".err ||
    rc=$?
  if [[ $server_end == exits && $rc == 0 ]]; then
    slip_stop "$server_pid" 5
  else
    slip_stop "$server_pid" 0
  fi
  return "$rc"
}

# slip_csv_value FILE TEST COLUMN: a value from slip-perf --format csv output.
slip_csv_value() {
  awk -F, -v test="$2" -v col="$3" '
    NR == 1 { for (i = 1; i <= NF; i++) idx[$i] = i; next }
    $idx["test"] == test && (col in idx) { print $idx[col]; exit }' "$1" 2>/dev/null
}

# slip_stats_summary FILE: one line counting the transports of the connections recorded in a
# slip-run stats file (each process adds its own ends), e.g. "2x shm" or
# "1x shm, 1x tcp (peer_not_slipstream)", "2x fabric/verbs;ofi_rxm". Prints "no stats recorded" when there are none.
slip_stats_summary() {
  local file=$1 lines
  if [[ ! -s $file ]]; then
    echo "no stats recorded"
    return
  fi
  if command -v jq >/dev/null; then
    lines=$(jq -rR 'fromjson? | .connections[]? | .transport +
      (if (.provider // "") != "" then "/" + .provider else "" end) +
      (if (.reason // "none") == "none" or .reason == "" then "" else " (" + .reason + ")" end)' \
      "$file")
  else
    lines=$(grep -o '"transport" *: *"[^"]*"' "$file" | sed 's/.*"\([^"]*\)"$/\1/')
  fi
  if [[ -z $lines ]]; then
    echo "no connections recorded"
    return
  fi
  sort <<<"$lines" | uniq -c | awk '{ n = $1; $1 = ""; out = out sep n "x" $0; sep = ", " }
    END { print out }'
}

# slip_stats_all_shm FILE: true when every recorded connection used shm.
slip_stats_all_shm() {
  [[ -s $1 ]] || return 1
  ! grep -o '"transport" *: *"[^"]*"' "$1" | grep -qv '"shm"$'
}

# slip_stats_connections FILE: one line per recorded connection end, e.g.
#   slip-perf  127.0.0.1:40112 -> 127.0.0.1:5301  shm  sent 1000 B, received 1000 B
slip_stats_connections() {
  local file=$1
  if [[ ! -s $file ]]; then
    echo "  (no stats recorded)"
  elif ! command -v jq >/dev/null; then
    echo "  (install jq for a readable listing)"
    sed 's/^/  /' "$file"
  else
    jq -rR 'fromjson? | (.exe // "?" | split("/") | last) as $exe | .connections[]? |
      "  \($exe)  \(.local) -> \(.remote)  \(.transport)" +
      (if (.reason // "none") == "none" or .reason == "" then "" else " (\(.reason))" end) +
      "  sent \(.bytes_sent // 0) B, received \(.bytes_received // 0) B"' "$file"
  fi
}
