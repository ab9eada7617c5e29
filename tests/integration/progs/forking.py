"""A pre-forking server pattern: socketserver.ForkingTCPServer (accept in the parent, serve
in a forked child, the parent closes its copy), with --count clients one after another.

The child hashes everything its client sends and answers with the SHA-256, so the parent's
close of its copy must not end the connection the child serves. The client sends random
data in random-size writes, shuts down its write side, and checks the digest. Each side
reports one JSON line; the server's lists the digests it served.
"""

import hashlib
import os
import random
import socket
import socketserver

from common import LOOPBACK, argument_parser, connect, random_chunks, report


class HashHandler(socketserver.BaseRequestHandler):
    def handle(self):
        digest = hashlib.sha256()
        while True:
            data = self.request.recv(1 << 16)
            if not data:
                break
            digest.update(data)
        self.request.sendall(digest.hexdigest().encode())


class Server(socketserver.ForkingTCPServer):
    allow_reuse_address = True


def serve(args):
    with Server((LOOPBACK, args.port), HashHandler) as server:
        for _ in range(args.count):
            server.handle_request()
        server.server_close()
    while True:  # reap the children, whatever socketserver left
        try:
            os.wait()
        except ChildProcessError:
            break
    report(served=args.count)


def client(args):
    digests = []
    for i in range(args.count):
        sock = connect(args.port)
        digest = hashlib.sha256()
        for chunk in random_chunks(random.Random(args.seed + i), args.total, 1 << 20):
            digest.update(chunk)
            sock.sendall(chunk)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while len(answer) < 64:
            data = sock.recv(64 - len(answer))
            if not data:
                break
            answer += data
        sock.close()
        if answer.decode() != digest.hexdigest():
            raise SystemExit(f"connection {i}: server hashed {answer!r}, sent {digest.hexdigest()}")
        digests.append(answer.decode())
    report(connections=args.count, digests=digests)


def main():
    parser = argument_parser(__doc__, role=True)
    parser.add_argument("--count", type=int, default=3)
    parser.add_argument("--total", type=int, default=8 << 20)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    (serve if args.role == "server" else client)(args)


if __name__ == "__main__":
    main()
