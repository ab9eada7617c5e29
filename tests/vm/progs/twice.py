"""Echo over N sequential connections (the negative-cache and queue pair reuse tests).

server: accepts --count connections one after another and echoes each until EOF.
client: connects --count times; each time sends random bytes (64 KiB, or with --seed a
random size from 1 B to 512 KiB), reads them back until EOF, compares, and closes; with
--pause it waits that many seconds before the next connection, and with --wait-file F
--wait-before K it waits (up to 60 s) for F to exist before connection K (0-based). Prints
{"connections": N, "ok": N, "bytes": B} (client) or {"served": N}.
"""
import argparse
import json
import os
import random
import socket
import time

parser = argparse.ArgumentParser()
parser.add_argument("role", choices=["server", "client"])
parser.add_argument("--host", required=True)
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--count", type=int, default=2)
parser.add_argument("--seed", type=int, default=None)
parser.add_argument("--pause", type=float, default=0.0)
parser.add_argument("--wait-file", default=None)
parser.add_argument("--wait-before", type=int, default=-1)
args = parser.parse_args()

if args.role == "server":
    with socket.create_server((args.host, args.port)) as listener:
        listener.settimeout(60)
        for _ in range(args.count):
            conn, _ = listener.accept()
            with conn:
                while data := conn.recv(65536):
                    conn.sendall(data)
    print(json.dumps({"served": args.count}))
else:
    rng = random.Random(args.seed)
    ok = 0
    moved = 0
    for i in range(args.count):
        if args.wait_file and i == args.wait_before:
            deadline = time.monotonic() + 60
            while not os.path.exists(args.wait_file) and time.monotonic() < deadline:
                time.sleep(0.05)
        size = 65536 if args.seed is None else rng.choice([1, 100, 4096, rng.randint(1, 1 << 19)])
        payload = rng.randbytes(size) if args.seed is not None else os.urandom(size)
        with socket.create_connection((args.host, args.port), timeout=60) as sock:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
            back = b""
            while chunk := sock.recv(65536):
                back += chunk
        ok += back == payload
        moved += size
        if args.pause and i + 1 < args.count:
            time.sleep(args.pause)
    print(json.dumps({"connections": args.count, "ok": ok, "bytes": moved}))
