"""A Slipstream shm client written by hand: what a local attacker (or a broken peer) can send
a Slipstream server on this host, one misbehaviour per --mode.

The wire format and the region layout are written out here from the protocol description,
independently of core/wire.cc and shm/region.h, so that a change there cannot quietly change
what this attacker sends. It speaks protocol v3:

  - One rendezvous per TCP listening socket: "\\0slipstream-v3:<port>:<inode>", the inode
    being the listening socket's (the inode column of its LISTEN line in /proc/net/tcp or
    /proc/net/tcp6). We try the listeners of --port whose address the SYN can reach (exact
    address first, then the wildcards) and use the first rendezvous whose SO_PEERCRED uid
    is the listener's uid, as the library's client does.
  - REGISTER (memfd region, server A, server B, client B as SCM_RIGHTS), then the TCP
    connection from the registered 4-tuple. The listener answers nothing yet (it declines
    at once only when it refuses: DECLINE type 5 with a reason); when the server process
    accept()s the connection it claims the region (claim word 0 -> 1, taken) and says
    ACCEPT (type 4) on the rendezvous connection; when it drops the registration it sets
    the claim word 0 -> 3 (abandoned) and says DECLINE (reason 2, no_registration).
  - Nothing of ours goes in band: no CONFIRM, ever. We are accelerated iff the claim word
    says 1 (taken, by the server). When it is not taken within --answer-timeout after the
    SYN, or the listener declined, we withdraw (claim 0 -> 2: read, then write if still 0;
    a Python client cannot compare-and-exchange) and the connection is plain TCP from
    byte 0 (what we had written into our ring goes over TCP).

Modes (the server is at --host:--port; every mode prints one JSON report as its last line,
except where it dies on purpose):
  register        REGISTER (valid region and proxies) and nothing else: no TCP connection.
                  Waits up to --answer-timeout for an answer (there should be none: a
                  registration is answered when its connection is accepted or dropped);
                  hold --hold s
  connect         REGISTER, TCP connect from the registered 4-tuple, wait up to
                  --answer-timeout for the server to take it (ACCEPT, claim 1), and then do
                  nothing at all: never read or write the rings or TCP, never withdraw
                  (--probe N: when not taken after all, the probe of claim); hold --hold s
  claim           as connect, but we set the claim word to 1 ourselves right after REGISTER,
                  before the TCP connection exists (before the server could take it): its
                  claim then fails, and it must treat the connection as plain TCP (and say
                  DECLINE). With --probe N, after the answer, N random bytes go over TCP and
                  the echo is read back (the server as plain: its application echoes them).
                  Never withdraws; hold --hold s
  peer            full handshake, then act as the peer through the rings: send --bytes random
                  bytes (publish `produced`, tokens to the server's B when its reader waits),
                  read the echo, compare, EOF. Plain TCP (same exchange) when not taken.
  scribble        full handshake and a running exchange while a child process writes random
                  bytes over the control page (header, cursors, eof/reader_closed, wake words)
                  and the rings, for --duration s; then closes
  ring_size_race  a child process flips header.ring_size between the registered value and
                  --huge in a tight loop from before REGISTER until the end (--realtime:
                  at SCHED_FIFO priority, so that it runs when the server looks; the race
                  is the same without, only won less often); once the server took the
                  connection we publish a huge `produced` (the server reads far) and a
                  token. Repeated --attempts times (each a new connection) or until the
                  server is gone.
  bad_proxies     server A and server B taken from two different socketpairs (and the other
                  end of A's pair passed as client B, so the server holds both ends of it);
                  a little data published into the ring right after REGISTER (before the
                  server could take it: no token), TCP connect; taken: wait until the server
                  read it (or dropped the connection); not taken (a listener that checks the
                  proxies declines at once): the data goes over TCP. Print {"sent",
                  "sent_sha256", "consumed", ...}, then SIGKILL ourselves
  stray_token     handshake with a little data published before the server took it (no
                  token ever counted), wait until the server read it, then write --stray
                  bytes into the server's B without publishing anything; print STRAY and
                  hold --hold s

Other programs here import this file for the encoding and the rendezvous (flood.py).
"""

import argparse
import errno
import fcntl
import hashlib
import json
import mmap
import os
import random
import select
import signal
import socket
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "integration" / "progs"))

