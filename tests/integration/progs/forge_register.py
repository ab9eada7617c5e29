"""Forges a Slipstream rendezvous registration, as a local attacker could.

Registers the 4-tuple 127.0.0.1:SOURCE -> 127.0.0.1:PORT with a nonce of the forger's
choosing, a region of the right size and three socketpair ends, at the rendezvous of the
listener on PORT (its name, "slipstream-v3:<port>:<inode of the listening socket>", found
as a client would: the LISTEN socket on PORT in /proc/net/tcp). Prints {"registered":
true|false}.
The wire format is written out here independently of core/wire.cc, byte for byte.
"""

import os
import socket
import struct

from common import argument_parser, report, tcp_listeners

MAGIC = b"SLIP"
VERSION = 1
TYPE_REGISTER = 1
RING = 1 << 20
REGION = 4096 + 2 * RING


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def endpoint(port):
    return struct.pack("<BBH16s", 4, 0, port, socket.inet_aton("127.0.0.1"))


def register_message(source_port, server_port, nonce):
    body = (endpoint(source_port) + endpoint(server_port) +
            struct.pack("<QIIQ", nonce, RING, 4, REGION))
    header = MAGIC + struct.pack("<BBHII", VERSION, TYPE_REGISTER, 0, 16 + len(body), 0)
    message = bytearray(header + body)
    message[12:16] = struct.pack("<I", crc32c(bytes(message)))
    return bytes(message)


def send_register(port, source_port, nonce, fds, keep=False):
    """Sends REGISTER with `fds` (memfd, server A, server B, client B) to the listener's
    rendezvous on `port`, trying the names a client would; False if there is none. With
    `keep`, returns the rendezvous socket instead of True (the listener answers on it:
    ACCEPT when its process accepts the connection and takes the registration, DECLINE
    when it drops it)."""
    message = register_message(source_port, port, nonce)
    for _, _, inode in tcp_listeners(port):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.connect(f"\0slipstream-v3:{port}:{inode}")
        except OSError:
            sock.close()
            continue
        sock.sendmsg([message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("4i", *fds))])
        if keep:
            return sock
        sock.close()
        return True
    return False


def main():
    parser = argument_parser(__doc__)
    parser.add_argument("--nonce", type=lambda v: int(v, 0), default=0x1234)
    args = parser.parse_args()
    memfd = os.memfd_create("forged")
    os.ftruncate(memfd, REGION)
    pairs = [socket.socketpair(), socket.socketpair()]
    fds = [memfd, pairs[0][0].fileno(), pairs[0][1].fileno(), pairs[1][0].fileno()]
    report(registered=send_register(args.port, args.source_port, args.nonce, fds))


if __name__ == "__main__":
    main()
