"""The in-band messages a Slipstream client that lost its registration sends and reads,
written out here independently of core/wire.cc, for progs/bulk.py --orphan-confirm.

Such a client confirmed a registration that the process accepting its connection never
had (another process sharing the listener holds it, or it expired): its first bytes on
TCP are a valid CONFIRM. The server must not hand those bytes to its application: it
takes the CONFIRM off the connection and answers DECLINE, after which the connection is
plain TCP whose first bytes are the client's stream from byte 0.
"""

import struct

from forge_register import MAGIC, VERSION, crc32c

TYPE_CONFIRM = 3
TYPE_DECLINE = 5
HEADER = 16


def confirm_message(nonce, ring_size):
    body = struct.pack("<QII", nonce, ring_size, 0)
    message = bytearray(MAGIC + struct.pack("<BBHII", VERSION, TYPE_CONFIRM, 0, HEADER + len(body),
                                            0) + body)
    message[12:16] = struct.pack("<I", crc32c(bytes(message)))
    return bytes(message)


def read_exactly(sock, n):
    data = b""
    while len(data) < n:
        more = sock.recv(n - len(data))
        if not more:
            break
        data += more
    return data


def read_decline(sock):
    """Reads one whole message off `sock`; True when it is a DECLINE (nothing more is read)."""
    header = read_exactly(sock, HEADER)
    if len(header) < HEADER or header[:4] != MAGIC:
        return False
    length = struct.unpack("<I", header[8:12])[0]
    if not HEADER <= length <= 256:
        return False
    read_exactly(sock, length - HEADER)
    return header[5] == TYPE_DECLINE
