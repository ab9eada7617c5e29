#!/bin/sh
# Soft-RoCE lab smoke test: boots the guest (tests/vm/rxe-run) and checks that RDMA really
# works on rxe0: ibv_devinfo PORT_ACTIVE, ibv_rc_pingpong (RoCE v2, GID index 1),
# rping (rdma_cm), perftest ib_write_lat and ib_write_bw, both ends on rxe0 addressed by
# 10.77.0.1. Prints the figures; exits non-zero if anything fails.
#   tests/vm/smoke.sh            from the host (any directory)
#   tests/vm/smoke.sh --guest    the part that runs inside the guest
# Each test program runs under its own timeout (SLIP_SMOKE_T, default 60 s); the whole VM
# under SLIP_VM_TIMEOUT (default here 600 s: a loaded 2-core host boots slowly).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)

if [ "${1:-}" != --guest ]; then
    : "${SLIP_VM_TIMEOUT:=600}"
    export SLIP_VM_TIMEOUT
    exec "$HERE/rxe-run" "sh '$HERE/smoke.sh' --guest"
fi

T=${SLIP_SMOKE_T:-60}
DEV=${SLIP_SMOKE_DEV:-rxe0}
IP=10.77.0.1
LOG=$(mktemp -d /tmp/smoke.XXXXXX)
FAILED=0
pass() { echo "PASS $1${2:+: $2}"; }
fail() { echo "FAIL $1${2:+: $2}"; FAILED=$((FAILED + 1)); }

# Wait (up to $T s) until a TCP port listens: the servers below exchange QP info over TCP.
# Gives up at once if the server ($2) has exited.
wait_port() {
    end=$(($(date +%s) + T))
    while ! ss -Hltn "sport = :$1" | grep -q .; do
        kill -0 "$2" 2>/dev/null || return 1
        [ "$(date +%s)" -lt "$end" ] || return 1
        sleep 0.1
    done
}

# run_pair NAME PORT 'SERVER ARGS' 'CLIENT ARGS': server in the background, then client;
# both must exit 0. Output in $LOG/NAME.server and $LOG/NAME.client.
run_pair() {
    name=$1 port=$2 srv=$3 cli=$4
    # shellcheck disable=SC2086
    timeout "$T" $srv >"$LOG/$name.server" 2>&1 &
    spid=$!
    if [ "$port" != - ] && ! wait_port "$port" "$spid"; then
        kill "$spid" 2>/dev/null; wait "$spid"
        fail "$name" "server not listening on $port"; cat "$LOG/$name.server"; return 1
    fi
    [ "$port" = - ] && sleep 1
    # shellcheck disable=SC2086
    timeout "$T" $cli >"$LOG/$name.client" 2>&1
    crc=$?
    wait "$spid"
    src=$?
    if [ $crc -ne 0 ] || [ $src -ne 0 ]; then
        fail "$name" "client exit $crc, server exit $src (124 = timeout)"
        echo "--- server"; cat "$LOG/$name.server"; echo "--- client"; cat "$LOG/$name.client"
        return 1
    fi
}

echo "== $(uname -r), $(nproc) vCPUs; rdma links:"
rdma link show

# 1. Device and port.
if ibv_devinfo -d "$DEV" >"$LOG/devinfo" 2>&1 && grep -q PORT_ACTIVE "$LOG/devinfo"; then
    pass ibv_devinfo "$DEV $(grep -o 'active_mtu:.*' "$LOG/devinfo" | tr -s '\t ' ' ')"
else
    fail ibv_devinfo "$DEV not PORT_ACTIVE"; cat "$LOG/devinfo"
fi
if ibv_devinfo -d "$DEV" -v 2>/dev/null | grep -q 'GID\[ *1\]:.*::ffff:10\.77\.0\.1, RoCE v2'; then
    pass "GID index 1" "::ffff:10.77.0.1 (RoCE v2)"
else
    fail "GID index 1" "not the IPv4-mapped GID of 10.77.0.1"
    ibv_devinfo -d "$DEV" -v | grep GID
fi

# 2. Verbs RC ping-pong (RoCE v2: GID index 1).
if run_pair ibv_rc_pingpong 18515 "ibv_rc_pingpong -d $DEV -g 1 -p 18515 -n 1000" \
        "ibv_rc_pingpong -d $DEV -g 1 -p 18515 -n 1000 $IP"; then
    pass ibv_rc_pingpong "$(grep -h 'usec/iter' "$LOG/ibv_rc_pingpong.client" | tr -s ' ')"
fi

# 3. rdma_cm (what a verbs transport connects with).
if run_pair rping - "rping -s -a $IP -C 100 -S 4096" "rping -c -a $IP -C 100 -S 4096"; then
    pass rping "100 ping-pongs of 4 KiB over rdma_cm"
fi

# 4. perftest: latency and bandwidth. -x 1: GID index 1; -F: no CPU frequency check (a VM).
if run_pair ib_write_lat 18516 "ib_write_lat -d $DEV -x 1 -F -p 18516 -s 64 -n 2000" \
        "ib_write_lat -d $DEV -x 1 -F -p 18516 -s 64 -n 2000 $IP"; then
    l=$(awk '$1 == 64 && NF >= 7 { print "64 B: t_typical " $5 " us, t_avg " $6 " us, t_99% " $8 " us" }' \
        "$LOG/ib_write_lat.client")
    if [ -n "$l" ]; then pass ib_write_lat "$l"
    else fail ib_write_lat "no figures"; cat "$LOG/ib_write_lat.client"; fi
fi
if run_pair ib_write_bw 18517 "ib_write_bw -d $DEV -x 1 -F -p 18517 -s 65536 -n 500" \
        "ib_write_bw -d $DEV -x 1 -F -p 18517 -s 65536 -n 500 $IP"; then
    l=$(awk '$1 == 65536 && NF >= 5 { print "64 KiB: BW average " $4 " MB/s, " $5 " Mpps" }' \
        "$LOG/ib_write_bw.client")
    if [ -n "$l" ]; then pass ib_write_bw "$l"
    else fail ib_write_bw "no figures"; cat "$LOG/ib_write_bw.client"; fi
fi

rm -rf "$LOG"
if [ $FAILED -ne 0 ]; then
    echo "smoke: $FAILED check(s) FAILED"
    exit 1
fi
echo "smoke: all checks passed"
