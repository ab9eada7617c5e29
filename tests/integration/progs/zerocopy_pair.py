"""MSG_ZEROCOPY over one connection, as a program that waits for its completions uses it.

The server sends a seeded greeting from a thread while it reads the client's stream to
EOF. The client sends a first part with plain sends, then (--mode) a second part with
MSG_ZEROCOPY sends, and waits until the kernel has reported a completion for each of
those calls (the socket's error queue, woken by POLLERR), then shuts down and reads the
greeting to EOF. Where SO_ZEROCOPY is set depends on --mode:
  after_connect:   the client, between its two parts (the connection is moving bytes);
  before_connect:  the client, before connect();
  listener_after:  the server, on its listener after listen(): the accepted connection
                   has it from the kernel, and the server's greeting goes by MSG_ZEROCOPY;
  listener_before: the server, on its listener before listen(); as listener_after.
And ulp_after_connect: the client sets TCP_ULP "tls" (kernel TLS, which also works on the
bytes themselves) between its parts instead, then sends the second part plainly; the
kernel may have no tls module (ENOENT), the stream goes on either way.
One JSON line: {"sent", "received", "sent_sha", "received_sha", "zerocopy_sends",
"completed", "zerocopy_on"}; exits 1 when a completion is missing after 20 s.
"""

import hashlib
import random
import select
import socket
import struct
import threading
import time

from common import LOOPBACK, argument_parser, random_chunks, report

SO_ZEROCOPY = getattr(socket, "SO_ZEROCOPY", 60)
MSG_ZEROCOPY = getattr(socket, "MSG_ZEROCOPY", 0x4000000)
SO_EE_ORIGIN_ZEROCOPY = 5
RECVERR = {(socket.IPPROTO_IP, 11), (socket.IPPROTO_IPV6, 25)}  # IP_RECVERR, IPV6_RECVERR
TCP_ULP = getattr(socket, "TCP_ULP", 31)
MiB = 1 << 20


def zerocopy_on(sock):
    return sock.getsockopt(socket.SOL_SOCKET, SO_ZEROCOPY) != 0


class Sender:
    """Sends chunks, with MSG_ZEROCOPY when asked; counts the calls that queue a
    completion and collects the completions from the error queue."""

    def __init__(self, sock):
        self.sock, self.calls, self.completed = sock, 0, 0
        self.sha, self.sent = hashlib.sha256(), 0
        # The kernel may read a zerocopy send's buffer until its completion: each is kept
        # (and never reused) until then.
        self.in_flight = []

    def send(self, data, zerocopy):
        view = memoryview(data)
        while view:
            n = self.sock.send(view, MSG_ZEROCOPY if zerocopy else 0)
            if zerocopy and n > 0:
                self.calls += 1
                self.in_flight.append(data)
            view = view[n:]
        self.sha.update(data)
        self.sent += len(data)

    def collect(self, timeout_s=20):
        """Reads completions until every call has one; False when some never came."""
        deadline = time.monotonic() + timeout_s
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLERR)
        while self.completed < self.calls:
            try:
                _, ancdata, _, _ = self.sock.recvmsg(1, 1024, socket.MSG_ERRQUEUE |
                                                     socket.MSG_DONTWAIT)
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                poller.poll(min(left, 0.1) * 1000)
                continue
            for level, kind, data in ancdata:
                if (level, kind) not in RECVERR or len(data) < 16:
                    continue
                err, origin, _, _, _, lo, hi = struct.unpack_from("=IBBBBII", data)
                if err == 0 and origin == SO_EE_ORIGIN_ZEROCOPY:
                    self.completed += hi - lo + 1
        self.in_flight.clear()
        return True


def receive_all(sock):
    sha, total = hashlib.sha256(), 0
    while chunk := sock.recv(256 * 1024):
        sha.update(chunk)
        total += len(chunk)
    return total, sha.hexdigest()


def server(args, rng):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((args.bind, args.port))
    if args.mode == "listener_before":
        listener.setsockopt(socket.SOL_SOCKET, SO_ZEROCOPY, 1)
    listener.listen(4)
    if args.mode == "listener_after":
        listener.setsockopt(socket.SOL_SOCKET, SO_ZEROCOPY, 1)
    conn, _ = listener.accept()
    listener.close()
    zerocopy = args.mode.startswith("listener_")
    on = zerocopy_on(conn)
    sender, ok = Sender(conn), [True]

    def greet():
        for chunk in random_chunks(rng, rng.randrange(1, 3 * MiB), 256 * 1024):
            sender.send(chunk, zerocopy)
        ok[0] = sender.collect()

    thread = threading.Thread(target=greet)
    thread.start()
    received, received_sha = receive_all(conn)
    thread.join()
    conn.shutdown(socket.SHUT_WR)
    conn.close()
    return sender, received, received_sha, on, ok[0]


def client(args, rng):
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if args.mode == "before_connect":
        sock.setsockopt(socket.SOL_SOCKET, SO_ZEROCOPY, 1)
    sock.connect((args.host, args.port))
    sender = Sender(sock)
    for chunk in random_chunks(rng, rng.randrange(1, 2 * MiB), 256 * 1024):
        sender.send(chunk, False)
    if args.mode == "after_connect":
        sock.setsockopt(socket.SOL_SOCKET, SO_ZEROCOPY, 1)
    if args.mode == "ulp_after_connect":
        try:
            sock.setsockopt(socket.IPPROTO_TCP, TCP_ULP, b"tls")
        except FileNotFoundError:
            pass  # (no tls module in this kernel)
    zerocopy = args.mode in ("after_connect", "before_connect")
    for chunk in random_chunks(rng, rng.randrange(1, 4 * MiB), 256 * 1024):
        sender.send(chunk, zerocopy)
    ok = sender.collect()
    on = zerocopy_on(sock)
    sock.shutdown(socket.SHUT_WR)
    received, received_sha = receive_all(sock)
    sock.close()
    return sender, received, received_sha, on, ok


def main():
    parser = argument_parser(__doc__, role=True)
    parser.add_argument("--mode", required=True,
                        choices=["after_connect", "before_connect", "listener_after",
                                 "listener_before", "ulp_after_connect"])
    parser.add_argument("--seed", type=int, required=True)
    args = parser.parse_args()
    rng = random.Random(args.seed * 2 + (args.role == "server"))
    run = server if args.role == "server" else client
    sender, received, received_sha, on, ok = run(args, rng)
    report(sent=sender.sent, received=received, sent_sha=sender.sha.hexdigest(),
           received_sha=received_sha, zerocopy_sends=sender.calls, completed=sender.completed,
           zerocopy_on=on)
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
