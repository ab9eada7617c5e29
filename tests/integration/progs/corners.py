"""Socket corners that need more than one connection or process.

Usage: corners.py ROLE MODE --port PORT [options]; ROLE is server or client; MODE:
  fork_own   both sides open two connections, then fork: the parent keeps using the first,
             the child the second (each closes the other's copy); every round's bytes are
             checked by SHA-256.
  fork_exec  two connections; each side lets a spawned /bin/sleep inherit one of them (A: the
             client's sleeper, B: the server's), goes on using both, then closes its
             inheritor's connection; the peer must see EOF only once the sleeper (the last
             holder) exits.
  banner     the server speaks first (a banner right after accept); the client times
             connect-to-banner for --count connections.
  reuseaddr  the server closes first (its side in TIME_WAIT), drops its listener and listens
             again on the port: refused without SO_REUSEADDR, accepted with it.
  v6only     an IPV6_V6ONLY listener on [::]: IPv4 connections are refused; then an IPv4
             listener on the same port takes them, each listener its own family.
  fork_writers the client forks with its connection and both processes send at once, in
             random-sized calls, MiB each (the child's bytes 0-127, the parent's 128-255);
             the server reads until EOF (both closed), splits by the high bit and reports the
             SHA-256 of each half, which must be each writer's stream, in order.
  exec       the server reads part of the client's stream and sends part of its own, tries
             to exec a missing program (ENOENT: it must go on with the connection intact),
             reads and sends a little more, then execs itself (exec_child) with the socket
             inherited; the new program checks the rest of the client's stream byte for byte
             from where the old one stopped and sends the rest of its own. Both streams are
             seeded random bytes of random length, so each side checks every byte.
  exec_shared the server forks; the child execs itself with the socket inherited while the
             parent keeps its copy and serves the client to the end: the exec'd program must
             get an error on that descriptor (never the stream's bytes), the parent's stream
             stays intact.

A "round" on a connection: the client sends an 8-byte length and that many random bytes,
the server answers with their SHA-256. Each side reports one JSON line.
"""

import hashlib
import os
import random
import select
import socket
import struct
import sys
import threading
import time

from common import LOOPBACK, argument_parser, fail, random_size, report

ROUND_MAX = 256 << 10


def recv_exact(sock, n):
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return bytes(data)


def client_round(sock, rng):
    payload = rng.randbytes(random_size(rng, ROUND_MAX))
    sock.sendall(struct.pack("!Q", len(payload)) + payload)
    answer = recv_exact(sock, 32)
    if answer != hashlib.sha256(payload).digest():
        fail(f"round of {len(payload)} B: the server hashed something else ({answer.hex()})")
    return len(payload)


def server_round(sock):
    """Serves one round; returns its length, or None at EOF."""
    header = recv_exact(sock, 8)
    if not header:
        return None
    if len(header) != 8:
        fail("EOF inside a round header")
    (length,) = struct.unpack("!Q", header)
    payload = recv_exact(sock, length)
    if len(payload) != length:
        fail(f"EOF after {len(payload)} of {length} B")
    sock.sendall(hashlib.sha256(payload).digest())
    return length


def serve_until_eof(sock):
    total = 0
    while (n := server_round(sock)) is not None:
        total += n
    return total


def accept_n(listener, n):
    conns = []
    for _ in range(n):
        conn, _ = listener.accept()
        conns.append(conn)
    return conns


def listen(port, family=socket.AF_INET, address=LOOPBACK, v6only=None, reuse=True):
    sock = socket.socket(family, socket.SOCK_STREAM)
    if reuse:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if v6only is not None:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, int(v6only))
    sock.bind((address, port))
    sock.listen(16)
    return sock


# --- fork_own ----------------------------------------------------------------------------


