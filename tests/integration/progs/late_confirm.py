"""A Slipstream client held up between its TCP handshake and its CONFIRM, done by hand.

The storm bug (docs/COMPATIBILITY.md): a server whose accept() stopped waiting for a
registered client's CONFIRM (SLIP_HANDSHAKE_TIMEOUT_MS) handed the connection to its
application as plain TCP, and the client, held up a moment longer, then sent its CONFIRM,
which the application read as data. The region's claim word (shm/shm.h, Claim) now decides
it once: the end that moves it first from open wins.

  server: accepts one connection and reads it until EOF, a reset or 10 s; prints
          {"received": HEX, "count": N, "end": "eof" | "reset" | "timeout"}.
  client: builds a region and proxies as a Slipstream client does, registers the 4-tuple
          at the listener's rendezvous, connects, and then, by --mode:
    abandoned  sleeps past the server's timeout without deciding, then does what a
               Slipstream client does: claims the region (open -> confirmed) and sends its
               CONFIRM if that succeeds; if the server has already given up (abandoned),
               stays plain. Either way it then sends PLAIN (plain bytes; with a CONFIRM
               before them they are what the ring would have carried, never TCP's).
    committed  claims the region (confirmed) at once, sleeps past the server's timeout,
               then sends its CONFIRM: the server must still take it (and its ring), its
               application reading no byte of ours. Then it closes everything.
    verbs      (--nonce N, --source-port P) the TCP half of a verbs client whose rdma_cm
               request (with that nonce, from that port, HELLO sent) forge_cm made:
               connects, sleeps past the server's timeout, then sends its CONFIRM and
               PLAIN. The server has settled the connection as plain TCP meanwhile: the
               late CONFIRM must reset it, never be read as data. Prints {"sent_confirm",
               "end": "eof" | "reset" | "timeout"}.
          Prints {"registered": bool, "claim": the word before the client's own move,
          "sent_confirm": bool}.
The wire format and the region header are written out here independently of the C++.
"""

import fcntl
import mmap
import os
import socket
import struct
import time

from common import LOOPBACK, accept_one, argument_parser, report
from forge_register import MAGIC, VERSION, crc32c, send_register

PLAIN = b"plain bytes, ours to read\n"
RING = 1 << 20
REGION = 4096 + 2 * RING
REGION_MAGIC = 0x4D485350  # "PSHM"
CLAIM_AT = 16  # RegionHeader: magic, ring_size, nonce, then the claim word
OPEN, CONFIRMED, WITHDRAWN, ABANDONED = 0, 1, 2, 3
TYPE_CONFIRM = 3


def confirm_message(nonce):
    body = struct.pack("<QII", nonce, RING, 0)
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


def client(port, mode, delay):
    nonce = int.from_bytes(os.urandom(8), "little") | 1
    memfd = os.memfd_create("slipstream", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(memfd, REGION)
    fcntl.fcntl(memfd, fcntl.F_ADD_SEALS,
                fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    region = mmap.mmap(memfd, REGION)
    region[0:16] = struct.pack("<IIQ", REGION_MAGIC, RING, nonce)
    server_pair, client_pair = socket.socketpair(), socket.socketpair()
    fds = [memfd, server_pair[0].fileno(), server_pair[1].fileno(), client_pair[1].fileno()]

    def claim():
        return struct.unpack_from("<I", region, CLAIM_AT)[0]

    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.bind((LOOPBACK, 0))
    registered = send_register(port, tcp.getsockname()[1], nonce, fds)
    tcp.connect((LOOPBACK, port))
    before, sent_confirm = None, False
    if registered and mode == "committed":
        before = claim()
        struct.pack_into("<I", region, CLAIM_AT, CONFIRMED)  # the server has not decided yet
        time.sleep(delay)
        tcp.sendall(confirm_message(nonce))
        sent_confirm = True
        time.sleep(0.5)  # let the server take it before everything closes
    else:
        time.sleep(delay)
        if registered:
            before = claim()
            if before == OPEN:  # not atomic, but the server moves it only at its deadline
                struct.pack_into("<I", region, CLAIM_AT, CONFIRMED)
                tcp.sendall(confirm_message(nonce))
                sent_confirm = True
        tcp.sendall(PLAIN)
        tcp.shutdown(socket.SHUT_WR)
        tcp.settimeout(10)
        try:
            while tcp.recv(65536):
                pass
        except (ConnectionResetError, socket.timeout):
            pass
    tcp.close()
    report(registered=registered, claim=before, sent_confirm=sent_confirm)


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
    parser.add_argument("--mode", choices=["abandoned", "committed", "verbs"], default="abandoned")
    parser.add_argument("--delay", type=float, default=1.0, help="client: seconds held up")
    parser.add_argument("--nonce", type=int, help="verbs: the rdma_cm request's nonce")
    args = parser.parse_args()
    if args.role == "server":
        serve(args.port)
    elif args.mode == "verbs":
        verbs_client(args.port, args.source_port, args.nonce, args.delay)
    else:
        client(args.port, args.mode, args.delay)


if __name__ == "__main__":
    main()
