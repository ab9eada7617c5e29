"""The stats forger (run it as uid nobody, under slip-run): makes --connections TCP
connections to a listener of its own (over shm, so that its own stats file in /dev/shm
lists them), then copies its own stats file to the name of another process's,
/dev/shm/slipstream-stats.<--victim>, with the pid in the header (bytes 8-11, core/stats.h)
made the victim's, so that slip-stat would show these connections as the victim's. Prints
{"forged": path, "connections": n} and waits for SIGTERM (the copy stays; the test removes
it).
"""

import argparse
import json
import os
import signal
import socket
import struct
import time

STATS = "/dev/shm/slipstream-stats.{}"


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--victim", type=int, required=True)
    parser.add_argument("--connections", type=int, default=3)
    args = parser.parse_args()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    pairs = []
    for _ in range(args.connections):
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
        client.sendall(b"x")
        server.recv(1)
        pairs.append((client, server))
    own = STATS.format(os.getpid())
    deadline = time.monotonic() + 5
    while not os.path.exists(own) and time.monotonic() < deadline:
        time.sleep(0.01)
    data = bytearray(open(own, "rb").read())
    struct.pack_into("<I", data, 8, args.victim)
    forged = STATS.format(args.victim)
    fd = os.open(forged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, data)
    os.close(fd)
    print(json.dumps({"forged": forged, "connections": args.connections}), flush=True)
    signal.sigwait([signal.SIGTERM])


if __name__ == "__main__":
    main()
