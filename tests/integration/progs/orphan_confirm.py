"""A plain client whose first bytes are a valid CONFIRM, with nothing registered for it.

That is what a Slipstream client looks like to a server that lost its registration: the
client believes it runs on a ring. The server must not hand those bytes to its application
as data: it declines (a DECLINE message, then it closes), and its application never sees
the connection. Connects to 127.0.0.1:PORT, sends the CONFIRM and a few bytes, reads until
EOF or a reset (the server closes with our bytes unread, so a reset is what TCP says;
bounded) and prints {"declined": bool, "ended": bool, "received": N}. The wire format is
written out here independently of core/wire.cc.
"""

import socket
import struct

from common import argument_parser, report
from forge_register import MAGIC, VERSION, crc32c

TYPE_CONFIRM = 3
TYPE_DECLINE = 5


def confirm_message(nonce, ring_size):
    body = struct.pack("<QII", nonce, ring_size, 0)
    message = bytearray(MAGIC + struct.pack("<BBHII", VERSION, TYPE_CONFIRM, 0, 16 + len(body), 0)
                        + body)
    message[12:16] = struct.pack("<I", crc32c(bytes(message)))
    return bytes(message)


def main():
    parser = argument_parser(__doc__)
    args = parser.parse_args()
    sock = socket.create_connection(("127.0.0.1", args.port), timeout=20)
    sock.sendall(confirm_message(0x5EED, 1 << 20) + b"not for the application")
    received = b""
    ended = False
    try:
        while True:
            data = sock.recv(4096)
            if not data:
                ended = True
                break
            received += data
    except ConnectionResetError:
        ended = True
    except socket.timeout:
        pass
    declined = len(received) >= 16 and received[:4] == MAGIC and received[5] == TYPE_DECLINE
    report(declined=declined, ended=ended, received=len(received))


if __name__ == "__main__":
    main()
