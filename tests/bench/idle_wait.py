"""What idle connections cost a wait: a 64-byte ping-pong through epoll_wait on one
connection while N other connections between the same two processes sit idle, plain TCP
and both ends under slip-run, in one run (docs/PERFORMANCE.md).

  /usr/bin/python3 tests/bench/idle_wait.py [BUILD_DIR] [--idle 0,1000,2000] [--seconds 2]

Both processes wait in epoll_wait before every read (the server over all its connections,
the client over the active one only), so every round trip costs two waits on each side.
Prints, per N, the median round trip in microseconds for tcp and shm, and shm/tcp.
"""

import argparse
import json
import os
import selectors
import socket
import statistics
import subprocess
import sys
import time

MSG = b"x" * 64


def serve(port, idle):
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(4096)
    print("listening", flush=True)
    sel = selectors.EpollSelector()
    conns = []
    for _ in range(idle + 1):
        c, _ = ls.accept()
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conns.append(c)
        sel.register(c, selectors.EVENT_READ)
    while True:
        for key, _ in sel.select():
            data = key.fileobj.recv(65536)
            if not data:
                return
            key.fileobj.sendall(data)


def client(port, idle, seconds):
    held = []
    for _ in range(idle):
        s = socket.create_connection(("127.0.0.1", port))
        held.append(s)
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sel = selectors.EpollSelector()
    sel.register(s, selectors.EVENT_READ)
    times = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter_ns()
        s.sendall(MSG)
        got = 0
        while got < len(MSG):
            sel.select()
            got += len(s.recv(65536))
        times.append(time.perf_counter_ns() - t0)
    s.close()
    for h in held:
        h.close()
    print(json.dumps({"median_us": statistics.median(times) / 1000, "rounds": len(times)}))


def run(build, idle, seconds, slip):
    wrap = [os.path.join(build, "bin", "slip-run"), "--"] if slip else []
    port = 20000 + (os.getpid() * 7 + idle) % 20000
    me = [sys.executable, os.path.abspath(__file__)]
    server = subprocess.Popen(wrap + me + ["--serve", str(port), "--idle", str(idle)],
                              stdout=subprocess.PIPE, text=True)
    try:
        if server.stdout.readline().strip() != "listening":
            raise RuntimeError("the server did not start")
        out = subprocess.run(wrap + me + ["--client", str(port), "--idle", str(idle),
                                          "--seconds", str(seconds)],
                             capture_output=True, text=True, timeout=seconds + 120, check=True)
        return json.loads(out.stdout.splitlines()[-1])["median_us"]
    finally:
        server.wait(timeout=30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build", nargs="?", default="build")
    ap.add_argument("--idle", default="0,1000,2000")
    ap.add_argument("--seconds", type=float, default=2)
    ap.add_argument("--serve", type=int)
    ap.add_argument("--client", type=int)
    args = ap.parse_args()
    if args.serve:
        return serve(args.serve, int(args.idle))
    if args.client:
        return client(args.client, int(args.idle), args.seconds)
    print("| idle connections | tcp (us) | shm (us) | shm/tcp |")
    print("| ---: | ---: | ---: | ---: |")
    for idle in (int(n) for n in args.idle.split(",")):
        tcp = run(args.build, idle, args.seconds, False)
        shm = run(args.build, idle, args.seconds, True)
        print(f"| {idle} | {tcp:.1f} | {shm:.1f} | {shm / tcp:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
