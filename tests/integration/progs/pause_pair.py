"""A connection that pauses mid-stream: the client sends HEAD, prints READY, waits until
the file --release exists, sends TAIL and closes; the server reads until EOF. Both report
what they sent or received ({"sent"/"received": hex}), so a byte that neither side wrote
shows (tests/integration/cases.py fabric_forged_notes). The server's listener stays open."""

import os
import socket
import time

from common import argument_parser, connect, listen, mark, report

HEAD = b"hello, "
TAIL = b"world"


def main():
    parser = argument_parser(__doc__, role=True)
    parser.add_argument("--release", required=True)
    args = parser.parse_args()
    if args.role == "client":
        sock = connect(args.port)
        sock.sendall(HEAD)
        mark("READY")
        deadline = time.monotonic() + 60
        while not os.path.exists(args.release) and time.monotonic() < deadline:
            time.sleep(0.02)
        sock.sendall(TAIL)
        sock.shutdown(socket.SHUT_WR)
        while sock.recv(4096):
            pass
        report(sent=(HEAD + TAIL).hex())
        return
    # The listener stays open (its UDP twin with it, for whoever asks meanwhile).
    listener = listen(args.port)
    sock, _ = listener.accept()
    received = b""
    while True:
        data = sock.recv(1 << 16)
        if not data:
            break
        received += data
    sock.close()
    listener.close()
    report(received=received.hex())


if __name__ == "__main__":
    main()
