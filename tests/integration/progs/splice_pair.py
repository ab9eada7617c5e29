"""splice(2) both ways over one connection, as proxies and file servers move bytes.

The client feeds --total random bytes (seeded, random write sizes) into a pipe from a
thread and splices them from the pipe into the socket, with random lengths per call; the
server splices them from the socket into a pipe that a thread drains and hashes. Then the
same the other way: the server splices a second payload into the socket, the client splices
it out into a pipe. Each side reports the SHA-256 of what it sent and of what it received;
the harness compares them. One JSON line: {"sent": n, "received": n, "sent_sha": hex,
"received_sha": hex}.
"""

import hashlib
import os
import random
import socket
import threading

from common import LOOPBACK, argument_parser, listen, random_size, report


def splice_in(sock, total, rng):
    """`total` random bytes through a pipe into `sock`; their SHA-256."""
    r, w = os.pipe()
    payload = rng.randbytes(total)

    def feed():
        view, at = memoryview(payload), 0
        while at < total:
            at += os.write(w, view[at:at + random_size(rng_feed, 128 * 1024)])
        os.close(w)

    rng_feed = random.Random(rng.random())
    thread = threading.Thread(target=feed)
    thread.start()
    moved = 0
    while moved < total:
        n = os.splice(r, sock.fileno(), random_size(rng, 256 * 1024))
        if n == 0:
            raise SystemExit(f"the pipe ended after {moved} of {total} bytes")
        moved += n
    thread.join()
    os.close(r)
    return hashlib.sha256(payload).hexdigest()


def splice_out(sock, total, rng):
    """`total` bytes from `sock` through a pipe; their SHA-256."""
    r, w = os.pipe()
    digest, got = hashlib.sha256(), [0]

    def drain():
        while True:
            chunk = os.read(r, 1 << 16)
            if not chunk:
                return
            digest.update(chunk)
            got[0] += len(chunk)

    thread = threading.Thread(target=drain)
    thread.start()
    moved = 0
    while moved < total:
        n = os.splice(sock.fileno(), w, min(total - moved, random_size(rng, 256 * 1024)))
        if n == 0:
            break
        moved += n
    os.close(w)
    thread.join()
    os.close(r)
    if got[0] != total:
        raise SystemExit(f"spliced out {got[0]} of {total} bytes")
    return digest.hexdigest()


def main():
    parser = argument_parser(__doc__, role=True)
    parser.add_argument("--total", type=int, default=8 << 20)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed if args.role == "client" else args.seed + 1)
    if args.role == "server":
        with listen(args.port) as listener:
            listener.listen(1)
            conn, _ = listener.accept()
            with conn:
                received = splice_out(conn, args.total, rng)
                sent = splice_in(conn, args.total, rng)
                conn.shutdown(socket.SHUT_WR)
                if conn.recv(1) != b"":
                    raise SystemExit("expected EOF")
    else:
        with socket.create_connection((LOOPBACK, args.port)) as conn:
            sent = splice_in(conn, args.total, rng)
            received = splice_out(conn, args.total, rng)
            conn.shutdown(socket.SHUT_WR)
            if conn.recv(1) != b"":
                raise SystemExit("expected EOF")
    report(sent=args.total, received=args.total, sent_sha=sent, received_sha=received)


if __name__ == "__main__":
    main()