from common import tcp_listeners  # noqa: E402

# ------------------------------------------------------------------------------ wire format

MAGIC = b"SLIP"
WIRE_VERSION = 1
REGISTER, CANCEL, CONFIRM, ACCEPT, DECLINE = 1, 2, 3, 4, 5
HEADER_SIZE = 16
BODY_SIZE = {REGISTER: 2 * 20 + 8 + 4 + 4 + 8, CANCEL: 2 * 20 + 8, CONFIRM: 16, ACCEPT: 8,
             DECLINE: 12}


def _crc_table():
    table = []
    for n in range(256):
        crc = n
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
        table.append(crc)
    return table


_CRC_TABLE = _crc_table()


def crc32c(data):
    """CRC-32C (Castagnoli), reflected, init and final xor 0xFFFFFFFF."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = (crc >> 8) ^ _CRC_TABLE[(crc ^ byte) & 0xFF]
    return crc ^ 0xFFFFFFFF


def message(mtype, body, version=WIRE_VERSION, flags=0, length=None, crc=None):
    """Header (magic, version, type, flags, length, crc32c over the message with the crc
    field zero) + body. `length`/`crc` override the computed values (malformed messages)."""
    size = HEADER_SIZE + len(body) if length is None else length
    out = bytearray(MAGIC + struct.pack("<BBHII", version, mtype, flags, size, 0) + body)
    out[12:16] = struct.pack("<I", crc32c(bytes(out)) if crc is None else crc)
    return bytes(out)


def endpoint(host, port):
    """family u8 (4 or 6), pad u8, port u16, 16 address bytes (IPv4 in the first 4)."""
    if ":" in host:
        return struct.pack("<BBH16s", 6, 0, port, socket.inet_pton(socket.AF_INET6, host))
    return struct.pack("<BBH16s", 4, 0, port, socket.inet_aton(host))


def register_message(client, server, nonce, ring_size, region_size, fd_count=4):
    """client, server: (host, port)."""
    body = (endpoint(*client) + endpoint(*server) +
            struct.pack("<QIIQ", nonce, ring_size, fd_count, region_size))
    return message(REGISTER, body)


def parse(data):
    """(type, body) of one whole valid message, or None."""
    if len(data) < HEADER_SIZE or data[:4] != MAGIC:
        return None
    version, mtype, flags, length, crc = struct.unpack_from("<BBHII", data, 4)
    if version != WIRE_VERSION or length != len(data) or flags != 0:
        return None
    if BODY_SIZE.get(mtype) != length - HEADER_SIZE:
        return None
    if crc32c(data[:12] + b"\0\0\0\0" + data[16:]) != crc:
        return None
    return mtype, data[HEADER_SIZE:]


DECLINE_REASONS = {0: "unspecified", 1: "nonce_mismatch", 2: "no_registration",
                   3: "bad_region", 4: "resources", 5: "policy", 6: "version", 7: "busy",
                   8: "descriptors"}


def rendezvous_names(port, host):
    """[(abstract name, listener uid, listener inode)] in the order a client tries them: the
    listeners of `port` a SYN to `host` can reach, exact address first (for IPv4 also its
    v4-mapped form), then the family's wildcard, then the dual-stack wildcard "::"."""
    v6 = ":" in host
    exact = {host} if v6 else {host, f"::ffff:{host}"}
    wildcards = ["::"] if v6 else ["0.0.0.0", "::"]
    ranked = []
    for address, uid, inode in tcp_listeners(port):
        if address in exact:
            rank = 0
        elif address in wildcards:
            rank = 1 + wildcards.index(address)
        else:
            continue  # bound to another address: no SYN to `host` reaches it
        ranked.append((rank, f"\0slipstream-v3:{port}:{inode}", uid, inode))
    return [entry[1:] for entry in sorted(ranked)]


def peer_uid(sock):
    pid, uid, gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                        struct.calcsize("3i")))
    return uid


