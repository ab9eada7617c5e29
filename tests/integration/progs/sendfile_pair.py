"""sendfile(2) into a socket, as nginx serves files: the server sends --path with
socket.sendfile (os.sendfile underneath), from an offset and in pieces, then the last
third non-blocking from the file's own position (no offset: each call moves it), waiting
for room whenever the socket is full; the client hashes what arrives until EOF. Each side
reports one JSON line with its SHA-256.
"""

import hashlib
import os
import select
import time

from common import argument_parser, open_connection, report


def serve(args):
    sock = open_connection("server", args.port)
    size = os.path.getsize(args.path)
    with open(args.path, "rb") as f:
        # Two calls: the first third from offset 0, then the second from an explicit
        # offset, covering both the count and the offset arguments.
        third = size // 3
        sent = sock.sendfile(f, 0, third)
        sent += sock.sendfile(f, third, third)
        # The rest from the file's position: a call that finds the socket full must leave
        # the position where it was (EAGAIN, nothing sent), or the next skips bytes.
        f.seek(2 * third)
        sock.setblocking(False)
        while sent < size:
            try:
                n = os.sendfile(sock.fileno(), f.fileno(), None, 256 * 1024)
            except BlockingIOError:
                select.select([], [sock], [])
                continue
            if n == 0:
                break
            sent += n
        sock.setblocking(True)
    sock.close()
    with open(args.path, "rb") as f:
        report(sent=sent, sha256=hashlib.sha256(f.read()).hexdigest())


def client(args):
    sock = open_connection("client", args.port)
    digest, total = hashlib.sha256(), 0
    while True:
        if total >= 16 << 20 and total < 17 << 20:
            time.sleep(0.2)  # (slow for a moment in the last third: the sender finds it full)
        data = sock.recv(1 << 20)
        if not data:
            break
        digest.update(data)
        total += len(data)
    report(received=total, sha256=digest.hexdigest())


def main():
    parser = argument_parser(__doc__, role=True)
    parser.add_argument("--path")
    args = parser.parse_args()
    (serve if args.role == "server" else client)(args)


if __name__ == "__main__":
    main()
