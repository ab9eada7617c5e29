#!/bin/bash
# 64 B latency and 64 KiB bandwidth over verbs, two builds alternating in ONE guest (the
# same load for both):
#   tests/vm/rxe-run 'tests/vm/lat-ab.sh BASE_BUILD NEW_BUILD [PAIRS]'
# Each run: slip-perf tcp_lat and tcp_bw (--duration 0.5 --repeat 3), both ends under that
# build's slip-run --transports=verbs,tcp on 10.77.0.1; prints each side's p50 latencies
# (us) and bandwidths (Gbit/s) of the three repeats, and the transports its stats record.
# AB_TESTS (default "tcp_lat tcp_bw") and AB_ARGS (e.g. "--size 1048576") change what runs;
# AB_SLIP (default "--transports=verbs,tcp") what slip-run is told (the streams over
# libfabric's verbs provider: "--transports=fabric,tcp --fabric-provider=verbs").
set -u
read -r -a TESTS <<< "${AB_TESTS:-tcp_lat tcp_bw}"
read -r -a EXTRA <<< "${AB_ARGS:-}"
read -r -a SLIP <<< "${AB_SLIP:---transports=verbs,tcp}"
BASE=$1 NEW=$2 PAIRS=${3:-4}
T=$(mktemp -d)
port=23000
for i in $(seq 1 "$PAIRS"); do
  for v in base new; do
    if [ $v = base ]; then B=$BASE; else B=$NEW; fi
    port=$((port + 1))
    "$B/bin/slip-run" "${SLIP[@]}" -- "$B/bin/slip-perf" server -p $port --once \
      >"$T/s.$v.$i" 2>&1 &
    sp=$!
    sleep 1.5
    "$B/bin/slip-run" "${SLIP[@]}" --stats="$T/st.$v.$i" -- "$B/bin/slip-perf" \
      client 10.77.0.1 -p $port "${TESTS[@]}" "${EXTRA[@]}" --duration 0.5 --repeat 3 --format csv \
      --label $v >"$T/c.$v.$i" 2>&1
    wait $sp
    echo "$v $i: $(grep -o 'p50_us,[0-9.,]*\|gbit_s,[0-9.,]*' "$T/c.$v.$i" | tr '\n' ' ')[$(
      grep -o '"transport":"[a-z]*"' "$T/st.$v.$i" | sort | uniq -c | tr '\n' ' ')]"
  done
done
rm -rf "$T"
