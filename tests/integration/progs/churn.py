"""Short connections that the client closes first, one after another (a connection per
request, as a PostgreSQL client under pgbench -C or an HTTP/1.0 client does): the TIME_WAIT
state stays at the client, on its ports.

  server: on PORT, one connection at a time: reads an 8-byte header (payload size, seed)
          and the payload, answers the SHA-256 of what it read and a reply of seeded random
          bytes (size from the seed), then waits for the client's end and closes. Runs
          until SIGTERM; prints {"connections": N} at exit.
  client: --count connections; each sends a random payload, checks the digest and every
          byte of the reply, and closes before the server does. A connect() that finds no
          free 4-tuple (EADDRNOTAVAIL: every port of a small range in TIME_WAIT not yet
          reusable) is tried again after a pause, as a client of a busy host would.
          Prints {"connections": N, "retries": R, "rates": [...]}; with --duration S, as
          many connections as S seconds allow, and the rate of every --window seconds.
"""

import errno
import hashlib
import random
import signal
import socket
import struct
import time

from common import LOOPBACK, argument_parser, fail, recv_exact, report

MAX_PAYLOAD = 16 * 1024


def reply_size(seed, most=MAX_PAYLOAD):
    return (seed * 7919) % most


def serve(port, host, most):
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(128)
    served = 0
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    listener.settimeout(0.2)
    while not stop:
        try:
            conn, _ = listener.accept()
        except (socket.timeout, InterruptedError):
            continue
        conn.settimeout(None)
        with conn:
            size, seed = struct.unpack("!II", recv_exact(conn, 8))
            digest = hashlib.sha256(recv_exact(conn, size)).digest()
            conn.sendall(digest + random.Random(seed).randbytes(reply_size(seed, most)))
            if conn.recv(1) != b"":
                fail("the client sent more than its request")
        served += 1
    report(connections=served)


def client(port, host, count, seed, duration=0.0, window=5.0, most=MAX_PAYLOAD):
    """`duration` > 0: as many connections as fit in that many seconds instead of `count`,
    with the rate of each `window` seconds in the report (a benchmark's use)."""
    rng = random.Random(seed)
    retries = made = 0
    start = last = time.monotonic()
    rates, in_window = [], 0
    while (made < count) if duration <= 0 else (time.monotonic() - start < duration):
        size, conn_seed = rng.randrange(1, most + 1), rng.randrange(1, 1 << 31)
        payload = rng.randbytes(size)
        while True:
            sock = socket.socket()
            try:
                sock.connect((host, port))
                break
            except OSError as e:
                sock.close()
                if e.errno != errno.EADDRNOTAVAIL:
                    raise
                retries += 1
                time.sleep(0.05)
        with sock:
            sock.sendall(struct.pack("!II", size, conn_seed) + payload)
            digest = recv_exact(sock, 32)
            if digest != hashlib.sha256(payload).digest():
                fail("the server read other bytes than the client sent")
            expected = random.Random(conn_seed).randbytes(reply_size(conn_seed, most))
            if recv_exact(sock, len(expected)) != expected:
                fail("the reply differs from the server's")
        made += 1
        in_window += 1
        now = time.monotonic()
        if now - last >= window:
            rates.append(round(in_window / (now - last)))
            in_window, last = 0, now
    report(connections=made, retries=retries, rates=rates)


def main():
    parser = argument_parser(__doc__, role=True)
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--duration", type=float, default=0.0)
    parser.add_argument("--window", type=float, default=5.0)
    parser.add_argument("--max-payload", type=int, default=MAX_PAYLOAD,
                        help="largest request and reply (both ends must agree)")
    args = parser.parse_args()
    if args.role == "server":
        serve(args.port, args.bind, args.max_payload)
    else:
        client(args.port, args.host, args.count, args.seed, args.duration, args.window,
               args.max_payload)


if __name__ == "__main__":
    main()
