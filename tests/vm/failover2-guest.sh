#!/bin/sh
# One end of the two-guest failover test (tests/vm/failover2.py runs it in each guest of
# tests/vm/rxe-run2):
#   failover2-guest.sh server|client BUILD PORT TOTAL
# Both ends run progs/bulk.py (TOTAL bytes each way, SHA-256 on both ends) under slip-run
# with the default transports: on two hosts detection must pick verbs. The client's guest
# deletes its own RDMA device (`rdma link delete rxe0`) once RDMA carries the streams, so
# that one side really loses its device and the other only hears of it (a FAILOVER on the
# TCP connection, or its queue pair's retries running out). Each end prints, for the host:
#   @result JSON    bulk.py's report        @stats JSON   slip-run's stats record
#   @log LINE       Slipstream's log        @deleted ...  (client) the device deletion
set -u
ROLE=$1 BUILD=$2 PORT=$3 TOTAL=$4
SERVER=10.77.0.1
COUNTER=/sys/class/infiniband/rxe0/ports/1/hw_counters/sent_pkts
export SLIP_LOG=info SLIP_LOG_FILE=/tmp/slip.log

report() {
  echo "@result $(cat /tmp/result.json 2>/dev/null)"
  echo "@stats $(cat /tmp/stats.jsonl 2>/dev/null)"
  sed 's/^/@log /' /tmp/slip.log 2>/dev/null
}

run_bulk() {
  timeout 240 "$BUILD/bin/slip-run" --stats=/tmp/stats.jsonl -- \
    /usr/bin/python3 tests/integration/progs/bulk.py "$@" --port "$PORT" --total "$TOTAL" \
    >/tmp/result.json &
  BULK=$!
}

if [ "$ROLE" = server ]; then
  run_bulk server --bind "$SERVER" --seed 1
  # The client's guest boots in parallel: a plain marker listener on PORT+1 tells it the
  # server listens (a probe of PORT itself would be the server's one connection).
  i=0
  until ss -Hltn "sport = :$PORT" | grep -q .; do
    i=$((i + 1))
    [ $i -lt 600 ] || { echo "server never listened"; exit 1; }
    sleep 0.1
  done
  /usr/bin/python3 -c "import socket
s = socket.create_server(('$SERVER', $((PORT + 1))))
s.settimeout(240)
s.accept()[0].close()" &
  wait $BULK
  status=$?
  report
  exit $status
fi

i=0
until /usr/bin/python3 -c "import socket; socket.create_connection(('$SERVER', $((PORT + 1))), 2).close()" \
  2>/dev/null; do
  i=$((i + 1))
  [ $i -lt 600 ] || { echo "the server's guest never came up"; exit 1; }
  sleep 0.2
done
start=$(cat $COUNTER)
run_bulk client --host "$SERVER" --seed 2
# Delete the device once RDMA really carries the streams, and well before they end.
while [ $(($(cat $COUNTER) - start)) -lt 2000 ]; do
  kill -0 $BULK 2>/dev/null || break
  sleep 0.05
done
packets=$(($(cat $COUNTER) - start))
before=$(date +%s%N)
rdma link delete rxe0
echo "@deleted status $? after $packets RoCE packets; the deletion took $((($(date +%s%N) - before) / 1000000)) ms"
wait $BULK
status=$?
report
exit $status
