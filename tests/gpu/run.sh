#!/bin/bash
# NCCL through the Slipstream plugin on a GPU machine: PyTorch's NCCL, two ranks on one GPU
# made to look like two hosts, every collective checked exactly (tests/gpu/nccl_collectives.py).
#   tests/gpu/run.sh [BUILD_DIR]        the plugin, then NCCL's own socket transport as baseline
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
if [ "${SLIP_GPU_BASELINE:-1}" = 1 ]; then
  "$PYTHON" "$HERE/nccl_collectives.py" --net Socket > "$LOG/socket.log" 2>&1 ||
    echo "(baseline with NCCL's socket transport failed: $LOG/socket.log)"
  grep -E "^\{" "$LOG/socket.log"
fi
echo "PASS"
