"""A verbs client's TCP half held up between its TCP handshake and its CONFIRM, done by hand.

The storm bug (docs/COMPATIBILITY.md): a server whose accept() stopped waiting for a
registered client's CONFIRM (SLIP_HANDSHAKE_TIMEOUT_MS) handed the connection to its
application as plain TCP, and the client, held up a moment longer, then sent its CONFIRM,
which the application read as data. Over verbs the CONFIRM still goes in band, so a late one
must reset the connection. (shm sends nothing in band any more: its late-accept case is
integration.late_accept.)

  server: accepts one connection and reads it until EOF, a reset or 10 s; prints
          {"received": HEX, "count": N, "end": "eof" | "reset" | "timeout"}.
  client: (--mode verbs, --nonce N, --source-port P) the TCP half of a verbs client whose
          rdma_cm request (with that nonce, from that port, HELLO sent) forge_cm made:
          connects, sleeps past the server's timeout, then sends its CONFIRM and PLAIN.
          The server has settled the connection as plain TCP meanwhile: the late CONFIRM
          must reset it, never be read as data. Prints {"sent_confirm", "end": "eof" |
          "reset" | "timeout"}.
The wire format is written out here independently of the C++.
"""

import socket
import struct
import time

from common import LOOPBACK, accept_one, argument_parser, report
from forge_register import MAGIC, VERSION, crc32c

PLAIN = b"plain bytes, ours to read\n"
RING = 1 << 20
TYPE_CONFIRM = 3


def confirm_message(nonce, ring=RING):
    body = struct.pack("<QII", nonce, ring, 0)
    message = bytearray(MAGIC + struct.pack("<BBHII", VERSION, TYPE_CONFIRM, 0, 16 + len(body), 0)
                        + body)
    message[12:16] = struct.pack("<I", crc32c(bytes(message)))
    return bytes(message)


def serve(port):
    conn = accept_one(port)
    conn.settimeout(10)
    received, end = b"", "timeout"
    try:
        while True:
            data = conn.recv(65536)
            if not data:
                end = "eof"
                break
            received += data
    except ConnectionResetError:
        end = "reset"
    except socket.timeout:
        pass
    report(received=received.hex(), count=len(received), end=end)


def verbs_client(port, source_port, nonce, delay):
    tcp = socket.create_connection((LOOPBACK, port), source_address=(LOOPBACK, source_port))
    time.sleep(delay)
    end = "eof"
    try:
        tcp.sendall(confirm_message(nonce) + PLAIN)
        tcp.shutdown(socket.SHUT_WR)
        tcp.settimeout(10)
        while tcp.recv(65536):
            pass
    except (ConnectionResetError, BrokenPipeError):
        end = "reset"
    except socket.timeout:
        end = "timeout"
    tcp.close()
    report(sent_confirm=True, end=end)


def main():
    parser = argument_parser(__doc__, role=True)
    parser.add_argument("--mode", choices=["verbs"], default="verbs")
    parser.add_argument("--delay", type=float, default=1.0, help="client: seconds held up")
    parser.add_argument("--nonce", type=int, help="verbs: the rdma_cm request's nonce")
    args = parser.parse_args()
    if args.role == "server":
        serve(args.port)
    else:
        verbs_client(args.port, args.source_port, args.nonce, args.delay)


if __name__ == "__main__":
    main()