def fork_own(args):
    """Each process of the fork serves (or drives) only its own connection; the other copy
    is closed at once, so the connection's life depends on the process that kept it."""
    if args.role == "server":
        with listen(args.port) as listener:
            conns = accept_n(listener, 2)
        for conn in conns:  # one round each before the fork
            server_round(conn)
    else:
        conns = [socket.create_connection((LOOPBACK, args.port)) for _ in range(2)]
        for i, conn in enumerate(conns):
            client_round(conn, random.Random(args.seed + 100 + i))
    pid = os.fork()
    mine = 1 if pid == 0 else 0
    conns[1 - mine].close()
    conn = conns[mine]
    try:
        if args.role == "server":
            total = serve_until_eof(conn)
        else:
            rng = random.Random(args.seed + mine)
            total = sum(client_round(conn, rng) for _ in range(args.rounds))
            conn.shutdown(socket.SHUT_WR)
            if conn.recv(1) != b"":
                fail("bytes after the last answer")
        conn.close()
    except BaseException as e:  # the child must not return into the caller's code
        if pid == 0:
            print(f"child: {e!r}", file=sys.stderr, flush=True)
            os._exit(1)
        raise
    if pid == 0:
        os._exit(0 if total > 0 else 1)  # no exit handlers: the parent writes the stats
    _, status = os.waitpid(pid, 0)
    if status != 0:
        fail(f"the child (its connection) failed: wait status {status}")
    report(role=args.role, parent_bytes=total, child_status=status)


# --- fork_writers ------------------------------------------------------------------------

FORK_WRITER_BYTES = 4 << 20


HIGH_BYTES = bytes(range(0x80, 0x100))
LOW_BYTES = bytes(range(0x80))
AS_BITS = bytes(0x30 + (b >> 7) for b in range(256))  # each byte as "0" or "1" by its high bit


def writer_stream(high, seed):
    data = random.Random(seed + high).randbytes(FORK_WRITER_BYTES)
    return data.translate(bytes((b & 0x7F) | high for b in range(256)))


def fork_writers(args):
    if args.role == "server":
        with listen(args.port) as listener:
            conn, _ = listener.accept()
        halves = {0: hashlib.sha256(), 0x80: hashlib.sha256()}
        counts = {0: 0, 0x80: 0}
        switches, last = 0, b""
        with conn:
            while chunk := conn.recv(1 << 16):
                low, high = chunk.translate(None, HIGH_BYTES), chunk.translate(None, LOW_BYTES)
                halves[0].update(low)
                halves[0x80].update(high)
                counts[0] += len(low)
                counts[0x80] += len(high)
                bits = last + chunk.translate(AS_BITS)
                switches += bits.count(b"01") + bits.count(b"10")
                last = bits[-1:]
        report(role="server", child_sha=halves[0].hexdigest(), parent_sha=halves[0x80].hexdigest(),
               child_bytes=counts[0], parent_bytes=counts[0x80], switches=switches)
        return
    streams = {high: writer_stream(high, args.seed) for high in (0, 0x80)}
    conn = socket.create_connection((LOOPBACK, args.port))
    pid = os.fork()
    high = 0 if pid == 0 else 0x80
    rng = random.Random(args.seed + 7 + high)
    try:
        view = memoryview(streams[high])
        while view:
            n = min(len(view), rng.randrange(1, 20000))
            conn.sendall(view[:n])
            view = view[n:]
        conn.close()
    except BaseException as e:
        if pid == 0:
            print(f"child: {e!r}", file=sys.stderr, flush=True)
            os._exit(1)
        raise
    if pid == 0:
        os._exit(0)  # no exit handlers: the parent writes the stats
    _, status = os.waitpid(pid, 0)
    if status != 0:
        fail(f"the child writer failed: wait status {status}")
    report(role="client", child_sha=hashlib.sha256(streams[0]).hexdigest(),
           parent_sha=hashlib.sha256(streams[0x80]).hexdigest(), bytes=FORK_WRITER_BYTES)


# --- fork_exec ---------------------------------------------------------------------------


def spawn_sleeper(sock, seconds):
    """/bin/sleep inherits `sock` (and no other socket of ours) and ignores it."""
    os.set_inheritable(sock.fileno(), True)
    try:
        return os.posix_spawn("/bin/sleep", ["sleep", str(seconds)], os.environ)
    finally:
        os.set_inheritable(sock.fileno(), False)


