"""sendfile(2) into a socket, as nginx serves files: the server sends --path with
socket.sendfile (os.sendfile underneath), from an offset and in pieces; the client hashes
what arrives until EOF. Each side reports one JSON line with its SHA-256.
"""

import hashlib
import os

from common import argument_parser, open_connection, report


def serve(args):
    sock = open_connection("server", args.port)
    size = os.path.getsize(args.path)
    with open(args.path, "rb") as f:
        # Two calls: the first half from offset 0, then the rest from an explicit offset,
        # covering both the count and the offset arguments.
        half = size // 2
        sent = sock.sendfile(f, 0, half)
        sent += sock.sendfile(f, half)
    sock.close()
    with open(args.path, "rb") as f:
        report(sent=sent, sha256=hashlib.sha256(f.read()).hexdigest())


def client(args):
    sock = open_connection("client", args.port)
    digest, total = hashlib.sha256(), 0
    while True:
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
