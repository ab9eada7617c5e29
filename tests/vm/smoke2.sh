#!/bin/sh
# Two-guest lab smoke test (tests/vm/rxe-run2): ibv_rc_pingpong (RoCE v2, GID index 1)
# from guest 2 (10.77.0.2) to guest 1 (10.77.0.1) across the qemu socket link.
# The client retries until the server (booting in parallel) listens.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
: "${SLIP_VM_TIMEOUT:=300}"
export SLIP_VM_TIMEOUT
# shellcheck disable=SC2016  # expanded in the guest
exec "$HERE/rxe-run2" \
    'timeout 120 ibv_rc_pingpong -d rxe0 -g 1 -n 1000' \
    'i=0; until timeout 60 ibv_rc_pingpong -d rxe0 -g 1 -n 1000 10.77.0.1 2>/dev/null; do
         i=$((i + 1)); [ $i -lt 100 ] || exit 1; sleep 1; done'