def fork_exec(args):
    if args.role == "server":
        with listen(args.port) as listener:
            conn_a, conn_b = accept_n(listener, 2)
    else:
        conn_a = socket.create_connection((LOOPBACK, args.port))
        conn_b = socket.create_connection((LOOPBACK, args.port))
    rng = random.Random(args.seed)

    def rounds():
        for conn in (conn_a, conn_b):
            for _ in range(2):
                if args.role == "server":
                    server_round(conn)
                else:
                    client_round(conn, rng)

    rounds()
    mine, theirs = (conn_a, conn_b) if args.role == "client" else (conn_b, conn_a)
    sleeper = spawn_sleeper(mine, args.sleep)
    exited = {}

    def reap():
        os.waitpid(sleeper, 0)
        exited["t"] = time.monotonic()

    reaper = threading.Thread(target=reap)
    reaper.start()
    rounds()  # both connections still work after the exec
    closed = time.monotonic()
    mine.close()
    theirs.settimeout(args.sleep + 10)
    if theirs.recv(1) != b"":
        fail("bytes where the peer's EOF was expected")
    peer_eof = time.monotonic()
    theirs.close()
    reaper.join()
    report(role=args.role, closed=closed, sleeper_exit=exited["t"], peer_eof=peer_eof)


# --- banner ------------------------------------------------------------------------------

BANNER = b"220 corners.py banner server ready\r\n"


def banner(args):
    if args.role == "server":
        with listen(args.port) as listener:
            for _ in range(args.count):
                conn, _ = listener.accept()
                with conn:
                    conn.sendall(BANNER)  # before reading anything
                    request = recv_exact(conn, 5)
                    conn.sendall(hashlib.sha256(request).digest())
        report(role="server", served=args.count)
        return
    delays = []
    for i in range(args.count):
        sock = socket.socket()
        sock.settimeout(10)
        sock.connect((LOOPBACK, args.port))
        started = time.monotonic()
        got = recv_exact(sock, len(BANNER))
        delays.append(time.monotonic() - started)
        if got != BANNER:
            fail(f"connection {i}: banner {got!r}")
        request = f"Q{i:04d}".encode()
        sock.sendall(request)
        if recv_exact(sock, 32) != hashlib.sha256(request).digest():
            fail(f"connection {i}: wrong answer")
        sock.close()
    delays.sort()
    report(role="client", count=args.count, median_ms=1000 * delays[len(delays) // 2],
           max_ms=1000 * delays[-1])


# --- reuseaddr ---------------------------------------------------------------------------


REUSE_ROUNDS = 3


def reuseaddr(args):
    rng = random.Random(args.seed)
    if args.role == "client":
        for attempt in range(2):
            deadline = time.monotonic() + 10
            while True:
                try:
                    sock = socket.create_connection((LOOPBACK, args.port))
                    break
                except ConnectionRefusedError:  # the second listener is not up yet
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.01)
            for _ in range(REUSE_ROUNDS):
                client_round(sock, rng)
            if sock.recv(1) != b"":  # the server closes first
                fail("bytes after the last round")
            sock.close()
        report(role="client", connections=2)
        return
    listener = listen(args.port)
    conn, _ = listener.accept()
    for _ in range(REUSE_ROUNDS):
        server_round(conn)
    listener.close()  # first: the client reconnects as soon as it sees EOF
    conn.close()  # this side closes first: its end of the connection goes to TIME_WAIT
    time.sleep(0.1)  # the client's FIN: TIME_WAIT, not FIN_WAIT2
    try:
        listen(args.port, reuse=False).close()
        refused = False
    except OSError as e:
        refused = e.errno
    listener = listen(args.port)  # SO_REUSEADDR: the port is ours again
    conn, _ = listener.accept()
    total = sum(server_round(conn) for _ in range(REUSE_ROUNDS))
    conn.close()
    listener.close()
    report(role="server", refused_without_reuseaddr=refused, second_bytes=total)


# --- v6only ------------------------------------------------------------------------------


