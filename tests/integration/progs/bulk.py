"""Full-duplex bulk transfer with SHA-256 on both ends.

Both ends send `--total` random bytes (seeded) in random-size writes (1 B .. 1 MiB) from a
thread while the main thread receives until EOF, so data flows both ways at once. Each end
shuts down its write side when done and reports, as one JSON line,
{"sent", "sent_sha256", "received", "received_sha256"}; the harness compares one end's
"sent" with the other's "received".

The two ends use different socket calls, to cover what the shim interposes:
  client sends with send (partial writes), sendall and sendmsg (two buffers); reads with a
         buffered makefile("rb") (read1, readinto).
  server sends with a buffered makefile("wb") (small writes coalesced, large ones direct);
         reads with recv, recv_into and recvmsg.
"""

import hashlib
import itertools
import os
import random
import socket
import threading
import time

from common import (MiB, argument_parser, listen, open_connection, random_chunks, random_size,
                    report)
from orphan_confirm import confirm_message, read_decline

MAX_WRITE = MiB


class Digest:
    def __init__(self, dump=None):
        self.sha = hashlib.sha256()
        self.count = 0
        self.dump = open(dump, "wb") if dump else None  # the bytes themselves, for diagnosis

    def add(self, data):
        self.sha.update(data)
        self.count += len(data)
        if self.dump:
            self.dump.write(data)


# Writers: (sock, chunk) -> None, each writing the whole chunk.

def write_with_send(sock, chunk):
    view = memoryview(chunk)
    while view:
        view = view[sock.send(view):]


def write_with_sendall(sock, chunk):
    sock.sendall(chunk)


def write_with_sendmsg(sock, chunk):
    view = memoryview(chunk)
    while view:
        half = len(view) // 2
        view = view[sock.sendmsg([view[:half], view[half:]]):]


# Readers: (source, rng) -> bytes, empty at EOF.

def read_with_recv(sock, rng):
    return sock.recv(random_size(rng, MAX_WRITE))


def read_with_recv_into(sock, rng):
    buf = bytearray(random_size(rng, MAX_WRITE))
    return bytes(buf[:sock.recv_into(buf)])


def read_with_recvmsg(sock, rng):
    return sock.recvmsg(random_size(rng, MAX_WRITE))[0]


def read_with_read1(reader, rng):
    return reader.read1(random_size(rng, MAX_WRITE))


def read_with_readinto(reader, rng):
    buf = bytearray(random_size(rng, MAX_WRITE))
    return bytes(buf[:reader.readinto(buf)])


def send_all(sock, seed, total, digest, role):
    rng = random.Random(seed)
    if role == "client":
        writers = itertools.cycle([write_with_send, write_with_sendall, write_with_sendmsg])
        for chunk in random_chunks(rng, total, MAX_WRITE):
            next(writers)(sock, chunk)
            digest.add(chunk)
    else:
        with sock.makefile("wb") as out:
            for chunk in random_chunks(rng, total, MAX_WRITE):
                out.write(chunk)
                digest.add(chunk)
    sock.shutdown(socket.SHUT_WR)


def receive_all(sock, seed, digest, role):
    rng = random.Random(seed)
    if role == "client":
        source = sock.makefile("rb")
        readers = itertools.cycle([read_with_read1, read_with_readinto])
    else:
        source = sock
        readers = itertools.cycle([read_with_recv, read_with_recv_into, read_with_recvmsg])
    while data := next(readers)(source, rng):
        digest.add(data)
    if source is not sock:
        source.close()


def main():
    parser = argument_parser(__doc__, role=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--total", type=int, default=32 * MiB)
    parser.add_argument("--dump", help="write the bytes sent and received to DUMP.sent/.received")
    parser.add_argument("--hold", help="after the transfer, keep the connection open until the "
                        "file HOLD exists (at most 60 s)")
    parser.add_argument("--keep-listening", action="store_true",
                        help="server: keep the listener open until the end (others may "
                        "connect meanwhile; nobody accepts them)")
    parser.add_argument("--orphan-confirm", action="store_true",
                        help="client: first act as a Slipstream client whose registration was "
                        "lost (progs/orphan_confirm.py): send a CONFIRM, expect a DECLINE, then "
                        "carry the stream from byte 0")
    args = parser.parse_args()

    listener = None
    if args.keep_listening and args.role == "server":
        listener = listen(args.port, args.bind)
        sock, _ = listener.accept()
    else:
        sock = open_connection(args.role, args.port, args.source_port, args.bind, args.host)
    declined = None
    if args.orphan_confirm:
        sock.sendall(confirm_message(0x5EED, 1 << 20))
        sock.settimeout(20)
        declined = read_decline(sock)
        sock.settimeout(None)
    sent = Digest(args.dump and args.dump + ".sent")
    received = Digest(args.dump and args.dump + ".received")
    errors = []

    def sender():
        try:
            send_all(sock, args.seed, args.total, sent, args.role)
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=sender)
    thread.start()
    receive_all(sock, args.seed + 1, received, args.role)
    thread.join()
    if errors:
        raise errors[0]
    deadline = time.monotonic() + 60
    while args.hold and not os.path.exists(args.hold) and time.monotonic() < deadline:
        time.sleep(0.05)
    sock.close()
    if listener:
        listener.close()
    report(sent=sent.count, sent_sha256=sent.sha.hexdigest(),
           received=received.count, received_sha256=received.sha.hexdigest(), declined=declined)


if __name__ == "__main__":
    main()
