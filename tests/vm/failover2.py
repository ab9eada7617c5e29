#!/usr/bin/python3
"""Failover across two hosts: two Soft-RoCE guests (tests/vm/rxe-run2) joined by one link.

    tests/vm/failover2.py [BUILD_DIR]          (from the host; ctest runs it as vm.failover2)

Guest 1 serves, guest 2 connects, both under slip-run with the default transports, and 16 MiB
flow each way (tests/vm/failover2-guest.sh). Once RDMA carries the streams, guest 2 deletes its
RDMA device. Guest 2's end hears DEVICE_REMOVAL; guest 1's end keeps its device and only learns
of the loss from guest 2's FAILOVER on the TCP connection (or from its queue pair's retries).
Checked: both streams arrive intact (SHA-256 of what each end sent against what the other
received), each end's stats say transport "tcp", reason "failover" (so it started on verbs and
failed over), with the byte counts the programs moved, and each end's log says why.
Exit status 0 when all of that holds; prints one line per check and "N passed, N failed".
"""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
TOTAL = int(os.environ.get("SLIP_FAILOVER2_TOTAL", 16 << 20))


def guest_lines(output, node):
    prefix = f"[vm{node}] "
    return [line[len(prefix):] for line in output.splitlines() if line.startswith(prefix)]


def tagged(lines, tag):
    return [line[len(tag) + 1:] for line in lines if line.startswith(tag + " ")]


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    port = random.randrange(20000, 30000)
    script = "tests/vm/failover2-guest.sh"
    env = dict(os.environ)
    env.setdefault("SLIP_VM_TIMEOUT", "400")
    done = subprocess.run([str(HERE / "rxe-run2"), f"{script} server {build} {port} {TOTAL}",
                           f"{script} client {build} {port} {TOTAL}"],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    output = done.stdout + done.stderr
    results = {}
    checks = []

    def check(ok, what):
        checks.append((bool(ok), what))
        print(("PASS " if ok else "FAIL ") + what)

    check(done.returncode == 0, f"both guests ran to the end (rxe-run2 status {done.returncode})")
    for node, role in ((1, "server"), (2, "client")):
        lines = guest_lines(output, node)
        try:
            result = json.loads(tagged(lines, "@result")[0])
            stats = json.loads(tagged(lines, "@stats")[0])
        except (IndexError, json.JSONDecodeError):
            result, stats = {}, {}
        results[role] = (result, stats, tagged(lines, "@log"))
    print("\n".join(line for line in output.splitlines() if "@deleted" in line))
    server, client = results["server"][0], results["client"][0]
    for sender, receiver, direction in ((client, server, "client -> server"),
                                        (server, client, "server -> client")):
        check(sender.get("sent") == TOTAL and sender.get("sent") == receiver.get("received") and
              sender.get("sent_sha256") == receiver.get("received_sha256"),
              f"{direction}: {TOTAL} bytes intact")
    for role, (result, stats, log) in results.items():
        conns = stats.get("connections", [])
        moved = (result.get("sent"), result.get("received"))
        check(len(conns) == 1 and conns[0].get("transport") == "tcp" and
              conns[0].get("reason") == "failover" and
              (conns[0].get("bytes_sent"), conns[0].get("bytes_received")) == moved,
              f"{role}: stats say tcp/failover with the bytes moved ({conns})")
        check(any("continues on TCP" in line for line in log),
              f"{role}: its log says why: {[line for line in log if 'verbs' in line][:3]}")
    failed = sum(1 for ok, _ in checks if not ok)
    if failed:
        print("--- output of the guests:")
        print(output[-6000:])
    print(f"{len(checks) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