def v6only(args):
    if args.role == "server":
        v6 = listen(args.port, socket.AF_INET6, "::", v6only=True)
        flag = v6.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY)
        conn6, _ = v6.accept()  # the client connected to [::1]
        accepted_flag = conn6.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY)
        conn6.sendall(b"v6")
        serve_until_eof(conn6)
        conn6.close()
        v4 = listen(args.port)  # same port, IPv4: allowed beside an IPv6-only listener
        served = []
        for _ in range(2):
            readable, _, _ = select.select([v4, v6], [], [], 10)
            if not readable:
                fail("no connection within 10 s")
            listener = readable[0]
            conn, _ = listener.accept()
            name = "v4" if listener is v4 else "v6"
            conn.sendall(name.encode())
            serve_until_eof(conn)
            conn.close()
            served.append(name)
        v4.close()
        v6.close()
        report(role="server", v6only=flag, accepted_v6only=accepted_flag,
               served=sorted(served))
        return
    rng = random.Random(args.seed)
    try:
        socket.create_connection((LOOPBACK, args.port), timeout=5).close()
        refused = False
    except ConnectionRefusedError:
        refused = True

    def session(host, family):
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(10)
        sock.connect((host, args.port))
        name = recv_exact(sock, 2).decode()
        for _ in range(2):
            client_round(sock, rng)
        sock.shutdown(socket.SHUT_WR)
        if sock.recv(1) != b"":
            fail("bytes after the last round")
        sock.close()
        return name

    first = session("::1", socket.AF_INET6)
    deadline = time.monotonic() + 10
    while True:  # the IPv4 listener comes up after the first session
        try:
            second = session(LOOPBACK, socket.AF_INET)
            break
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)
    third = session("::1", socket.AF_INET6)
    report(role="client", v4_refused_by_v6only=refused, served_by=[first, second, third])


# --- exec --------------------------------------------------------------------------------

EXEC_MIN = 2 << 20  # each direction: more than a ring, so that the writers wait on full
EXEC_MAX = 6 << 20  # rings across the exec


def exec_streams(seed):
    """The client's and the server's streams: seeded, so both ends (and the exec'd program)
    know every byte."""
    rng = random.Random(seed)
    up = rng.randbytes(EXEC_MIN + random_size(rng, EXEC_MAX - EXEC_MIN))
    down = rng.randbytes(EXEC_MIN + random_size(rng, EXEC_MAX - EXEC_MIN))
    return up, down


def check_prefix(sock, expected, offset, count):
    """Reads `count` bytes that must equal expected[offset:offset+count]."""
    got = recv_exact(sock, count)
    if got != expected[offset:offset + count]:
        fail(f"bytes {offset}..{offset + count} of the stream differ "
             f"(got {len(got)} B)")
    return offset + count


def exec_self(sock, mode, args, **extra):
    os.set_inheritable(sock.fileno(), True)
    argv = [sys.executable, os.path.abspath(__file__), "server", mode, "--port", str(args.port),
            "--seed", str(args.seed), "--fd", str(sock.fileno())]
    for key, value in extra.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    os.execv(sys.executable, argv)


def exec_client(args):
    up, down = exec_streams(args.seed)
    sock = socket.create_connection((LOOPBACK, args.port))

    def send_all():
        sock.sendall(up)
        sock.shutdown(socket.SHUT_WR)

    sender = threading.Thread(target=send_all)
    sender.start()
    got = bytearray()
    while chunk := sock.recv(1 << 20):
        got += chunk
    sender.join()
    if bytes(got) != down:
        first = next((i for i, (a, b) in enumerate(zip(got, down)) if a != b), min(len(got), len(down)))
        fail(f"the server's stream differs from byte {first} (got {len(got)} of {len(down)} B)")
    sock.close()
    report(role="client", sent=len(up), received=len(got))


