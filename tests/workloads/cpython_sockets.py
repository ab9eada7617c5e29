#!/usr/bin/python3
"""CPython's own socket-level test modules, plain and under slip-run, compared test by test.

Each module of MODULES runs twice with Debian's python3 (`python3 -m test`, its JUnit
report): plain, then under slip-run with a stats file. Every test that passes plain must
pass under slip-run, except the ones KNOWN lists, each with the reason Slipstream differs
there; a known one that passes under slip-run fails the run too (the list must shrink as
the gaps close). The run also fails when the slip-run side accelerated no connection at
all (it would have compared nothing). Needs Debian's libpython3.11-testsuite.

  tests/workloads/cpython_sockets.py --build-dir build [MODULE ...]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

PYTHON = "/usr/bin/python3"
MODULES = ["test_socket", "test_selectors", "test_epoll", "test_poll", "test_select",
           "test_socketserver", "test_asyncio.test_sock_lowlevel",
           "test_asyncio.test_sendfile", "test_asyncio.test_streams", "test_ftplib",
           "test_httplib", "test_ssl"]
# Tests that pass plain and not under slip-run, and why (docs/COMPATIBILITY.md, "Known
# limitations"). Keys end the test ids of the JUnit report: "Class.test", or "test" for
# every class that has it.
KNOWN = {}
# Resources a module needs enabled to run at all (test_socketserver asks for "network";
# it only uses the loopback).
RESOURCES = {"test_socketserver": "network"}
TIMEOUT_S = 900


def outcomes(report):
    """{test id: "ok" | "failed" | "skipped"} from a regrtest JUnit report."""
    result = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = case.get("name", "")
        if case.find("skipped") is not None:
            result[name] = "skipped"
        elif case.find("failure") is not None or case.find("error") is not None:
            result[name] = "failed"
        else:
            result[name] = "ok"
    return result


def run(module, work, slip_run=None):
    tag = "slip" if slip_run else "plain"
    report = work / f"{module}.{tag}.xml"
    cmd = [PYTHON, "-m", "test", "--junit-xml", str(report), "-i", "*VSOCK*", module]
    if module in RESOURCES:
        cmd[3:3] = ["-u", RESOURCES[module]]
    stats = work / f"{module}.stats.jsonl"
    if slip_run:
        cmd = [str(slip_run), f"--stats={stats}", "--", *cmd]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLIP_")}
    with open(work / f"{module}.{tag}.log", "w") as log:
        subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=TIMEOUT_S,
                       cwd=work)
    if not report.exists():
        raise SystemExit(f"{module} ({tag}) wrote no report: see {work}/{module}.{tag}.log")
    return outcomes(report), stats


def known_key(test):
    """The KNOWN entry that covers `test`, or None."""
    parts = test.split(".")
    for key in (".".join(parts[-2:]), parts[-1]):
        if key in KNOWN:
            return key
    return None


def transports(stats):
    counts = {}
    if stats.exists():
        for line in stats.read_text().splitlines():
            for c in json.loads(line).get("connections", []):
                counts[c["transport"]] = counts.get(c["transport"], 0) + 1
    return counts


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("modules", nargs="*", default=MODULES)
    args = parser.parse_args()
    if not Path("/usr/lib/python3.11/test/test_socket.py").exists():
        raise SystemExit("CPython's test suite is missing: apt-get install libpython3.11-testsuite")
    slip_run = Path(args.build_dir).resolve() / "bin" / "slip-run"
    work = Path(tempfile.mkdtemp(prefix="slip-cpython-"))
    problems, total, seen_known, accelerated = [], {}, set(), {}
    for module in args.modules:
        plain, _ = run(module, work)
        slip, stats = run(module, work, slip_run)
        counts = transports(stats)
        for transport, n in counts.items():
            accelerated[transport] = accelerated.get(transport, 0) + n
        passed = sorted(t for t, o in plain.items() if o == "ok")
        lost = [t for t in passed if slip.get(t) != "ok"]
        for test in lost:
            key = known_key(test)
            if key:
                seen_known.add(key)
            else:
                problems.append(f"{module}: {test} passes plain, {slip.get(test, 'missing')} "
                                f"under slip-run")
        known_now_ok = [t for t in passed if known_key(t) and slip.get(t) == "ok"]
        problems += [f"{module}: {t} is listed as a known difference but passes under "
                     f"slip-run: remove it from KNOWN" for t in known_now_ok]
        total[module] = (len(passed), len(passed) - len(lost))
        print(f"{module:36} plain {len(passed):4} passed, slip-run {len(passed) - len(lost):4} "
              f"of them; connections {counts or 'none'}", flush=True)
    for key in sorted(seen_known):
        print(f"known difference: {key}: {KNOWN[key]}")
    if not accelerated.get("shm"):
        problems.append(f"no connection was accelerated under slip-run ({accelerated})")
    print(f"connections under slip-run, by transport: {accelerated}; files in {work}")
    if problems:
        print("FAIL cpython_sockets:\n  " + "\n  ".join(problems))
        sys.exit(1)
    print("PASS cpython_sockets")


if __name__ == "__main__":
    main()
