"""One end of a connection whose peer the harness kills with SIGKILL.

--do send  send random data until the send fails; prints READY after the first MiB.
           The send uses MSG_NOSIGNAL (and Python ignores SIGPIPE anyway), so a dead peer
           shows as EPIPE or ECONNRESET. Reports {"result": "EPIPE"|"ECONNRESET", ...}.
--do recv  receive until EOF or ECONNRESET; prints READY after the first MiB.
           Reports {"result": "eof"|"ECONNRESET", ...}.
--do wait  receive the peer's 5-byte hello, print READY, then block in recv with nothing in
           flight. Reports {"result": "eof"|"ECONNRESET"}.
--do idle  send the 5-byte hello, then sleep (the harness kills this one).
Exits 1 on any other outcome (data after hello, no failure after LIMIT_S).
"""

import errno
import random
import socket
import time

from common import MiB, Progress, argument_parser, fail, mark, open_connection, report

HELLO = b"hello"
LIMIT_S = 60  # a peer that never fails: give up (the harness' deadline is much shorter)


def error_name(e):
    names = {errno.EPIPE: "EPIPE", errno.ECONNRESET: "ECONNRESET"}
    if e.errno not in names:
        fail(f"unexpected error {e!r}")
    return names[e.errno]


def do_send(sock):
    chunk = random.Random(7).randbytes(256 * 1024)
    sent = Progress("READY", MiB)
    deadline = time.monotonic() + LIMIT_S
    try:
        while time.monotonic() < deadline:
            sent.add(sock.send(chunk, socket.MSG_NOSIGNAL))
    except OSError as e:
        return report(result=error_name(e), sent=sent.count)
    fail(f"sent {sent.count} B in {LIMIT_S} s and the send never failed")


def do_recv(sock):
    received = Progress("READY", MiB)
    try:
        while data := sock.recv(64 * 1024):
            received.add(len(data))
    except OSError as e:
        return report(result=error_name(e), received=received.count)
    report(result="eof", received=received.count)


def do_wait(sock):
    hello = b""
    while len(hello) < len(HELLO):
        if not (data := sock.recv(len(HELLO) - len(hello))):
            fail(f"EOF after {hello!r}, expected {HELLO!r}")
        hello += data
    if hello != HELLO:
        fail(f"got {hello!r}, expected {HELLO!r}")
    mark("READY")
    try:
        data = sock.recv(1)
    except OSError as e:
        return report(result=error_name(e))
    if data:
        fail(f"unexpected data {data!r} after hello")
    report(result="eof")


def do_idle(sock):
    sock.sendall(HELLO)
    time.sleep(LIMIT_S)


ACTIONS = {"send": do_send, "recv": do_recv, "wait": do_wait, "idle": do_idle}


def main():
    parser = argument_parser(__doc__, role=True)
    parser.add_argument("--do", choices=ACTIONS, required=True)
    args = parser.parse_args()
    sock = open_connection(args.role, args.port)
    ACTIONS[args.do](sock)
    sock.close()


if __name__ == "__main__":
    main()