def exec_server(args):
    up, down = exec_streams(args.seed)
    rng = random.Random(args.seed + 1)
    with listen(args.port) as listener:
        conn, _ = listener.accept()
    read = check_prefix(conn, up, 0, rng.randrange(len(up) // 3 + 1))
    sent = rng.randrange(len(down) // 3 + 1)
    conn.sendall(down[:sent])
    # A failed exec: this program goes on, the connection too.
    try:
        os.execv("/nonexistent/corners-exec-test", ["corners-exec-test"])
    except FileNotFoundError:
        pass
    else:
        fail("exec of a missing program did not fail")
    read = check_prefix(conn, up, read, rng.randrange((len(up) - read) // 2 + 1))
    more = rng.randrange((len(down) - sent) // 2 + 1)
    conn.sendall(down[sent:sent + more])
    exec_self(conn, "exec_child", args, read_from=read, sent_from=sent + more)


def exec_child(args):
    """The exec'd program: continues the inherited connection where the old image left it."""
    up, down = exec_streams(args.seed)
    sock = socket.socket(fileno=args.fd)
    sender = threading.Thread(target=lambda: (sock.sendall(down[args.sent_from:]),
                                              sock.shutdown(socket.SHUT_WR)))
    sender.start()
    rest = bytearray()
    while chunk := sock.recv(1 << 20):
        rest += chunk
    sender.join()
    if bytes(rest) != up[args.read_from:]:
        first = next((i for i, (a, b) in enumerate(zip(rest, up[args.read_from:])) if a != b),
                     min(len(rest), len(up) - args.read_from))
        fail(f"after exec: the client's stream differs from byte {args.read_from + first} "
             f"(got {len(rest)} B from byte {args.read_from}, expected {len(up) - args.read_from})")
    sock.close()
    report(role="server", received=args.read_from + len(rest), sent=len(down),
           exec_at_received=args.read_from, exec_at_sent=args.sent_from)


def exec_shared_server(args):
    up, down = exec_streams(args.seed)
    with listen(args.port) as listener:
        conn, _ = listener.accept()
    read = check_prefix(conn, up, 0, min(len(up), 4096))
    pid = os.fork()
    if pid == 0:
        try:
            exec_self(conn, "exec_orphan", args)
        finally:
            os._exit(3)
    # The parent keeps its copy and serves the whole connection.
    sender = threading.Thread(target=lambda: (conn.sendall(down), conn.shutdown(socket.SHUT_WR)))
    sender.start()
    rest = bytearray()
    while chunk := conn.recv(1 << 20):
        rest += chunk
    sender.join()
    if bytes(rest) != up[read:]:
        fail(f"the parent's stream differs after the child's exec (got {len(rest)} B)")
    _, status = os.waitpid(pid, 0)
    conn.close()
    if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
        fail(f"the exec'd program saw the stream's bytes or no error: wait status {status}")
    report(role="server", received=read + len(rest), sent=len(down))


def exec_orphan(args):
    """Exec'd while another process (the parent) holds the connection: this descriptor must
    fail, not yield the stream's bytes."""
    sock = socket.socket(fileno=args.fd)
    sock.settimeout(10)
    try:
        data = sock.recv(4096)
    except ConnectionResetError as e:
        print(f"exec_orphan: recv failed as expected: {e!r}", file=sys.stderr)
        os._exit(0)
    except OSError as e:  # a timeout: the descriptor hangs instead of failing
        print(f"exec_orphan: recv failed with {e!r}", file=sys.stderr)
        os._exit(1)
    print(f"exec_orphan: recv returned {len(data)} B", file=sys.stderr)
    os._exit(0 if not data else 1)


def exec_mode(args):
    (exec_server if args.role == "server" else exec_client)(args)


def exec_shared(args):
    (exec_shared_server if args.role == "server" else exec_client)(args)


MODES = {"fork_own": fork_own, "fork_writers": fork_writers, "fork_exec": fork_exec, "banner": banner,
         "reuseaddr": reuseaddr, "v6only": v6only, "exec": exec_mode,
         "exec_shared": exec_shared, "exec_child": exec_child, "exec_orphan": exec_orphan}


def main():
    parser = argument_parser(__doc__, role=True)
    parser.add_argument("mode", choices=sorted(MODES))
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--sleep", type=float, default=1.0)
    parser.add_argument("--count", type=int, default=20)
    parser.add_argument("--fd", type=int, help="exec'd modes: the inherited socket")
    parser.add_argument("--read-from", type=int, default=0)
    parser.add_argument("--sent-from", type=int, default=0)
    args = parser.parse_args()
    MODES[args.mode](args)


if __name__ == "__main__":
    main()
