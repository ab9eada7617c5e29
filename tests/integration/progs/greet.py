"""A server that sends each of its connections, one after the other, seeded random bytes.

server --totals A,B,...  accepts len(TOTALS) connections in turn; to the i-th it sends
                         TOTALS[i] random bytes of seed i in send()s of random sizes up to
                         128 KiB (common.random_chunks), shuts its writing side down and
                         reads until EOF (or a reset). Reports {"sent_sha256": [...],
                         "seconds": [...]} (per connection).
client                   receives until EOF, then closes. Reports {"received",
                         "received_sha256"}.
"""

import hashlib
import random
import socket
import time

from common import argument_parser, listen, open_connection, random_chunks, report

MAX_SEND = 128 * 1024


def serve(listener, seed, total):
    sock, _ = listener.accept()
    started = time.monotonic()
    sha = hashlib.sha256()
    for piece in random_chunks(random.Random(seed), total, MAX_SEND):
        sock.sendall(piece)
        sha.update(piece)
    sock.shutdown(socket.SHUT_WR)
    try:
        while sock.recv(1 << 16):
            pass
    except ConnectionResetError:
        pass  # (a peer gone without its end of the stream: reset, as TCP says)
    sock.close()
    return sha.hexdigest(), round(time.monotonic() - started, 3)


def main():
    parser = argument_parser(__doc__, role=True)
    parser.add_argument("--totals", default="1048576")
    args = parser.parse_args()
    if args.role == "server":
        listener = listen(args.port, args.bind)
        served = [serve(listener, i, int(total))
                  for i, total in enumerate(args.totals.split(","))]
        report(sent_sha256=[sha for sha, _ in served], seconds=[s for _, s in served])
        return
    sock = open_connection("client", args.port, args.source_port, args.bind, args.host)
    sha, count = hashlib.sha256(), 0
    while data := sock.recv(1 << 20):
        sha.update(data)
        count += len(data)
    sock.close()
    report(received=count, received_sha256=sha.hexdigest())


if __name__ == "__main__":
    main()
