"""A fabric client whose TCP connection comes after the listener dropped its request.

The listener keeps an answered request only while the kernel shows its TCP connection
(core/pending_requests.h: after a grace of 1 s, it drops the others), and a request can
also be given up for room. A real client's SYN can be that slow (lost once, retransmitted
a second later) and its CONFIRM follows: it must never reach the server's application as
data. This plays such a client by hand, the wire format written out independently of the
C++: a REQ for 127.0.0.1:SOURCE -> PORT (progs/fabric_req_flood.py writes it), its REP
awaited, then --wait s of silence, then the TCP connection from SOURCE, its CONFIRM (the
REQ's nonce, the REP's ring size) and PLAIN bytes; it then reads what the server sends
for 3 s. Prints {"rep", "confirmed", "first_type" (the type of the first Slipstream message
that came back, or null), "echoed_confirm" (the CONFIRM's bytes came back: the server's
application read them), "received"}.

  server mode: accepts one connection and reads it until EOF, a reset or 10 s; prints
  {"received": HEX, "count", "end"} (what the application read).
"""

import argparse
import random
import socket
import struct
import sys
import time
from pathlib import Path

from fabric_req_flood import LISTENER, MAGIC as FABRIC_MAGIC, req

# The shm CONFIRM, its checksum and the reading server: the integration suite's own.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "integration" / "progs"))

from common import report  # noqa: E402
from forge_register import MAGIC as SLIP_MAGIC  # noqa: E402
from late_confirm import PLAIN, confirm_message, serve  # noqa: E402


def client(args):
    rng = random.Random(args.seed)
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.bind((LISTENER, 0))
    source = tcp.getsockname()[1]
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind((LISTENER, 0))
    udp.connect((LISTENER, args.port))
    udp.settimeout(1.0)
    nonce = rng.getrandbits(64) | 1
    rep = None
    for _ in range(3):
        udp.send(req((LISTENER, source), args.port, nonce, args.endpoints, 20, rng))
        try:
            data = udp.recv(1024)
        except (socket.timeout, ConnectionRefusedError):
            continue
        if len(data) == 144 and struct.unpack_from("<I", data)[0] == FABRIC_MAGIC and \
                struct.unpack_from("<Q", data, 8)[0] == nonce:
            rep = data
            break
    if rep is None or rep[5] != 2:
        report(rep=False, confirmed=False, first_type=None, echoed_confirm=False, received=0)
        return
    ring = 1 << rep[6]
    time.sleep(args.wait)
    tcp.connect((LISTENER, args.port))
    confirm = confirm_message(nonce, ring)
    tcp.sendall(confirm + PLAIN)
    tcp.settimeout(0.2)
    got = b""
    until = time.monotonic() + 3
    while time.monotonic() < until:
        try:
            data = tcp.recv(65536)
        except socket.timeout:
            continue
        except ConnectionResetError:
            break
        if not data:
            break
        got += data
    first = got[5] if len(got) >= 16 and got[:4] == SLIP_MAGIC else None
    report(rep=True, confirmed=True, first_type=first, echoed_confirm=confirm in got,
           received=len(got))


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("role", choices=["server", "client"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--endpoints", choices=["msg", "rdm"], default="msg")
    parser.add_argument("--wait", type=float, default=1.6)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    serve(args.port) if args.role == "server" else client(args)


if __name__ == "__main__":
    main()
