"""Sends hostile datagrams to a fabric listener's UDP twin, as any host could.

The listener on 127.0.0.1:PORT runs under slip-run with SLIP_TRANSPORTS=fabric,...; its twin
answers REQs on UDP 127.0.0.1:PORT (fabric/stream_wire.h). In order:
  1. garbage: a short datagram, 144 zero bytes, a REQ with a wrong magic, a REQ whose
     notes' form is neither 4 nor 8, one whose endpoints' type is neither 1 (reliable
     datagram) nor 2 (connected): no answer may come;
  2. a well-formed REQ whose client address is not its sender's (127.0.0.2, sent from
     127.0.0.1): no answer may come;
  3. a well-formed REQ from the right address for the 4-tuple 127.0.0.1:SOURCE -> PORT, with
     a nonce and an endpoint address of the forger's (none with --endpoints msg, as a
     client with connected endpoints sends): the listener must answer it (REP, or
     REFUSE where the provider rejects the address), and the same REQ again gets the same
     answer (a REP lost on the way is sent again).
Prints {"silent": N, "answers": [TYPE, TYPE]} (TYPE 2: REP, 3: REFUSE).
The wire format is written out here independently of fabric/stream_wire.cc, byte for byte.
"""

import socket
import struct

from common import argument_parser, report

MAGIC = 0x53464C53
VERSION = 1
REQ = 1
WAIT_S = 0.3


def endpoint(address, port):
    return struct.pack("<BBH16s", 4, 0, port, socket.inet_aton(address))


def req(client, server_port, nonce, endpoints, magic=MAGIC, note_bytes=8, endpoints_byte=None):
    # The forger's "endpoint address": what the tcp provider takes (a sockaddr_in), here
    # the discard port on loopback; shm rejects it as a region name it cannot open. A
    # client with connected endpoints has none.
    address = struct.pack("<H", socket.AF_INET) + struct.pack(">H", 9) + \
        socket.inet_aton("127.0.0.1") + bytes(8)
    if endpoints == "msg":
        address = b""
    if endpoints_byte is None:
        endpoints_byte = 2 if endpoints == "msg" else 1
    message = struct.pack("<IBBBBQ", magic, VERSION, REQ, 20, len(address), nonce)
    message += endpoint(*client) + endpoint("127.0.0.1", server_port)
    message += struct.pack("<QQIBBH", 0x1234567890ABCDEF, 0x7F0000000000, 0x000ABC, note_bytes,
                           endpoints_byte, 0)
    message += address + bytes(64 - len(address))
    assert len(message) == 144
    return message


def answer(sock):
    """The type of the listener's answer, or None when none came within WAIT_S."""
    sock.settimeout(WAIT_S)
    try:
        data = sock.recv(1024)
    except (socket.timeout, ConnectionRefusedError):
        return None
    if len(data) != 144 or struct.unpack_from("<I", data)[0] != MAGIC:
        return "malformed"
    return data[5]


def main():
    parser = argument_parser(__doc__)
    parser.add_argument("--endpoints", choices=["rdm", "msg"], default="rdm")
    args = parser.parse_args()
    kind = args.endpoints
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.connect(("127.0.0.1", args.port))
    hostile = [
        b"x" * 10,
        bytes(144),
        req(("127.0.0.1", args.source_port), args.port, 1, kind, magic=0x12345678),
        req(("127.0.0.1", args.source_port), args.port, 1, kind, note_bytes=5),
        req(("127.0.0.1", args.source_port), args.port, 1, kind, endpoints_byte=3),
        req(("127.0.0.2", args.source_port), args.port, 2, kind),
    ]
    silent = 0
    for message in hostile:
        sock.send(message)
        got = answer(sock)
        if got is None:
            silent += 1
    forged = req(("127.0.0.1", args.source_port), args.port, 0xF0F0F0F0F0F0F0F0, kind)
    answers = []
    for _ in range(2):
        sock.send(forged)
        answers.append(answer(sock))
    report(silent=silent, hostile=len(hostile), answers=answers)


if __name__ == "__main__":
    main()
