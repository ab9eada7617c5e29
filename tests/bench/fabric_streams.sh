#!/bin/sh
# The shim's streams over libfabric against kernel TCP and Slipstream's shm, in one run on
# this host (make bench-fabric): slip-perf's ping-pong latency and one-stream bandwidth
# (the server checks every session's count and content), plain, under slip-run with shm,
# and under slip-run with fabric over the tcp provider (its connected endpoints, the
# default; and its reliable datagrams through ofi_rxm, SLIP_FABRIC_ENDPOINT=rdm) and the shm
# provider, and over tcp's connected endpoints with the send/receive variant
# (SLIP_FABRIC_DATA, the variant for providers without RMA). Prints slip-perf's CSV
# rows, one set per configuration (columns: slip-perf --format csv).
# Usage: tests/bench/fabric_streams.sh [BUILD] [SIZES] [DURATION]
set -eu
BUILD=${1:-build}
SIZES=${2:-64,4K,64K,1M}
DURATION=${3:-0.5}
BIN=$BUILD/bin
run() {
  label=$1
  shift
  port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  env "$@" SLIP_SHORT_CONNS=accelerate "$BIN/slip-run" -- "$BIN/slip-perf" server -p "$port" --once \
    >/dev/null 2>&1 &
  server=$!
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    ss -ltn "sport = :$port" | grep -q LISTEN && break
    sleep 0.2
  done
  env "$@" SLIP_SHORT_CONNS=accelerate "$BIN/slip-run" -- "$BIN/slip-perf" client 127.0.0.1 \
    -p "$port" tcp_lat tcp_bw --sizes "$SIZES" --duration "$DURATION" --label "$label" \
    --format csv | tail -n +2
  wait "$server"
}
echo "# label,transport,test,size,... (slip-perf --format csv)"
run kernel-tcp SLIP_ENABLE=0
run slipstream-shm SLIP_TRANSPORTS=shm,tcp
run fabric-tcp SLIP_TRANSPORTS=fabric,tcp SLIP_FABRIC_PROVIDER=tcp
run fabric-tcp-rdm SLIP_TRANSPORTS=fabric,tcp SLIP_FABRIC_PROVIDER=tcp SLIP_FABRIC_ENDPOINT=rdm
run fabric-shm SLIP_TRANSPORTS=fabric,tcp SLIP_FABRIC_PROVIDER=shm
run fabric-tcp-msg-send SLIP_TRANSPORTS=fabric,tcp SLIP_FABRIC_PROVIDER=tcp \
  SLIP_FABRIC_ENDPOINT=msg SLIP_FABRIC_DATA=send
