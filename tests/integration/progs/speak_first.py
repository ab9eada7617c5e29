"""A server that speaks first and a client that waits for it (as SMTP, FTP, MySQL do).

  server: listens; waits until the file --go exists (the client's connection is queued by
          then, so accept() measures only what is done inside it); accepts one connection;
          sends --total seeded random bytes and shuts down its side; reads until EOF.
          Prints {"accept_s", "pinned_before", "pinned_after" (VmPin in KiB once listening,
          and before closing the connection: once it is within 1 MiB of the first, or after
          2 s), "sent", "sent_sha256", "received",
          "received_sha256"}.
  client: connects (prints "connected") and sends nothing until it has all --total bytes of the server's (a
          silent client: nothing it does tells a server that it is plain); then sends its
          own --total bytes, shuts down its side and reads to EOF. Prints {"first_byte_s",
          "sent", "sent_sha256", "received", "received_sha256"}.
"""

import hashlib
import os
import random
import socket
import time

from common import MiB, argument_parser, connect, listen, mark, random_chunks, report


def send_seeded(sock, seed, total):
    sha = hashlib.sha256()
    for chunk in random_chunks(random.Random(seed), total, MiB):
        sock.sendall(chunk)
        sha.update(chunk)
    sock.shutdown(socket.SHUT_WR)
    return sha


def pinned_kib():
    """This process's pinned memory (VmPin: what its RDMA registrations hold), in KiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmPin:"):
                return int(line.split()[1])
    return None


def main():
    parser = argument_parser(__doc__, role=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--total", type=int, default=MiB)
    parser.add_argument("--go", help="server: accept once this file exists")
    args = parser.parse_args()
    received = hashlib.sha256()
    count = 0
    if args.role == "server":
        with listen(args.port, args.bind) as listener:
            pinned_before = pinned_kib()
            while args.go and not os.path.exists(args.go):
                time.sleep(0.01)
            start = time.monotonic()
            sock, _ = listener.accept()
            accept_s = time.monotonic() - start
        sent = send_seeded(sock, args.seed, args.total)
        while data := sock.recv(MiB):
            received.update(data)
            count += len(data)
        # A registration given back by a background thread may take a moment (at most 2 s
        # here): what is pinned then, with no slot beyond 1 MiB left over, or after 2 s.
        deadline = time.monotonic() + 2
        while (pinned_before is not None and pinned_kib() > pinned_before + 1024
               and time.monotonic() < deadline):
            time.sleep(0.1)
        pinned_after = pinned_kib()
        sock.close()
        report(accept_s=accept_s, pinned_before=pinned_before, pinned_after=pinned_after,
               sent=args.total, sent_sha256=sent.hexdigest(), received=count,
               received_sha256=received.hexdigest())
        return
    sock = connect(args.port, args.source_port, args.host)
    mark("connected")
    start = time.monotonic()
    first_byte_s = None
    while count < args.total:
        data = sock.recv(MiB)
        if not data:
            break
        if first_byte_s is None:
            first_byte_s = time.monotonic() - start
        received.update(data)
        count += len(data)
    sent = send_seeded(sock, args.seed + 1, args.total)
    while data := sock.recv(MiB):
        received.update(data)
        count += len(data)
    sock.close()
    report(first_byte_s=first_byte_s, sent=args.total, sent_sha256=sent.hexdigest(),
           received=count, received_sha256=received.hexdigest())


if __name__ == "__main__":
    main()
