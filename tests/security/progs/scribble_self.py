"""A hostile client that runs under slip-run like any other: its connection to the server is
a real, library-built shm connection, and then it turns on its own shared region.

It connects to --host:--port, finds the region among its own mappings (/proc/self/maps
names it "/memfd:slipstream (deleted)"; the library keeps no descriptor of it, so it is
opened again through /proc/self/map_files, which root may do), maps it read-write, and for --duration s a child process
writes random bytes over the control page (header, cursors, eof/reader_closed, wake words)
and the rings (raw_shm.scribbler), while this process keeps sending and receiving through
the socket (non-blocking, so that its own confused library cannot hang it). Prints SCRIBBLING
once it started, then {"region": path or null, "sent", "received", "ended"}.
"""

import argparse
import errno
import json
import mmap
import os
import random
import select
import socket
import time

from raw_shm import fork_child, scribbler, stop_child


class Mapped:
    """What raw_shm.scribbler needs: the mapping, as .map."""

    def __init__(self, fd):
        self.map = mmap.mmap(fd, os.fstat(fd).st_size)


def own_region():
    for entry in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{entry}")
        except OSError:
            continue
        if target.startswith("/memfd:slipstream"):
            return f"/proc/self/fd/{entry}"
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and fields[5].startswith("/memfd:slipstream"):
                return f"/proc/self/map_files/{fields[0]}"
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    sock = socket.create_connection((args.host, args.port))
    sock.sendall(b"hello")  # the connection is installed and in use
    path = own_region()
    sent = received = 0
    ended = None
    if path:
        fd = os.open(path, os.O_RDWR)
        child = fork_child(lambda: scribbler(Mapped(fd), args.duration, args.seed))
        print("SCRIBBLING", flush=True)
        sock.setblocking(False)
        deadline = time.monotonic() + args.duration
        while time.monotonic() < deadline:  # scribbling goes on after the socket ended
            if ended is not None:
                time.sleep(0.01)
                continue
            readable, writable, _ = select.select([sock], [sock], [], 0.01)
            try:
                if writable:
                    sent += sock.send(rng.randbytes(rng.randint(1, 65536)))
                if readable:
                    data = sock.recv(65536)
                    received += len(data)
                    if not data:
                        ended = "eof"
            except BlockingIOError:
                pass
            except OSError as e:
                ended = errno.errorcode.get(e.errno, str(e.errno))
            time.sleep(0.001)
        stop_child(child)
    # Our own library may be past saving: exit without closing anything through it.
    print(json.dumps({"region": path, "sent": sent, "received": received, "ended": ended}),
          flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
