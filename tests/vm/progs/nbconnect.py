"""Non-blocking connects, for tests/vm/verbs_cases.py (nbconnect.*).

server: accepts --count connections, each in a thread: reads the client's [8-byte length]
  [bytes], answers [8-byte length][its own random bytes][SHA-256 of those][SHA-256 of what it
  received], closes. Prints {"served": N}.
client: issues --count non-blocking connects in a loop, each registered with one epoll set
  for EPOLLOUT right after connect() returns; prints {"issued": N, ...} (a line the test
  waits for) with how long the slowest connect() took and how many were complete at once;
  then waits for every completion (EPOLLOUT) and checks SO_ERROR (0, or the errno named by
  --expect-error), getpeername and a second connect() (0 or EISCONN); with --expect-pending,
  also that none was complete when the loop ended and that a second connect() said
  EALREADY then. Connected sockets then exchange random sizes both ways, checked with
  SHA-256 on both ends. With --replace K, K of the connecting numbers are taken back
  (dup2 of /dev/null over them, half of them closed first) and must still be /dev/null at
  the end. Prints {"connections": N, "ok": N, ...} last.
"""
import argparse
import errno
import hashlib
import json
import os
import random
import select
import socket
import stat
import struct
import sys
import threading
import time

parser = argparse.ArgumentParser()
parser.add_argument("role", choices=["server", "client"])
parser.add_argument("--host", required=True)
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--count", type=int, default=8)
parser.add_argument("--max-size", type=int, default=256 * 1024)
parser.add_argument("--expect-pending", action="store_true")
parser.add_argument("--expect-error", default="")
parser.add_argument("--timeout", type=float, default=60)
parser.add_argument("--replace", type=int, default=0,
                    help="client: after the loop, put /dev/null at this many of the "
                         "connecting numbers (dup2 over them; every other one closed first)")
parser.add_argument("--hold-ms", type=int, default=0,
                    help="client: sleep this long after the loop, before saying issued")
args = parser.parse_args()


def recv_exact(sock, n):
    parts, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise EOFError(f"EOF after {got} of {n} bytes")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def serve_one(conn, errors):
    try:
        with conn:
            conn.settimeout(args.timeout)
            (size,) = struct.unpack("!Q", recv_exact(conn, 8))
            received = recv_exact(conn, size)
            mine = os.urandom(random.randint(1, args.max_size))
            conn.sendall(struct.pack("!Q", len(mine)) + mine + hashlib.sha256(mine).digest() +
                         hashlib.sha256(received).digest())
    except Exception as e:  # reported, and the exit status says it
        errors.append(repr(e))


if args.role == "server":
    errors, threads = [], []
    with socket.create_server((args.host, args.port), backlog=max(args.count, 16)) as listener:
        listener.settimeout(args.timeout)
        for _ in range(args.count):
            conn, _ = listener.accept()
            t = threading.Thread(target=serve_one, args=(conn, errors))
            t.start()
            threads.append(t)
    for t in threads:
        t.join()
    print(json.dumps({"served": args.count, "errors": errors}))
    sys.exit(1 if errors else 0)

# client
expected_error = getattr(errno, args.expect_error) if args.expect_error else 0
ep = select.epoll()
socks, slowest = [], 0.0
for _ in range(args.count):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setblocking(False)
    began = time.monotonic()
    err = s.connect_ex((args.host, args.port))
    slowest = max(slowest, time.monotonic() - began)
    if err != errno.EINPROGRESS:
        print(f"connect() said {errno.errorcode.get(err, err)}, expected EINPROGRESS", flush=True)
        sys.exit(1)
    ep.register(s.fileno(), select.EPOLLOUT)
    socks.append(s)
complete_at_once = len(ep.poll(0))
# A second connect() while connecting must say EALREADY. Only asked where the connects are
# held pending: once a refusal arrived, a second connect() takes the socket's error (as
# on TCP), and SO_ERROR below would read 0.
again = errno.errorcode.get(socks[0].connect_ex((args.host, args.port)), "0") \
    if args.expect_pending else "not asked"
