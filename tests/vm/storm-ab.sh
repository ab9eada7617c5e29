#!/bin/sh
# Connection storms over verbs, two builds alternating in ONE guest (same load for both):
#   tests/vm/rxe-run 'tests/vm/storm-ab.sh BASE_BUILD NEW_BUILD [PAIRS]'
# e.g. BASE_BUILD from a worktree of an older commit (git worktree add --detach ../base
# COMMIT; cmake --build ../base/build --target slipstream slipstream-verbs slip-run), or
# one build twice with different settings: AB_BASE_ENV / AB_NEW_ENV are VAR=VALUE words
# each side's programs run with (e.g. AB_BASE_ENV=SLIP_VERBS_REUSE=0), AB_INFLIGHT the
# connections in flight (default 20; 1: one short-lived connection after another).
# Needs BUILD/bench-rdma/bin/storm (tests/vm/bench-rdma.sh --setup-only builds it for the
# link). Each run: tests/stress/storm.c, 3 rounds of 100 connections, 20 in flight, both
# ends under slip-run --transports=verbs,tcp on 10.77.0.1; prints each round's
# connections/s, the guest's busy and idle CPU ticks over the client's life, the client's
# own CPU, and the transports both ends' stats record (all must be verbs).
set -u
BASE=$1 NEW=$2 PAIRS=${3:-3}
INFLIGHT=${AB_INFLIGHT:-20}
STORM=$NEW/bench-rdma/bin/storm
[ -x "$STORM" ] || { echo "error: $STORM not built (run bench-rdma.sh --setup-only)" >&2; exit 2; }
T=$(mktemp -d)
G=$T/gate
mkdir -p "$G"
for k in 0 1 2 3; do : >"$G/go.$k"; done
port=21000
cpu() { awk '/^cpu /{print $2+$3+$4+$6+$7+$8, $5}' /proc/stat; }
i=0
while [ $i -lt "$PAIRS" ]; do
  i=$((i + 1))
  for v in base new; do
    if [ $v = base ]; then
      R="env ${AB_BASE_ENV:-} $BASE/bin/slip-run"
    else
      R="env ${AB_NEW_ENV:-} $NEW/bin/slip-run"
    fi
    port=$((port + 1))
    $R --transports=verbs,tcp --stats="$T/ss.$v.$i" -- "$STORM" serve --port $port \
      --mode close >"$T/s.$v.$i" 2>&1 &
    sp=$!
    n=0
    until grep -q listening "$T/s.$v.$i" 2>/dev/null || [ $n -gt 100 ]; do
      sleep 0.1
      n=$((n + 1))
    done
    sleep 0.3 # the rdma_cm listener is up before the kernel's: margin for the first REQ
    set -- $(cpu)
    b0=$1 i0=$2
    timeout 120 /usr/bin/time -f "client cpu %U user %S sys %e wall" $R --transports=verbs,tcp \
      --stats="$T/cs.$v.$i" -- "$STORM" client --port $port --mode storm --conns 100 \
      --concurrency "$INFLIGHT" --rounds 3 --gate "$G" >"$T/c.$v.$i" 2>&1
    set -- $(cpu)
    echo "$v $i: conn/s per round: $(grep -o '"conns_per_s":[0-9.]*' "$T/c.$v.$i" | cut -d: -f2 |
      tr '\n' ' ')guest busy $(($1 - b0)) idle $(($2 - i0)) ticks; $(grep 'client cpu' "$T/c.$v.$i")"
    kill -INT $sp 2>/dev/null
    wait $sp 2>/dev/null
    echo "   transports: client $(grep -o '"transport":"[a-z]*","reason":"[a-z_]*"' "$T/cs.$v.$i" |
      sort | uniq -c | tr '\n' ' ')server $(grep -o '"transport":"[a-z]*","reason":"[a-z_]*"' \
      "$T/ss.$v.$i" | sort | uniq -c | tr '\n' ' ')"
  done
done
rm -rf "$T"