def find_rendezvous(port, host, nonblocking=False, names=None, check_owner=True):
    """Connects to the rendezvous of the first listener of `port` (rendezvous_names, or
    `names` as it returned them) that accepts and, with `check_owner`, is held by the
    listener's uid: (socket, inode, name), or (None, None, why) where why is "none" (no
    rendezvous), "busy" (a full backlog: EAGAIN) or "untrusted" (only names held by another
    uid than their listener's)."""
    why = "none"
    for name, uid, inode in (rendezvous_names(port, host) if names is None else names):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        if nonblocking:
            sock.setblocking(False)
        try:
            sock.connect(name)
        except BlockingIOError:
            sock.close()
            return None, None, "busy"
        except OSError as e:
            sock.close()
            if e.errno == errno.EAGAIN:
                return None, None, "busy"
            continue
        if check_owner and peer_uid(sock) != uid:
            sock.close()
            why = "untrusted"
            continue
        sock.setblocking(True)
        return sock, inode, name
    return None, None, why


def send_with_fds(sock, data, fds):
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))] \
        if fds else []
    return sock.sendmsg([data], ancillary)


def read_answer(sock, timeout):
    """The listener's answer on a rendezvous connection: ("accept", nonce),
    ("decline", nonce, reason), ("eof",), ("error", errno), ("junk", hex) or None (nothing
    within timeout)."""
    # poll, not select: a flood holds descriptors far above select's 1024.
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    if not poller.poll(int(max(0.0, timeout) * 1000)):
        return None
    try:
        data = sock.recv(512)
    except OSError as e:
        return ("error", e.errno)
    if not data:
        return ("eof",)
    parsed = parse(data)
    if parsed and parsed[0] == ACCEPT:
        return ("accept", struct.unpack("<Q", parsed[1])[0])
    if parsed and parsed[0] == DECLINE:
        return ("decline", *struct.unpack("<QI", parsed[1]))
    return ("junk", data[:64].hex())


# ------------------------------------------------------------------------------ the region

REGION_MAGIC = 0x4D485350
CONTROL_PAGE = 4096
OFF_MAGIC, OFF_RING_SIZE, OFF_NONCE, OFF_CLAIM = 0, 4, 8, 16
CLAIM_OPEN, CLAIM_TAKEN, CLAIM_WITHDRAWN, CLAIM_ABANDONED = 0, 1, 2, 3
CLAIM_NAMES = {0: "open", 1: "taken", 2: "withdrawn", 3: "abandoned"}
TO_SERVER, TO_CLIENT = 64, 256  # each direction's control block
# within a direction's block
D_PRODUCED, D_EOF, D_CONSUMED, D_READER_CLOSED = 0, 8, 64, 72
D_READER_WAITING, D_WRITER_WAITING, D_TOKENS = 128, 132, 136
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
MASK64 = (1 << 64) - 1


def region_size(ring_size):
    return CONTROL_PAGE + 2 * ring_size


def make_memfd(ring_size, nonce, seal=True, size=None):
    """A region as a client builds it: memfd of 4096 + 2*ring bytes, sealed against size
    changes, header magic / ring size / nonce written (with pwrite: no mapping needed)."""
    fd = os.memfd_create("slipstream", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, region_size(ring_size) if size is None else size)
    if seal:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
    os.pwrite(fd, struct.pack("<IIQ", REGION_MAGIC, ring_size, nonce), 0)
    return fd


class Region:
    """The mapped region and its words."""

    def __init__(self, fd, ring_size):
        self.fd = fd
        self.ring_size = ring_size
        self.map = mmap.mmap(fd, region_size(ring_size))

    def u32(self, off):
        return struct.unpack_from("<I", self.map, off)[0]

    def u64(self, off):
        return struct.unpack_from("<Q", self.map, off)[0]

    def put32(self, off, value):
        struct.pack_into("<I", self.map, off, value & 0xFFFFFFFF)

    def put64(self, off, value):
        struct.pack_into("<Q", self.map, off, value & MASK64)

    def ring_offset(self, direction):
        return CONTROL_PAGE + (0 if direction == TO_SERVER else self.ring_size)

    def write_ring(self, direction, position, data):
        """Copies `data` into the direction's ring at stream position `position`."""
        base, size = self.ring_offset(direction), self.ring_size
        done = 0
        while done < len(data):
            at = (position + done) % size
            n = min(len(data) - done, size - at)
            self.map[base + at:base + at + n] = data[done:done + n]
            done += n

    def read_ring(self, direction, position, length):
        base, size = self.ring_offset(direction), self.ring_size
        out = bytearray()
        while len(out) < length:
            at = (position + len(out)) % size
            n = min(length - len(out), size - at)
            out += self.map[base + at:base + at + n]
        return bytes(out)