# Numbers the application takes back while their connect is in flight: whatever the
# connector does with those connections later must never touch the numbers again.
replaced = []
null = os.open(os.devnull, os.O_RDONLY)
for k, s in enumerate(socks[1:1 + 2 * args.replace:2]):
    ep.unregister(s.fileno())
    fd = s.detach()
    if k % 2:
        os.close(fd)
    for attempt in range(100):
        try:
            os.dup2(null, fd)
            break
        except OSError as e:
            # EBUSY: the number, just closed, is being taken by another thread's open()
            # at this instant (the shim's own threads open descriptors low, then move
            # them high); the kernel says so rather than wait. Try again.
            if e.errno != errno.EBUSY or attempt == 99:
                raise
            time.sleep(0.001)
    replaced.append(fd)
socks = [s for s in socks if s.fileno() >= 0]
time.sleep(args.hold_ms / 1000)
print(json.dumps({"issued": args.count, "slowest_connect_ms": round(slowest * 1000, 2),
                  "complete_at_once": complete_at_once, "second_connect": again,
                  "replaced": replaced}), flush=True)
problems = []
if args.expect_pending:
    if complete_at_once:
        problems.append(f"{complete_at_once} connect(s) complete before the server could answer")
    if again not in ("EALREADY",):
        problems.append(f"a second connect() while connecting said {again}, expected EALREADY")

by_fd = {s.fileno(): s for s in socks}
done = {}
deadline = time.monotonic() + args.timeout
while len(done) < len(socks) and time.monotonic() < deadline:
    for fd, events in ep.poll(1.0):
        if fd in by_fd and fd not in done:
            done[fd] = events
            ep.unregister(fd)
if len(done) < len(socks):
    problems.append(f"only {len(done)} of {len(socks)} connects completed (EPOLLOUT) in time")

ok = 0
results = [None] * len(socks)


def exchange(i, s):
    try:
        s.settimeout(args.timeout)
        mine = os.urandom(random.randint(1, args.max_size))
        s.sendall(struct.pack("!Q", len(mine)) + mine)
        (size,) = struct.unpack("!Q", recv_exact(s, 8))
        theirs = recv_exact(s, size)
        their_digest, digest_of_mine = recv_exact(s, 32), recv_exact(s, 32)
        if hashlib.sha256(theirs).digest() != their_digest:
            results[i] = "server -> client: SHA-256 differs"
        elif hashlib.sha256(mine).digest() != digest_of_mine:
            results[i] = "client -> server: SHA-256 differs"
        else:
            results[i] = "ok"
    except Exception as e:
        results[i] = repr(e)


threads = []
for i, s in enumerate(socks):
    events = done.get(s.fileno())
    if events is None:
        continue
    so_error = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if so_error != expected_error:
        problems.append(f"connection {i}: SO_ERROR {errno.errorcode.get(so_error, so_error)}, "
                        f"expected {args.expect_error or 0}; events {events:#x}")
        continue
    if expected_error:
        ok += 1
        continue
    try:
        s.getpeername()
    except OSError as e:
        problems.append(f"connection {i}: getpeername: {e}")
        continue
    # (Linux's TCP answers 0 to the first connect() after a non-blocking one completed,
    # EISCONN after that; an accelerated socket says EISCONN.)
    again = errno.errorcode.get(s.connect_ex((args.host, args.port)), "0")
    if again not in ("0", "EISCONN"):
        problems.append(f"connection {i}: a connect() after completion said {again}")
    t = threading.Thread(target=exchange, args=(i, s))
    t.start()
    threads.append(t)
for t in threads:
    t.join()
ok += results.count("ok")
problems += [f"connection {i}: {r}" for i, r in enumerate(results) if r not in (None, "ok")]
for fd in replaced:
    if not stat.S_ISCHR(os.fstat(fd).st_mode):
        problems.append(f"fd {fd}: no longer /dev/null: the connector wrote over it")
for s in socks:
    s.close()
print(json.dumps({"connections": len(socks), "ok": ok, "problems": problems}))
sys.exit(1 if problems or ok != len(socks) else 0)
