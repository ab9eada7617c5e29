"""Whose descriptors sit below the hidden-descriptor floor while connections are open.

The shim keeps its own descriptors at or above a floor (half the soft RLIMIT_NOFILE at
start-up), so that the application gets the numbers it would get without Slipstream;
libfabric's included (its sockets, socket pairs and epoll sets; preload/hidden_fds.h).
Both sides note the descriptors below the floor before any connection, then open --count
connections and echo random bytes of random sizes over each (the client checks SHA-256 of
what comes back), and, with every connection still open and idle, list the descriptors
below the floor again. One JSON line each: {"floor", "new": {fd: what /proc says},
"own": [the program's own sockets], "exact": bool, "bytes": n}. Then the client closes,
and the server reads each to its end.
"""

import hashlib
import os
import random
import resource
import socket

from common import LOOPBACK, argument_parser, listen, recv_exact, report


def low_fds(floor):
    out = {}
    for entry in os.scandir("/proc/self/fd"):
        fd = int(entry.name)
        if fd >= floor:
            continue
        try:
            link = os.readlink(entry.path)
        except OSError:
            continue  # (the directory's own descriptor, closed meanwhile)
        if not link.startswith("/proc/"):
            out[fd] = link
    return out


def new_since(before, floor):
    return {fd: link for fd, link in low_fds(floor).items() if before.get(fd) != link}


def serve(args, floor):
    with listen(args.port) as listener:
        listener.listen(args.count)
        before = low_fds(floor)
        conns, total = [], 0
        while len(conns) < args.count:
            conn, _ = listener.accept()
            conns.append(conn)
            size = int.from_bytes(recv_exact(conn, 4), "little")
            conn.sendall(recv_exact(conn, size))
            total += size
        report(floor=floor, new=new_since(before, floor),
               own=sorted([listener.fileno()] + [c.fileno() for c in conns]), exact=True,
               bytes=total)
        for conn in conns:
            if conn.recv(1) != b"":
                raise SystemExit("expected EOF")
            conn.close()


def connect(args, floor):
    rng = random.Random(args.seed)
    before = low_fds(floor)
    conns, exact, total = [], True, 0
    for _ in range(args.count):
        conn = socket.create_connection((LOOPBACK, args.port))
        conns.append(conn)
        data = rng.randbytes(rng.randrange(1, 256 * 1024))
        conn.sendall(len(data).to_bytes(4, "little") + data)
        back = recv_exact(conn, len(data))
        exact = exact and hashlib.sha256(back).digest() == hashlib.sha256(data).digest()
        total += len(data)
    report(floor=floor, new=new_since(before, floor), own=sorted(c.fileno() for c in conns),
           exact=exact, bytes=total)
    for conn in conns:
        conn.close()


def main():
    parser = argument_parser(__doc__, role=True)
    parser.add_argument("--count", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    floor = resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 2  # core/sys.h HiddenFdFloor
    (serve if args.role == "server" else connect)(args, floor)


if __name__ == "__main__":
    main()