def report(**fields):
    print(json.dumps(fields), flush=True)


def mark(text):
    print(text, flush=True)


def random_chunks(rng, total, max_size):
    """Random bytes in chunks of log-uniform random size, `total` bytes in all."""
    left = total
    while left:
        size = min(left, max(1, int(2 ** rng.uniform(0, max_size.bit_length()))), max_size)
        left -= size
        yield rng.randbytes(size)


# ------------------------------------------------------------------------------ the client

class RawClient:
    """One connection: region, proxies, REGISTER, TCP, the claim, then the rings."""

    def __init__(self, args, bad_proxies=False):
        self.args = args
        self.ring = args.ring_size
        self.nonce = random.SystemRandom().getrandbits(64) or 1
        self.memfd = make_memfd(self.ring, self.nonce)
        self.region = Region(self.memfd, self.ring)
        # Our own copies stay open: server B (tokens for its reader, fill to drain) above all.
        self.server_a, self.server_b = socket.socketpair()
        self.client_a, self.client_b = socket.socketpair()
        if bad_proxies:
            other_a, other_b = socket.socketpair()
            self.spare = (self.server_b, other_a)
            # server A = first pair's A; server B = second pair's B; client B = A's own peer.
            self.fds = [self.memfd, self.server_a.fileno(), other_b.fileno(),
                        self.server_b.fileno()]
            self.server_b = other_b
        else:
            self.fds = [self.memfd, self.server_a.fileno(), self.server_b.fileno(),
                        self.client_b.fileno()]
        self.tcp = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET)
        self.tcp.bind((args.host, 0))
        self.source_port = self.tcp.getsockname()[1]
        self.rendezvous = None
        self.listener_inode = None
        self.name = None
        self.answer = None
        self.accelerated = False
        self.set_claim = False     # we wrote 1 into the claim word ourselves
        self.claim_seen = None     # the claim word when we decided
        self.withdrew = False
        self.waited_s = None
        self.produced = 0
        self.consumed = 0
        self.tokens_written = 0

    def register(self):
        """Finds the rendezvous and sends REGISTER with the four descriptors; the rendezvous
        socket (kept open: the answer comes there), or None."""
        rv, self.listener_inode, self.name = find_rendezvous(self.args.port, self.args.host)
        if rv is None:
            self.answer = ("no_rendezvous", self.name)
            self.name = None
            return None
        msg = register_message((self.args.host, self.source_port),
                               (self.args.host, self.args.port), self.nonce, self.ring,
                               region_size(self.ring))
        send_with_fds(rv, msg, self.fds)
        self.rendezvous = rv
        return rv

    def claim(self):
        return self.region.u32(OFF_CLAIM)

    def await_answer(self, timeout):
        """Until the listener answers (ACCEPT, DECLINE, or closes the connection) or the
        claim word leaves 0, at most `timeout` s. Sets self.answer; returns the claim word."""
        start = time.monotonic()
        deadline = start + timeout
        rv = self.rendezvous
        while True:
            claim = self.claim()
            if rv is not None and self.answer is None:
                answer = read_answer(rv, min(0.005, max(0.0, deadline - time.monotonic())))
                if answer is not None:
                    self.answer = answer
                    claim = self.claim()  # (the server claims before it answers)
            if self.answer is not None or (claim != CLAIM_OPEN and not self.set_claim):
                break
            if time.monotonic() >= deadline:
                break
            if rv is None:
                time.sleep(0.005)
        self.waited_s = round(time.monotonic() - start, 3)
        return claim

    def withdraw(self):
        """Claim 0 -> 2 (read, then write if still open). True when the connection is ours to
        carry on TCP (withdrawn now, or abandoned/withdrawn before); False when the server
        took it meanwhile."""
        claim = self.claim()
        if claim == CLAIM_OPEN:
            self.region.put32(OFF_CLAIM, CLAIM_WITHDRAWN)
            self.withdrew = True
            claim = self.claim()
        self.claim_seen = claim
        return claim != CLAIM_TAKEN

    def handshake(self, before_connect=None, set_claim=False, withdraw=True):
        """REGISTER, `before_connect()` (e.g. publish into the ring: the client writes its
        ring from the start), [claim word := 1 by us], TCP connect from the registered
        4-tuple, then wait up to --answer-timeout for the server to take the connection.
        Sets and returns self.accelerated: the claim word says taken, by the server (never
        when we set it ourselves). Not taken: with `withdraw`, claim 0 -> 2 and the
        connection is plain TCP from byte 0."""
        rv = self.register()
        if rv is not None and before_connect:
            before_connect()
        if rv is not None and set_claim:
            self.region.put32(OFF_CLAIM, CLAIM_TAKEN)
            self.set_claim = True
        self.tcp.connect((self.args.host, self.args.port))
        if rv is None:
            return False  # plain TCP: nothing of ours anywhere
        claim = self.await_answer(self.args.answer_timeout)
        self.claim_seen = claim
        if self.set_claim:
            return False  # whatever the word says, we wrote it
        if claim == CLAIM_TAKEN:
            self.accelerated = True
        elif withdraw:
            self.accelerated = not self.withdraw()
        if self.answer is not None or withdraw:
            rv.close()
            self.rendezvous = None
        return self.accelerated

    # The peer's side of the rings (the client's view: we write TO_SERVER, read TO_CLIENT).

    def publish(self, data, token=True):
        """Writes as much of `data` as fits; returns the count. Tokens as the library does:
        one byte on the server's B when its reader announced it sleeps."""
        free = self.ring - ((self.produced - self.region.u64(TO_SERVER + D_CONSUMED)) & MASK64)
        n = max(0, min(len(data), free))
        if n:
            self.region.write_ring(TO_SERVER, self.produced, data[:n])
            self.produced += n
            self.region.put64(TO_SERVER + D_PRODUCED, self.produced)
        if token:
            self.wake_reader()
        return n

    def wake_reader(self, force=False):
        waiting = TO_SERVER + D_READER_WAITING
        unread = self.produced != self.region.u64(TO_SERVER + D_CONSUMED)
        if force or (self.region.u32(waiting) and unread):
            self.region.put32(waiting, 0)
            self.region.put32(TO_SERVER + D_TOKENS, self.region.u32(TO_SERVER + D_TOKENS) + 1)
            try:
                self.server_b.send(b"t", socket.MSG_DONTWAIT)
                self.tokens_written += 1
            except OSError:
                pass

    def take(self, limit=1 << 20):
        """Reads what the server published (and credits it); drains the server's fill when
        its writer waits."""
        available = (self.region.u64(TO_CLIENT + D_PRODUCED) - self.consumed) & MASK64
        n = min(available, limit)
        data = self.region.read_ring(TO_CLIENT, self.consumed, n) if n else b""
        self.consumed += n
        if n:
            self.region.put64(TO_CLIENT + D_CONSUMED, self.consumed)
        if self.region.u32(TO_CLIENT + D_WRITER_WAITING):
            self.region.put32(TO_CLIENT + D_WRITER_WAITING, 0)
            self.drain_server_b()
        return data

    def drain_server_b(self):
        try:
            while self.server_b.recv(65536, socket.MSG_DONTWAIT):
                pass
        except OSError:
            pass

    def close_tx(self):
        self.region.put32(TO_SERVER + D_EOF, 1)
        try:
            self.server_b.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def server_eof(self):
        return self.region.u32(TO_CLIENT + D_EOF) != 0

    def wait_consumed(self, timeout):
        """True once the server read everything we published; a text when it dropped the
        connection instead (its TCP end closed or reset; or sent bytes, which nothing of
        ours ever does on TCP); False after `timeout` s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.region.u64(TO_SERVER + D_CONSUMED) == self.produced:
                return True
            self.wake_reader()
            ready, _, _ = select.select([self.tcp], [], [], 0.005)
            if ready:
                try:
                    data = self.tcp.recv(512, socket.MSG_PEEK)
                    return "dropped: " + (f"bytes {data[:32].hex()}" if data else "tcp eof")
                except OSError as e:
                    return f"dropped: tcp {errno.errorcode.get(e.errno, e.errno)}"
        return False

    def exchange(self, payload, timeout, check=True):
        """Sends `payload` through the rings while reading the echo; EOF after the last byte.
        Returns the bytes read back (until the server's EOF, or len(payload) when check)."""
        deadline = time.monotonic() + timeout
        sent, echo = 0, bytearray()
        while time.monotonic() < deadline:
            busy = False
            if sent < len(payload):
                n = self.publish(payload[sent:sent + 256 * 1024])
                sent += n
                busy |= n > 0
                if sent == len(payload):
                    self.close_tx()
            else:
                self.wake_reader()
            data = self.take()
            echo += data
            busy |= bool(data)
            done = self.server_eof() or (check and len(echo) >= len(payload))
            if sent == len(payload) and done:
                echo += self.take()
                break
            if not busy:
                time.sleep(0.0005)
        return bytes(echo)

    def close(self):
        for sock in (self.tcp, self.server_a, self.server_b, self.client_a, self.client_b,
                     self.rendezvous):
            if sock is not None:
                sock.close()


def plain_exchange(sock, payload, timeout):
    """The same echo exchange on the TCP socket itself (not taken: plain)."""
    sock.settimeout(timeout)
    sock.sendall(payload)
    sock.shutdown(socket.SHUT_WR)
    echo = bytearray()
    try:
        while data := sock.recv(65536):
            echo += data
    except OSError:
        pass
    return bytes(echo)


def describe(client):
    answer = client.answer
    if answer and answer[0] == "decline":
        answer = [*answer, DECLINE_REASONS.get(answer[2], "?")]
    return dict(name=(client.name or "").lstrip("\0") or None,
                listener_inode=client.listener_inode,
                answer=list(answer) if answer else None, accelerated=client.accelerated,
                source_port=client.source_port, set_claim=client.set_claim,
                claim=CLAIM_NAMES.get(client.claim_seen, client.claim_seen),
                withdrew=client.withdrew, waited_s=client.waited_s)


def tcp_probe(sock, size, timeout, seed):
    """`size` random bytes over the TCP connection itself, and the echo read back (an echo
    server that has the connection as plain TCP sends exactly them)."""
    payload = random.Random(seed).randbytes(size)
    echo = bytearray()
    end = None
    sock.settimeout(timeout)
    try:
        sock.sendall(payload)
        while len(echo) < len(payload):
            data = sock.recv(65536)
            if not data:
                end = "eof"
                break
            echo += data
    except socket.timeout:
        end = "timeout"
    except OSError as e:
        end = errno.errorcode.get(e.errno, str(e.errno))
    return dict(sent=len(payload), received=len(echo), exact=bytes(echo) == payload, end=end)


# ------------------------------------------------------------------------------ modes

def mode_hold(args, stage):
    """register / connect / claim: stop after `stage` and hold."""
    client = RawClient(args)
    probe = None
    if stage == "register":
        if client.register() is not None:
            client.claim_seen = client.await_answer(args.answer_timeout)
    else:
        client.handshake(set_claim=stage == "claim", withdraw=False)
        if args.probe and not client.accelerated:
            probe = tcp_probe(client.tcp, args.probe, args.timeout, args.seed)
    client.claim_seen = client.claim()
    mark("HOLDING")
    report(mode=stage, probe=probe, **describe(client))
    time.sleep(args.hold)
    client.close()


def mode_peer(args):
    client = RawClient(args)
    rng = random.Random(args.seed)
    payload = b"".join(random_chunks(rng, args.bytes, 256 * 1024))
    if client.handshake():
        echo = client.exchange(payload, args.timeout)
    else:
        echo = plain_exchange(client.tcp, payload, args.timeout)
    report(mode="peer", sent=len(payload), sent_sha256=hashlib.sha256(payload).hexdigest(),
           received=len(echo), received_sha256=hashlib.sha256(echo).hexdigest(),
           exact=echo == payload, **describe(client))
    client.close()


def scribbler(region, seconds, seed):
    """Child process: random bytes over the control page and the rings."""
    rng = random.Random(seed)
    targets = [OFF_MAGIC, OFF_RING_SIZE, OFF_NONCE, OFF_CLAIM]
    for base in (TO_SERVER, TO_CLIENT):
        targets += [base + off for off in (D_PRODUCED, D_EOF, D_CONSUMED, D_READER_CLOSED,
                                           D_READER_WAITING, D_WRITER_WAITING, D_TOKENS)]
    interesting = [0, 1, 0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, MASK64, 1 << 63, 1 << 40]
    end = time.monotonic() + seconds
    writes = 0
    while time.monotonic() < end:
        for _ in range(200):
            pick = rng.random()
            if pick < 0.6:
                off = rng.choice(targets) + rng.choice((0, 0, 0, 1, 2, 4))
                value = rng.choice(interesting) if rng.random() < 0.4 else rng.getrandbits(64)
                width = rng.choice((1, 4, 8))
                data = (value & ((1 << (8 * width)) - 1)).to_bytes(width, "little")
            elif pick < 0.8:
                off = rng.randrange(0, CONTROL_PAGE - 16)
                data = rng.randbytes(rng.randint(1, 16))
            else:
                off = rng.randrange(CONTROL_PAGE, len(region.map) - 64)
                data = rng.randbytes(rng.randint(1, 64))
            region.map[off:off + len(data)] = data
            writes += 1
        time.sleep(rng.choice((0, 0, 0.0005, 0.002)))
    return writes


def fork_child(body):
    pid = os.fork()
    if pid == 0:
        try:
            body()
        finally:
            os._exit(0)
    return pid


def stop_child(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(pid, 0)


def mode_scribble(args):
    client = RawClient(args)
    accelerated = client.handshake()
    rng = random.Random(args.seed)
    writes = 0
    server_closed = None
    if accelerated:
        child = fork_child(lambda: scribbler(client.region, args.duration, args.seed))
        deadline = time.monotonic() + args.duration
        while time.monotonic() < deadline:
            # Keep data flowing both ways, checking nothing: the region is garbage anyway.
            client.publish(rng.randbytes(rng.randint(1, 65536)))
            client.wake_reader(force=rng.random() < 0.05)
            client.take(65536)
            time.sleep(0.001)
        stop_child(child)
        writes = -1
        # Did the server end this connection? (its TCP anchor: EOF or a reset)
        client.tcp.settimeout(2)
        try:
            server_closed = client.tcp.recv(1 << 16) == b""
        except socket.timeout:
            server_closed = False
        except OSError as e:
            server_closed = f"error {errno.errorcode.get(e.errno, e.errno)}"
    report(mode="scribble", scribbled=accelerated, writes=writes, server_closed=server_closed,
           **describe(client))
    client.close()


def toggler(region, good, huge, realtime):
    """Child process: header.ring_size flips between the registered value and `huge`.
    `realtime`: run SCHED_FIFO (needs root or CAP_SYS_NICE; ignored when refused), so that
    the flipping goes on while the server reads the header even on a loaded host."""
    if realtime:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        except OSError:
            pass
    good_bytes, huge_bytes = struct.pack("<I", good), struct.pack("<I", huge)
    m = region.map
    while True:
        for _ in range(10000):
            m[4:8] = huge_bytes
            m[4:8] = good_bytes
        if os.getppid() == 1:
            return


def wait_taken(client, timeout):
    """Until the server has visibly acted on the connection it took: it reads our ring
    (`consumed` moves), or its end of the TCP connection closes or resets (it dropped the
    connection, or the process is gone). Returns what was seen, or "timeout"."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.region.u64(TO_SERVER + D_CONSUMED) != 0:
            return "reading"
        ready, _, _ = select.select([client.tcp], [], [], 0.01)
        if ready:
            try:
                data = client.tcp.recv(512, socket.MSG_PEEK)
                return "tcp eof" if not data else f"tcp bytes {data[:32].hex()}"
            except OSError as e:
                return f"tcp {errno.errorcode.get(e.errno, e.errno)}"
    return "timeout"


def mode_ring_size_race(args):
    attempts = []
    for attempt in range(args.attempts):
        try:
            client = RawClient(args)
        except OSError as e:
            attempts.append({"error": str(e)})
            break
        child = fork_child(lambda: toggler(client.region, client.ring, args.huge,
                                           args.realtime))
        outcome = {}
        try:
            time.sleep(0.01)  # the flipping runs before REGISTER
            accelerated = client.handshake()
            outcome.update(describe(client))
            if accelerated:
                # Make the server read far (a huge `produced`) and echo what it read.
                client.region.put64(TO_SERVER + D_PRODUCED, 0x40000000)
                client.wake_reader(force=True)
                outcome["taken"] = wait_taken(client, args.hold)
                time.sleep(0.2)  # the server reads and echoes (or crashes) meanwhile
            else:
                # Not taken (the listener declined the region it read, e.g. with the huge
                # ring size): a plain connection, nothing for the server to read.
                answer = client.answer or ("none",)
                outcome["taken"] = "not taken: " + (
                    DECLINE_REASONS.get(answer[2], "?") if answer[0] == "decline" else answer[0])
        except OSError as e:
            outcome["error"] = f"{errno.errorcode.get(e.errno, e.errno)}"
        finally:
            stop_child(child)
            client.close()
        attempts.append(outcome)
        if outcome.get("error") in ("ECONNREFUSED",):
            break  # the server is gone
    taken = {}
    for a in attempts:
        what = a.get("taken") or a.get("error") or "?"
        taken[what] = taken.get(what, 0) + 1
    report(mode="ring_size_race", attempts=len(attempts), taken=taken, details=attempts[-2:])


def mode_bad_proxies(args):
    client = RawClient(args, bad_proxies=True)
    rng = random.Random(args.seed)
    payload = rng.randbytes(args.bytes)

    def preload():  # published before the server took it: no token for its first read
        client.publish(payload, token=False)

    accelerated = client.handshake(before_connect=preload)
    if accelerated:
        consumed = client.wait_consumed(args.timeout)
    else:
        client.tcp.sendall(payload)  # plain from byte 0: what the ring held goes over TCP
        consumed = None
    report(mode="bad_proxies", sent=len(payload), sent_sha256=hashlib.sha256(payload).hexdigest(),
           consumed=consumed, **describe(client))
    time.sleep(0.5)  # let the server go to sleep in its next recv
    mark("DYING")
    os.kill(os.getpid(), signal.SIGKILL)


def mode_stray_token(args):
    client = RawClient(args)
    rng = random.Random(args.seed)
    payload = rng.randbytes(args.bytes)

    def preload():
        client.publish(payload, token=False)

    accelerated = client.handshake(before_connect=preload)
    consumed = client.wait_consumed(args.timeout) if accelerated else None
    if accelerated:
        client.server_b.send(b"s" * args.stray)
    report(mode="stray_token", sent=len(payload), consumed=consumed, stray=args.stray,
           **describe(client))
    mark("STRAY")
    time.sleep(args.hold)
    client.close()


MODES = {
    "register": lambda a: mode_hold(a, "register"),
    "connect": lambda a: mode_hold(a, "connect"),
    "claim": lambda a: mode_hold(a, "claim"),
    "peer": mode_peer,
    "scribble": mode_scribble,
    "ring_size_race": mode_ring_size_race,
    "bad_proxies": mode_bad_proxies,
    "stray_token": mode_stray_token,
}


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=sorted(MODES), required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--ring-size", type=lambda v: int(v, 0), default=1 << 16)
    parser.add_argument("--bytes", type=int, default=64 * 1024, help="payload of peer modes")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--hold", type=float, default=5.0, help="seconds to stay connected")
    parser.add_argument("--duration", type=float, default=3.0, help="scribble: seconds")
    parser.add_argument("--timeout", type=float, default=15.0)
    parser.add_argument("--attempts", type=int, default=10, help="ring_size_race: connections")
    parser.add_argument("--huge", type=lambda v: int(v, 0), default=0x80000000,
                        help="ring_size_race: the ring size written over the real one")
    parser.add_argument("--realtime", action="store_true",
                        help="ring_size_race: the flipper runs SCHED_FIFO (root)")
    parser.add_argument("--stray", type=int, default=16, help="stray_token: bytes written")
    parser.add_argument("--answer-timeout", type=float, default=2.0,
                        help="after the SYN, wait this long for the server to take the "
                        "connection (ACCEPT, claim word 1) or decline; then withdraw")
    parser.add_argument("--probe", type=int, default=0,
                        help="claim/connect: when not taken, this many bytes over TCP, "
                        "echo read back")
    args = parser.parse_args()
    MODES[args.mode](args)


if __name__ == "__main__":
    main()
