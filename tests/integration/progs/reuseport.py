"""Servers that share a port, and a storm of connections to them.

  server: one member of a group on PORT. By default a listener of its own with SO_REUSEPORT
          (what gRPC, nginx `reuseport` and Envoy do: the kernel hands each SYN to one
          member); --sockets N: N such listeners in this one process, a thread each. With --workers N, one listener without SO_REUSEPORT whose N forked
          workers all accept on it (pre-forked servers sharing an inherited listener).
          Each connection: the client sends an 8-byte header (payload size, seed) and the
          payload; the server answers a JSON line {"member", "sha256" of what it read, "size"
          of its reply} and a reply of seeded random bytes, then closes. Runs until SIGTERM
          (SIGINT); prints {"member", "pid", "peers": [client ports]} per process at exit.
  client: --count connections, --parallel at a time, random payload sizes both ways; checks
          every byte of both directions; prints {"accepted": [[client port, member], ...]}
          (a port may come twice: the kernel reuses a closed connection's).
"""

import hashlib
import json
import os
import random
import signal
import socket
import struct
import sys
import threading

from common import LOOPBACK, argument_parser, fail, recv_exact, report

MAX_PAYLOAD = 200 * 1024


def reply_size(seed):
    return (seed * 7919) % MAX_PAYLOAD


def serve_one(conn, member):
    with conn:
        size, seed = struct.unpack("<QQ", recv_exact(conn, 16))
        digest = hashlib.sha256()
        left = size
        while left:
            chunk = conn.recv(min(left, 1 << 16))
            if not chunk:
                raise ConnectionError("EOF in the payload")
            digest.update(chunk)
            left -= len(chunk)
        reply = random.Random(seed).randbytes(reply_size(seed))
        head = json.dumps({"member": member, "sha256": digest.hexdigest(),
                           "size": len(reply)}).encode() + b"\n"
        conn.sendall(head + reply)


def serve(listeners, member):
    """Accepts on every listener (one thread each after the first) until SIGTERM."""
    peers = []
    lock = threading.RLock()  # (the signal handler runs on the main thread, maybe inside it)

    def finish(*_):
        # (A worker gets SIGTERM twice: the harness signals the process group, the parent
        # each worker. The second, in the interpreter's shutdown, where Python has put the
        # default action back, would kill it before the library wrote its statistics.)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        with lock:
            report(member=member, pid=os.getpid(), peers=list(peers))
        sys.exit(0)  # (an orderly exit: the library writes its statistics)

    def accept_on(listener, name):
        while True:
            conn, peer = listener.accept()
            with lock:
                peers.append(peer[1])
            threading.Thread(target=serve_one, args=(conn, name), daemon=True).start()

    signal.signal(signal.SIGTERM, finish)
    signal.signal(signal.SIGINT, finish)
    names = [member] if len(listeners) == 1 else [f"{member}{i}" for i in range(len(listeners))]
    for listener, name in list(zip(listeners, names))[1:]:
        threading.Thread(target=accept_on, args=(listener, name), daemon=True).start()
    accept_on(listeners[0], names[0])


def listen(args):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if not args.workers:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    listener.bind((args.bind, args.port))
    listener.listen(256)
    return listener


def server(args):
    if not args.workers:
        serve([listen(args) for _ in range(args.sockets)], args.member)
    listener = listen(args)
    children = []
    for worker in range(args.workers):
        pid = os.fork()
        if pid == 0:
            serve([listener], f"{args.member}.{worker}")  # (until SIGTERM exits the process)
        children.append(pid)

    def stop(*_):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for pid in children:
            os.kill(pid, signal.SIGTERM)
        statuses = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]
        report(member=args.member, pid=os.getpid(), peers=[], workers=statuses)
        sys.exit(0 if not any(statuses) else 1)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while True:
        signal.pause()


def client(args):
    rng = random.Random(args.seed)
    jobs = [(rng.randrange(MAX_PAYLOAD), rng.getrandbits(48)) for _ in range(args.count)]
    accepted, errors = [], []
    lock = threading.Lock()
    next_job = iter(jobs)

    def run():
        while True:
            with lock:
                job = next(next_job, None)
            if job is None:
                return
            size, seed = job
            payload = random.Random(seed ^ 0x5EED).randbytes(size)
            try:
                with socket.create_connection((args.host, args.port), timeout=30) as sock:
                    port = sock.getsockname()[1]
                    sock.sendall(struct.pack("<QQ", size, seed) + payload)
                    line = b""
                    while not line.endswith(b"\n"):
                        line += recv_exact(sock, 1)
                    said = json.loads(line)
                    reply = recv_exact(sock, said["size"])
                    if sock.recv(1):
                        raise ValueError("bytes after the reply")
            except (OSError, ValueError) as e:
                with lock:
                    errors.append(f"{type(e).__name__}: {e}")
                continue
            problem = None
            if said["sha256"] != hashlib.sha256(payload).hexdigest():
                problem = f"port {port}: the server read other bytes than were sent"
            elif reply != random.Random(seed).randbytes(reply_size(seed)):
                problem = f"port {port}: the reply differs"
            with lock:
                if problem:
                    errors.append(problem)
                accepted.append([port, said["member"]])

    threads = [threading.Thread(target=run) for _ in range(args.parallel)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        fail(f"{len(errors)} connection(s) failed: {errors[:5]}")
    report(accepted=accepted)


def main():
    parser = argument_parser(__doc__, role=True)
    parser.add_argument("--member", default="0", help="server: this member's name")
    parser.add_argument("--workers", type=int, default=0,
                        help="server: forked workers sharing one listener (no SO_REUSEPORT)")
    parser.add_argument("--sockets", type=int, default=1,
                        help="server: SO_REUSEPORT listeners in this process (members "
                             "MEMBER0, MEMBER1, ... when more than one)")
    parser.add_argument("--count", type=int, default=100, help="client: connections")
    parser.add_argument("--parallel", type=int, default=8, help="client: at a time")
    parser.add_argument("--seed", type=int, default=1, help="client: payload seed")
    args = parser.parse_args()
    server(args) if args.role == "server" else client(args)


if __name__ == "__main__":
    main()
