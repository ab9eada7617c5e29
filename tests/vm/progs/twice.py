"""Echo over N sequential connections, for the negative-cache test.

server: accepts --count connections one after another and echoes each until EOF.
client: connects --count times; each time sends 64 KiB of random bytes, reads them back,
compares, and closes. Prints {"connections": N, "ok": N} (client) or {"served": N}.
"""
import argparse
import json
import os
import socket

parser = argparse.ArgumentParser()
parser.add_argument("role", choices=["server", "client"])
parser.add_argument("--host", required=True)
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--count", type=int, default=2)
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
    ok = 0
    for _ in range(args.count):
        payload = os.urandom(65536)
        with socket.create_connection((args.host, args.port), timeout=60) as sock:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
            back = b""
            while chunk := sock.recv(65536):
                back += chunk
        ok += back == payload
    print(json.dumps({"connections": args.count, "ok": ok}))
