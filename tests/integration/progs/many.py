"""Many idle connections: the memory they cost.

The client opens --count connections to the server and bounces one byte over each (so
every connection is established and, under Slipstream, accelerated); then each side
reports how much of the Slipstream shared regions it has touched (resident pages of the
memfd mappings in /proc/self/smaps) and its open descriptor count, and the client closes
everything. The server reports again after all connections are gone, so that leaks of
descriptors or mappings show up.
"""

import resource
import socket

from common import LOOPBACK, argument_parser, listen, report


def region_bytes():
    """Resident bytes of Slipstream's memfd mappings in this process."""
    total, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5:
                inside = "memfd:slipstream" in line
            elif inside and fields[0] == "Rss:":
                total += int(fields[1]) * 1024
    return total


def open_fds():
    import os
    return len(os.listdir("/proc/self/fd"))


def raise_fd_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def serve(args):
    conns = []
    with listen(args.port) as listener:
        listener.listen(args.count)
        while len(conns) < args.count:
            conn, _ = listener.accept()
            conns.append(conn)
            conn.sendall(conn.recv(1))
    report(phase="idle", region_bytes=region_bytes(), fds=open_fds(), connections=len(conns))
    for conn in conns:
        if conn.recv(1) != b"":
            raise SystemExit("expected EOF")
        conn.close()
    report(phase="closed", region_bytes=region_bytes(), fds=open_fds())


def connect(args):
    conns = [socket.create_connection((LOOPBACK, args.port)) for _ in range(args.count)]
    for conn in conns:
        conn.sendall(b"x")
    for conn in conns:
        if conn.recv(1) != b"x":
            raise SystemExit("echo mismatch")
    report(phase="idle", region_bytes=region_bytes(), fds=open_fds(), connections=len(conns))
    for conn in conns:
        conn.close()


def main():
    parser = argument_parser(__doc__, role=True)
    parser.add_argument("--count", type=int, default=1000)
    args = parser.parse_args()
    raise_fd_limit()
    (serve if args.role == "server" else connect)(args)


if __name__ == "__main__":
    main()
