#!/bin/bash
# make install's layout works from wherever it is installed: cmake --install into a fresh
# prefix, then slip-run from there preloads the installed shim, accelerates a connection
# between two of its processes, and the installed plugin exports its tables and nothing else.
#   tests/install/run.sh BUILD_DIR
set -euo pipefail
BUILD=$(cd "$1" && pwd)
PREFIX=$(mktemp -d)
trap 'rm -rf "$PREFIX"' EXIT
cmake --install "$BUILD" --prefix "$PREFIX" >/dev/null
for f in bin/slip-run bin/slip-stat lib/libslipstream.so lib/libnccl-net-slipstream.so; do
  [ -e "$PREFIX/$f" ] || { echo "FAIL: $f not installed"; exit 1; }
done
exports=$(nm -D --defined-only "$PREFIX/lib/libnccl-net-slipstream.so" | awk '{print $3}' | sort | tr '\n' ' ')
[ "$exports" = "ncclNetPlugin_v10 ncclNetPlugin_v11 ncclNetPlugin_v8 ncclNetPlugin_v9 " ] ||
  { echo "FAIL: the plugin exports: $exports"; exit 1; }
# The installed slip-run preloads the installed library (not the build tree's).
preload=$("$PREFIX/bin/slip-run" -- /bin/sh -c 'echo "$LD_PRELOAD"')
case "$preload" in
  *"$PREFIX/bin/../lib/libslipstream.so"*|*"$PREFIX/lib/libslipstream.so"*) ;;
  *) echo "FAIL: LD_PRELOAD is '$preload'"; exit 1 ;;
esac
# And it works: a connection between two processes under the installed slip-run is on shm.
PY=/usr/bin/python3
stats=$PREFIX/stats.json
port=$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
SLIP_STATS_FILE=$stats "$PREFIX/bin/slip-run" -- $PY -c "
import socket, sys, os
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(('127.0.0.1', $port)); srv.listen(1)
if os.fork() == 0:
    c = socket.create_connection(('127.0.0.1', $port)); c.sendall(b'x' * 100000); c.close(); os._exit(0)
conn, _ = srv.accept(); got = b''
while True:
    b = conn.recv(65536)
    if not b: break
    got += b
os.wait()
sys.exit(0 if got == b'x' * 100000 else 1)
"
grep -q '"transport":"shm"' "$stats" || { echo "FAIL: no shm connection in $stats"; cat "$stats"; exit 1; }
echo "PASS: installed under a fresh prefix, shm through the installed shim, plugin exports 4 tables"
