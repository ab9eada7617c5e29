"""HTTP client for the nginx workload (tests/workloads/run.py): fetches every file of a
directory that nginx serves, over keep-alive connections and over a connection per request,
from several threads at once, and checks each body against the file (SHA-256).

  nginx_client.py --port P --root DIR [--rounds N] [--threads T] [--fresh N]

Prints one JSON line: {"requests", "bytes", "errors", "keepalive_s", "fresh_s"}; exit status
1 when any request failed or returned other bytes than the file's.
"""

import argparse
import hashlib
import http.client
import json
import os
import sys
import threading
import time


def fetch(conn, name):
    conn.request("GET", "/" + name)
    response = conn.getresponse()
    body = response.read()
    return response.status, body


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--fresh", type=int, default=200, help="connection-per-request fetches")
    args = ap.parse_args()
    files = sorted(os.listdir(args.root))
    digests = {}
    for name in files:
        with open(os.path.join(args.root, name), "rb") as f:
            digests[name] = hashlib.sha256(f.read()).hexdigest()
    lock = threading.Lock()
    totals = {"requests": 0, "bytes": 0, "errors": []}

    def check(name, status, body):
        with lock:
            totals["requests"] += 1
            totals["bytes"] += len(body)
            if status != 200 or hashlib.sha256(body).hexdigest() != digests[name]:
                totals["errors"].append(f"{name}: status {status}, {len(body)} bytes, "
                                        f"content differs from the file")

    def keepalive(worker):
        try:
            conn = http.client.HTTPConnection("127.0.0.1", args.port, timeout=30)
            for r in range(args.rounds):
                # Each thread walks the files in its own order.
                order = files[worker % len(files):] + files[:worker % len(files)]
                for name in order:
                    check(name, *fetch(conn, name))
            conn.close()
        except Exception as e:  # noqa: BLE001 (any failure is a failed request)
            with lock:
                totals["errors"].append(f"keep-alive thread {worker}: {e!r}")

    def fresh(worker, count):
        try:
            for i in range(count):
                name = files[(worker * 7 + i) % len(files)]
                conn = http.client.HTTPConnection("127.0.0.1", args.port, timeout=30)
                check(name, *fetch(conn, name))
                conn.close()
        except Exception as e:  # noqa: BLE001
            with lock:
                totals["errors"].append(f"fresh thread {worker}: {e!r}")

    def run_threads(target, extra):
        threads = [threading.Thread(target=target, args=(w, *extra)) for w in range(args.threads)]
        start = time.monotonic()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        return time.monotonic() - start

    keepalive_s = run_threads(keepalive, ())
    fresh_s = run_threads(fresh, (args.fresh // args.threads,))
    report = {"requests": totals["requests"], "bytes": totals["bytes"],
              "errors": totals["errors"][:10], "keepalive_s": keepalive_s, "fresh_s": fresh_s}
    print(json.dumps(report))
    return 1 if totals["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
