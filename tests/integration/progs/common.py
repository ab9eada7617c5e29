"""Helpers shared by the test programs in this directory (imported from their own folder)."""

import argparse
import json
import math
import os
import selectors
import socket
import sys
import time

LOOPBACK = os.environ.get("SLIP_TEST_HOST", "127.0.0.1")  # see harness.py
MiB = 1 << 20

SELECTORS = {"poll": selectors.PollSelector, "select": selectors.SelectSelector}


def random_size(rng, max_size):
    """A size in 1..max_size, log-uniform: as many tiny writes as huge ones."""
    return min(max_size, int(2 ** rng.uniform(0, math.log2(max_size) + 1)))


def random_chunks(rng, total, max_size):
    """Yields random bytes in chunks of random_size(), `total` bytes in all."""
    left = total
    while left:
        size = min(left, random_size(rng, max_size))
        left -= size
        yield rng.randbytes(size)


def bound(port, address=LOOPBACK):
    """A TCP socket bound to `address` (IPv4, or IPv6 dual-stack when the address has a
    colon), not listening yet."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.bind((address, port))
    return sock


def listen(port, address=LOOPBACK):
    """A listener on `address` (as bound())."""
    sock = bound(port, address)
    sock.listen(16)
    return sock


def accept_one(port, address=LOOPBACK):
    """Accepts one connection on `port` and closes the listener. IT_ACCEPT_DELAY_S (a test's
    knob) waits that long between listen and accept, so that a client's first bytes are
    there when the connection is accepted."""
    with listen(port, address) as listener:
        time.sleep(float(os.environ.get("IT_ACCEPT_DELAY_S", "0")))
        conn, _ = listener.accept()
    return conn


def connect(port, source_port=0, host=LOOPBACK):
    source = (host, source_port) if source_port else None
    return socket.create_connection((host, port), source_address=source)


def open_connection(role, port, source_port=0, bind=LOOPBACK, host=LOOPBACK):
    """The server accepts one connection on `port` at `bind`; the client connects to it at
    `host` (from `source_port` when given)."""
    return accept_one(port, bind) if role == "server" else connect(port, source_port, host)


def _proc_address(hex_address):
    """The address of a /proc/net/tcp{,6} "ADDR:PORT" field (each 32-bit word in host
    order, little-endian here): text, as inet_ntop writes it."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return socket.inet_ntop(socket.AF_INET if len(words) == 4 else socket.AF_INET6, words)


def tcp_listeners(port):
    """The TCP listening sockets on `port`: [(address, uid, inode)], from /proc/net/tcp and
    /proc/net/tcp6 (state 0A)."""
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != "0A":
                continue
            address, port_hex = fields[1].rsplit(":", 1)
            if int(port_hex, 16) == port:
                out.append((_proc_address(address), int(fields[7]), int(fields[9])))
    return out


def argument_parser(doc, role=False, impl=False):
    """The options the programs here share: --port, and where asked the positional role
    (server or client) and --impl (asyncio, poll or select)."""
    parser = argparse.ArgumentParser(description=doc)
    if role:
        parser.add_argument("role", choices=["server", "client"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--source-port", type=int, default=0)
    parser.add_argument("--bind", default=LOOPBACK, help="server: address to listen on")
    parser.add_argument("--host", default=LOOPBACK, help="client: address to connect to")
    if impl:
        parser.add_argument("--impl", choices=["asyncio", *SELECTORS], required=True)
    return parser


def recv_exact(sock, n):
    """Exactly n bytes from a blocking socket; ConnectionError on an early EOF."""
    chunks, left = [], n
    while left:
        chunk = sock.recv(min(left, 1 << 16))
        if not chunk:
            raise ConnectionError(f"EOF with {left} of {n} bytes to go")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def report(**fields):
    """The report line the harness reads: one JSON object on the last line of stdout."""
    print(json.dumps(fields), flush=True)


def mark(marker):
    """A progress line the harness waits for (e.g. before it kills the peer)."""
    print(marker, flush=True)


class Progress:
    """Counts bytes; prints `marker` once when the count first reaches `threshold`."""

    def __init__(self, marker, threshold):
        self.marker = marker
        self.threshold = threshold
        self.count = 0

    def add(self, n):
        before = self.count
        self.count += n
        if before < self.threshold <= self.count:
            mark(self.marker)


def fail(message):
    print(f"{sys.argv[0]}: {message}", file=sys.stderr, flush=True)
    sys.exit(1)
