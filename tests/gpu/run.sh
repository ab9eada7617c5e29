#!/bin/bash
# NCCL through the Slipstream plugin on a GPU machine: PyTorch's NCCL, two ranks on one GPU
# made to look like two hosts, every collective checked exactly (tests/gpu/nccl_collectives.py).
#   tests/gpu/run.sh [BUILD_DIR]        the plugin (NCCL's default choice of protocol, then LL,
#                                       LL128 and Simple forced), then NCCL's own socket
#                                       transport as the baseline
# Exits 77 (skipped) where there is no GPU or no PyTorch with CUDA.
set -uo pipefail
BUILD=${1:-build}
PYTHON=${PYTHON:-python3}
PLUGIN_DIR=$(cd "$BUILD/lib" 2>/dev/null && pwd) || { echo "no $BUILD/lib"; exit 1; }
[ -f "$PLUGIN_DIR/libnccl-net-slipstream.so" ] || { echo "no plugin in $PLUGIN_DIR"; exit 1; }
HERE=$(cd "$(dirname "$0")" && pwd)
LOG=${SLIP_GPU_LOG:-$(mktemp -d)}
mkdir -p "$LOG"

"$PYTHON" "$HERE/nccl_collectives.py" --plugin-dir "$PLUGIN_DIR" --net Slipstream \
  > "$LOG/slipstream.log" 2>&1
rc=$?
[ $rc -eq 77 ] && { cat "$LOG/slipstream.log"; exit 77; }
grep -E "NET/Plugin|NET/Slipstream|Using network|^\{" "$LOG/slipstream.log" | sort | uniq -c | head -40
if [ $rc -ne 0 ]; then
  echo "FAIL: collectives through the plugin (log: $LOG/slipstream.log)"
  tail -50 "$LOG/slipstream.log"
  exit 1
fi
# NCCL must have used our network, not fallen back to its own.
grep -q "Using network Slipstream" "$LOG/slipstream.log" || {
  echo "FAIL: NCCL did not use the Slipstream network"; exit 1; }
# Bytes arrive in order over shm, so NCCL's LL and LL128 protocols (flags inside the data)
# must be exact through the plugin too: each protocol forced in turn.
for proto in ${SLIP_GPU_PROTOS-LL LL128 Simple}; do
  NCCL_PROTO=$proto "$PYTHON" "$HERE/nccl_collectives.py" --plugin-dir "$PLUGIN_DIR" \
    --net Slipstream --no-timing > "$LOG/slipstream-$proto.log" 2>&1 || {
    echo "FAIL: collectives through the plugin with NCCL_PROTO=$proto ($LOG/slipstream-$proto.log)"
    tail -30 "$LOG/slipstream-$proto.log"
    exit 1
  }
  grep -E "^\{" "$LOG/slipstream-$proto.log"
done
if [ "${SLIP_GPU_BASELINE:-1}" = 1 ]; then
  "$PYTHON" "$HERE/nccl_collectives.py" --net Socket > "$LOG/socket.log" 2>&1 ||
    echo "(baseline with NCCL's socket transport failed: $LOG/socket.log)"
  grep -E "^\{" "$LOG/socket.log"
fi
echo "PASS"
