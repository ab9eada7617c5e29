"""Runs one stress test: `run.py [options] CASE VARIANT`, e.g. `run.py storm 300`.

`run.py --list` prints every test as CASE.VARIANT (CMake registers these).
Each test runs `storm` (storm.c: a server and a client, single-threaded epoll loops) twice:
first both plain (the reference and the kernel-TCP timing), then both under slip-run. The
client stops at gates (before its first connection, between phases); at each gate this
runner reads /proc of both processes: open descriptors, descriptors and mappings of
Slipstream's memfd regions, RSS; and /dev/shm for slipstream-* files. Then it checks:
  - content: every request checked byte by byte by the server, every reply by the client,
    and the counts (connections, bytes) of both sides and of the stats agree;
  - transports: every connection of the Slipstream run is `shm` on both ends;
  - no leaks: once every connection is closed, each process is back to its descriptor
    baseline (the one after the first phase, which may hold the shim's few per-process
    descriptors, at most SHIM_FDS more than before any connection), holds no memfd region,
    its RSS grew by a bounded amount, and no slipstream-* file is left in /dev/shm.
Cases:
  conns.N   N concurrent connections in one process pair (blocking connects one after
            another), then every request and reply with all N open, then all closed.
  storm.C   rounds of short-lived connections (C in flight; connect, request, reply, the
            server closes, EOF, close), like `wrk -c C -H 'Connection: close'`.
Both print connection setup rates, plain TCP vs Slipstream (same run); the test does not
judge them.
  faults.V  fault injection: libslipfault.so (faultinject.cc), preloaded before the shim,
            fails the shim's own calls (fd_sweep: descriptors; alloc_sweep: operator new;
            memfd_mmap: memfd and its mappings; sock_sweep: rendezvous socket calls; random:
            several classes at random, on both sides) in short storms; every run must end
            with both programs exiting 0, every byte as sent, no reset and no hang. Prints
            which call failed where in the shim and the transports it left.
Reuses ../integration/harness.py (SLIP_BUILD_DIR, SLIP_TEST_PLAIN=1).
"""

import json
import os
import re
import resource
import signal
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))

from harness import TestFailure, is_listening, pick_port, port_of  # noqa: E402
from harness import main as harness_main  # noqa: E402

SHIM_FDS = 8  # descriptors the shim may keep per process once it has accelerated one
SETTLE_S = 10  # how long closed connections may take to disappear from /proc
PHASE_TIMEOUT_S = 60  # a phase (a round, opening N connections, ...) must end by then
EXIT_TIMEOUT_S = 30
MAX_REQUEST = 1024  # request and reply sizes: 1..MAX bytes, derived from the connection id
MAX_REPLY = 4096
STORM_ROUNDS = 5
STORM_PER_ROUND = 1500  # 5 x 1500 = 7,500 connections per process: within the 8,192 stats
#                         slots, so that the exit record lists every one (dropped == 0)
HOLD_RSS_GROWTH_MB = 64  # after closing N connections, against before the first
STORM_RSS_GROWTH_MB = 8  # after the last round, against after the first
# The sanitizer run of the suite (make test-sanitize-suite): the runtime to preload in every
# program, and no RSS bounds (the sanitizer's allocator keeps freed memory aside).
SANITIZER_RUNTIME = os.environ.get("SLIP_TEST_SANITIZER_RUNTIME", "")
if SANITIZER_RUNTIME:
    HOLD_RSS_GROWTH_MB = STORM_RSS_GROWTH_MB = float("inf")
CASES = {}


def case(name, variants):
    def register(function):
        CASES[name] = (function, tuple(variants))
        return function
    return register


def preload_order(fault_library, shim):
    """The fault library first (it passes the program's calls on and fails the shim's),
    then the shim, then a sanitizer's runtime, as its slip-run puts it: before the shim, the
    program's blocking calls would enter the shim inside the runtime's own interceptor,
    which (ThreadSanitizer's) ignores every lock taken until the call returns."""
    return (str(fault_library), str(shim), SANITIZER_RUNTIME)


def storm_binary(t):
    if t.settings.build_dir is None:
        raise TestFailure("no build directory: pass --build-dir or set SLIP_BUILD_DIR")
    path = t.settings.build_dir / "tests" / "stress" / "slip_stress_storm"
    t.check(path.is_file(), f"{path} not built")
    return str(path)


def raise_nofile():
    """The soft descriptor limit to the hard one, before any program starts: the shim
    places its hidden descriptors from the soft limit it finds at start-up."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


# ---------------------------------------------------------------------------------------
# What a process holds.


def snapshot(pid):
    """Descriptors, Slipstream memfd descriptors and mappings, and RSS of a live process."""
    fd_dir = Path(f"/proc/{pid}/fd")
    targets = []
    for entry in os.listdir(fd_dir):
        try:
            targets.append(os.readlink(fd_dir / entry))
        except FileNotFoundError:  # closed meanwhile
            pass
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    rss_kb = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss_kb = int(line.split()[1])
    return {
        "fds": len(targets),
        "memfd_fds": sum(1 for x in targets if x.startswith("/memfd:slip")),
        "memfd_maps": sum(1 for x in maps if "memfd:slip" in x),
        "rss_kb": rss_kb,
        "targets": targets,
    }


def kinds(targets):
    """Descriptor targets grouped by kind: socket, anon_inode:[eventpoll], /memfd:..."""
    counts = {}
    for x in targets:
        k = re.sub(r"\[\d+\]$", "", x)
        k = re.sub(r"^/proc/\d+/", "/proc/PID/", k)
        counts[k] = counts.get(k, 0) + 1
    return counts


def shm_files():
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith("slipstream")}
    except FileNotFoundError:
        return set()


def pid_alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def fmt_snap(s):
    return (f"{s['fds']} fds ({s['memfd_fds']} memfd), {s['memfd_maps']} memfd mappings, "
            f"RSS {s['rss_kb'] / 1024:.1f} MiB")


class Pair:
    """A storm server and client, plain or both under slip-run, and their /proc."""

    def __init__(self, t, tag, slip, server_mode, client_args):
        self.t, self.tag = t, tag
        self.slip = slip and not t.settings.plain
        self.port = pick_port()
        self.gate = t.dir / f"{tag}.gate"
        self.gate.mkdir()
        exe = storm_binary(t)
        sizes = ["--max-reply", MAX_REPLY]
        self.server = t.start(f"{tag}-server", [exe, "serve", "--port", self.port, "--mode",
                                                server_mode, *sizes], "server", slip)
        self.server.wait_until(lambda: is_listening(self.port), f"a listener on {self.port}")
        self.client = t.start(f"{tag}-client", [exe, "client", "--port", self.port,
                                                *map(str, client_args), "--gate", self.gate,
                                                "--max-request", MAX_REQUEST, *sizes],
                              "client", slip)
        self.procs = {"server": self.server, "client": self.client}
        self.pids = {name: p.popen.pid for name, p in self.procs.items()}
        self.events = []

    def wait_gate(self, k):
        """Waits for the client to stop at gate k; returns the JSON lines it printed
        since the previous gate."""
        marker = f"GATE {k}"
        self.client.wait_until(lambda: marker in self.client.stdout().splitlines(),
                               f"the client at gate {k}", timeout=PHASE_TIMEOUT_S)
        lines = self.client.stdout().splitlines()
        events = [json.loads(x) for x in lines[:lines.index(marker)] if x.startswith("{")]
        new, self.events = events[len(self.events):], events
        return new

    def open_gate(self, k):
        (self.gate / f"go.{k}").touch()

    def snapshots(self):
        return {name: snapshot(pid) for name, pid in self.pids.items()}

    def settle(self, want, what):
        """Polls both processes until `want(name, snap)` holds for each (every connection's
        resources gone), for at most SETTLE_S. Returns the snapshots; fails with what is
        still held otherwise."""
        deadline = time.monotonic() + SETTLE_S
        while True:
            snaps = self.snapshots()
            bad = {name: s for name, s in snaps.items() if not want(name, s)}
            if not bad:
                return snaps
            if time.monotonic() > deadline:
                raise TestFailure(f"{self.tag}: {what}, not reached within {SETTLE_S} s: " + "; ".join(
                    f"{name} (pid {self.pids[name]}): {fmt_snap(s)}, descriptors by kind "
                    f"{kinds(s['targets'])}" for name, s in bad.items()))
            time.sleep(0.05)

    def finish(self):
        """After the client's last gate: waits for it to exit, stops the server (every
        connection already closed); returns their reports."""
        self.client.expect_exit(0, EXIT_TIMEOUT_S)
        self.server.signal(signal.SIGTERM)
        self.server.expect_exit(0, EXIT_TIMEOUT_S)
        return self.server.json_output(), self.client.json_output()

    def check_stats(self, total, client_bytes):
        """Slipstream run: each side wrote one record listing all `total` connections, all
        shm, and the byte counts of the programs. Plain: no stats."""
        t = self.t
        for name, p in self.procs.items():
            if not self.slip:
                t.expect_no_stats(p)
                continue
            records = p.stats_records()
            t.check(len(records) == 1, f"{p.name}: {len(records)} stats lines, expected 1")
            rec = records[0]
            t.check(rec.get("dropped") == 0, f"{p.name}: stats dropped={rec.get('dropped')}")
            conns = rec["connections"]
            by = {}
            for c in conns:
                key = (c["transport"], c["reason"])
                by[key] = by.get(key, 0) + 1
            t.check(len(conns) == total and by.get(("shm", ""), 0) == total,
                    f"{p.name}: expected {total} connections, all shm; stats list {len(conns)}: "
                    f"{by}")
            sent = sum(c["bytes_sent"] for c in conns)
            received = sum(c["bytes_received"] for c in conns)
            want = client_bytes if name == "client" else client_bytes[::-1]
            t.check((sent, received) == want, f"{p.name}: stats count {sent} B sent, {received}"
                                              f" B received; the programs moved {want}")
            port_key = "local" if name == "server" else "remote"
            t.check(all(int(c[port_key].rsplit(":", 1)[1]) == self.port for c in conns),
                    f"{p.name}: a connection not on port {self.port}")
        return "shm" if self.slip else "tcp"


def check_reports(t, tag, server, client, total, hold):
    t.check(client["errors"] == 0 and client["ok"] == total,
            f"{tag}: client checked {client['ok']} of {total} replies, errors "
            f"{client['errors']}: {client['first_errors']}")
    t.check(server["errors"] == 0 and server["bad_requests"] == 0,
            f"{tag}: server errors {server['errors']}: {server['first_errors']}")
    t.check(server["accepted"] == total and server["served"] == total and
            server["open_at_exit"] == 0,
            f"{tag}: server accepted {server['accepted']}, served {server['served']}, "
            f"{server['open_at_exit']} still open; expected {total}, {total}, 0")
    t.check((server["bytes_in"], server["bytes_out"]) == (client["bytes_out"], client["bytes_in"]),
            f"{tag}: the server read {server['bytes_in']} B and wrote {server['bytes_out']} B, "
            f"the client wrote {client['bytes_out']} B and read {client['bytes_in']} B")
    if hold:
        t.check(server["max_open"] == total, f"{tag}: the server had at most "
                                             f"{server['max_open']} connections open, not {total}")


def check_shm_dir(t, before, pairs):
    """No slipstream-* file in /dev/shm left by the test's processes (all exited): none
    named after their pids, and no new name other than a live process's stats file."""
    ours = {str(pid) for p in pairs for pid in p.pids.values()}
    left = []
    for name in shm_files() - before:
        m = re.fullmatch(r"slipstream-stats\.(\d+)(\.[0-9a-f]{16})?", name)
        if m and m.group(1) not in ours and pid_alive(int(m.group(1))):
            continue  # another process on this host, running now
        left.append(name)
    t.check(not left, f"/dev/shm still holds {sorted(left)} after every process exited")


def check_shm_live(t, pair):
    """While they run: slipstream-* files of our processes are their stats files only."""
    for name, pid in pair.pids.items():
        odd = [f for f in shm_files()
               if re.search(rf"\D{pid}$", f) and f != f"slipstream-stats.{pid}"]
        t.check(not odd, f"{pair.tag}: /dev/shm holds {odd} for the {name} (pid {pid})")


def rate_table(title, rows):
    print(f"{title}: plain TCP vs Slipstream (same run)")
    print(f"  {'what':44} {'plain':>10} {'slip':>10} {'slip/plain':>10}")
    for label, a, b in rows:
        print(f"  {label:44} {a:10.1f} {b:10.1f} {b / a if a else float('nan'):9.3f}x")


# ---------------------------------------------------------------------------------------


def hold_run(t, tag, slip, n):
    p = Pair(t, tag, slip, "hold", ["--mode", "hold", "--conns", n])
    p.wait_gate(0)
    base = p.snapshots()
    print(f"{tag}: before the first connection: " +
          "; ".join(f"{k} {fmt_snap(s)}" for k, s in base.items()))
    p.open_gate(0)
    (opened,) = p.wait_gate(1)
    held = p.snapshots()
    # The server maps a region when it reads the registration (its control thread, as they
    # come); its client does not wait for that, so it may still be a few behind.
    settle_by = time.monotonic() + 3
    while p.slip and any(s["memfd_maps"] < n for s in held.values()) and \
            time.monotonic() < settle_by:
        time.sleep(0.2)
        held = p.snapshots()
    check_shm_live(t, p)
    print(f"{tag}: {n} connections open: " + "; ".join(
        f"{k} {fmt_snap(s)}, {(s['fds'] - base[k]['fds']) / n:.2f} fds and "
        f"{(s['rss_kb'] - base[k]['rss_kb']) / n:.1f} KiB RSS per connection"
        for k, s in held.items()))
    for name, s in held.items():
        t.check(s["fds"] >= base[name]["fds"] + n,
                f"{tag}: the {name} holds {s['fds']} descriptors with {n} connections open")
        if p.slip:  # every connection's region is mapped in both processes at once
            t.check(s["memfd_maps"] >= n, f"{tag}: the {name} maps {s['memfd_maps']} Slipstream "
                                          f"regions with {n} accelerated connections open")
    p.open_gate(1)
    (closed,) = p.wait_gate(2)
    after = p.settle(lambda name, s: s["memfd_fds"] == 0 and s["memfd_maps"] == 0 and
                     s["fds"] <= base[name]["fds"] + (SHIM_FDS if p.slip else 0),
                     f"every descriptor and mapping of the {n} connections closed")
    print(f"{tag}: all closed: " + "; ".join(f"{k} {fmt_snap(s)}" for k, s in after.items()))
    for name, s in after.items():
        growth = (s["rss_kb"] - base[name]["rss_kb"]) / 1024
        t.check(growth <= HOLD_RSS_GROWTH_MB, f"{tag}: the {name}'s RSS grew by {growth:.1f} MiB "
                                              f"(bound {HOLD_RSS_GROWTH_MB} MiB)")
    p.open_gate(2)
    server, client = p.finish()
    check_reports(t, tag, server, client, n, hold=True)
    transport = p.check_stats(n, (client["bytes_out"], client["bytes_in"]))
    print(f"{tag}: {n} connections, each {transport} on both ends, content checked")
    return p, opened, closed


@case("conns", ["2000"])
def conns(t, variant):
    n = int(variant)
    hard = raise_nofile()
    # Per process: one descriptor per connection, four hidden ones (placed in the upper
    # half of the limit) under Slipstream.
    t.check(hard >= 6 * n, f"the hard RLIMIT_NOFILE is {hard}; {n} accelerated connections "
                           f"need about {6 * n} (raise it: ulimit -Hn)")
    before = shm_files()
    pairs = []
    results = {}
    for tag, slip in (("plain", False), ("slip", True)):
        p, opened, closed = hold_run(t, tag, slip, n)
        pairs.append(p)
        results[tag] = (opened, closed)
    check_shm_dir(t, before, pairs)
    (po, pc), (so, sc) = results["plain"], results["slip"]
    rate_table(f"conns.{n}", [
        (f"connect, one after another (conn/s)", n / po["connect_s"], n / so["connect_s"]),
        (f"request+reply on all {n} (ms)", po["exchange_s"] * 1e3, so["exchange_s"] * 1e3),
        (f"close all {n} (ms)", pc["close_s"] * 1e3, sc["close_s"] * 1e3),
    ])


def storm_run(t, tag, slip, concurrency):
    p = Pair(t, tag, slip, "close", ["--mode", "storm", "--conns", STORM_PER_ROUND,
                                     "--concurrency", concurrency, "--rounds", STORM_ROUNDS])
    p.wait_gate(0)
    base0 = p.snapshots()
    print(f"{tag}: before the first connection: " +
          "; ".join(f"{k} {fmt_snap(s)}" for k, s in base0.items()))
    p.open_gate(0)
    rounds = []
    base1 = None
    for r in range(1, STORM_ROUNDS + 1):
        (event,) = p.wait_gate(r)
        t.check(event["errors"] == 0 and event["ok"] == STORM_PER_ROUND,
                f"{tag} round {r}: {event}; client stderr: {p.client.stderr()[-1500:]}")
        rounds.append(event)
        check_shm_live(t, p)
        if base1 is None:
            # After the first round: back to the descriptors before it, plus at most the
            # shim's per-process few.
            snaps = p.settle(lambda name, s: s["memfd_fds"] == 0 and s["memfd_maps"] == 0 and
                             s["fds"] <= base0[name]["fds"] + (SHIM_FDS if p.slip else 0),
                             f"round 1's {STORM_PER_ROUND} connections gone")
            base1 = snaps
        else:
            snaps = p.settle(lambda name, s: s["memfd_fds"] == 0 and s["memfd_maps"] == 0 and
                             s["fds"] == base1[name]["fds"],
                             f"round {r}: back to the descriptors after round 1")
        print(f"{tag} round {r}: {event['conns']} connections ({concurrency} in flight), "
              f"{event['conns_per_s']:.0f} conn/s; " +
              "; ".join(f"{k} {fmt_snap(s)}" for k, s in snaps.items()))
        p.open_gate(r)
    for name in ("server", "client"):
        growth = (snaps[name]["rss_kb"] - base1[name]["rss_kb"]) / 1024
        t.check(growth <= STORM_RSS_GROWTH_MB,
                f"{tag}: the {name}'s RSS grew by {growth:.1f} MiB from round 1 to round "
                f"{STORM_ROUNDS} (bound {STORM_RSS_GROWTH_MB} MiB)")
    server, client = p.finish()
    total = STORM_ROUNDS * STORM_PER_ROUND
    check_reports(t, tag, server, client, total, hold=False)
    transport = p.check_stats(total, (client["bytes_out"], client["bytes_in"]))
    print(f"{tag}: {total} connections, each {transport} on both ends, content checked")
    return p, rounds


@case("storm", ["200", "500"])
def storm(t, variant):
    concurrency = int(variant)
    hard = raise_nofile()
    t.check(hard >= 6 * concurrency + 100, f"the hard RLIMIT_NOFILE ({hard}) is too low")
    before = shm_files()
    pairs, rates = [], {}
    for tag, slip in (("plain", False), ("slip", True)):
        p, rounds = storm_run(t, tag, slip, concurrency)
        pairs.append(p)
        rates[tag] = [e["conns_per_s"] for e in rounds]
    check_shm_dir(t, before, pairs)
    rows = [(f"round {i + 1} (conn/s)", a, b)
            for i, (a, b) in enumerate(zip(rates["plain"], rates["slip"]))]
    rows.append(("median of the rounds (conn/s)", statistics.median(rates["plain"]),
                 statistics.median(rates["slip"])))
    rate_table(f"storm.{variant}: {STORM_PER_ROUND} connections a round, {concurrency} in "
               f"flight, connect + request + reply + close", rows)


# ---------------------------------------------------------------------------------------
# Fault injection (faults.*): libslipfault.so (faultinject.cc) preloaded before the shim
# fails the shim's own calls, one class at a time: descriptors, memfd, shared mappings,
# allocations, rendezvous socket calls. Each run is a short storm; whatever failed, both
# programs must exit 0 (not by a signal), every byte must arrive as sent, no connection may
# be reset, nothing may hang; plain TCP is a fine outcome for a connection that hit a fault.

FAULT_CLASSES = ("fd", "memfd", "mmap", "alloc", "sock")
SWEEP_CONNS = 3  # a sweep run's connections, one after another: each call has one place
RANDOM_CONNS, RANDOM_CONCURRENCY, RANDOM_SEEDS, RANDOM_PROB = 20, 4, 40, 0.03
RUN_TIMEOUT_S = 15  # a run's client must be done by then (storm itself gives up at 20 s)
CASE_BUDGET_S = 55  # a case stops sweeping (and says so) once it has run this long
FAULT_SIDES = ("server", "client")
# SLIPFAULT count=1: that call only ("once"); count=0: every one from it on ("from"), a
# process that stays at its limit. A "from" run whose rendezvous stays deaf costs its
# clients the handshake timeout per connection: fewer positions, a shorter timeout.
SWEEP_MODES = (("once", 1, 70), ("from", 0, 16))  # (mode, count, positions at most)
FAULT_HANDSHAKE_TIMEOUT_MS = 300  # SLIP_HANDSHAKE_TIMEOUT_MS of the runs that inject
RANDOM_SITES = "fd+memfd+mmap+sock+alloc"
SHIM_OFF = "Slipstream disabled for this process"  # its line on stderr (core/config.cc)


def fault_library(t):
    """Under a sanitizer, the variant without the allocation class: the sanitizer's
    allocator must see every allocation (so there alloc_sweep injects nothing)."""
    name = "libslipfault-noalloc.so" if SANITIZER_RUNTIME else "libslipfault.so"
    path = t.settings.build_dir / "tests" / "stress" / name
    t.check(path.is_file(), f"{path} not built")
    return path


def signal_name(rc):
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


def gdb_backtraces(pid, path):
    """Best effort: every thread's stack of a hung process, into `path`."""
    try:
        out = subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt"],
                             capture_output=True, text=True, timeout=60)
        path.write_text(out.stdout + out.stderr)
        return path
    except (OSError, subprocess.SubprocessError):
        return None


def read_jsonl(path):
    if not path.exists():
        return []
    lines = []
    for line in path.read_text().splitlines():
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError:
            lines.append({"unparsable": line[:300]})
    return lines


def fault_run(t, tag, specs, conns=SWEEP_CONNS, concurrency=1):
    """One storm of `conns` connections (`concurrency` in flight), server and client each
    with the fault library and the shim preloaded (in that order), SLIPFAULT=specs[side].
    Returns what happened: "problems" (empty when every check held), per side the
    connections' transports in order ("shm", "tcp/REASON"), the fault report."""
    lib, shim = fault_library(t), t.settings.build_dir / "lib" / "libslipstream.so"
    exe = storm_binary(t)
    port = pick_port()
    gate = t.dir / f"{tag}.gate"
    gate.mkdir()
    for k in (0, 1):  # the client does not stop
        (gate / f"go.{k}").touch()
    started = len(t.procs)
    procs, reports = {}, {}
    problems = []

    def start(side, argv):
        name = f"{tag}-{side}"
        reports[side] = t.dir / f"{name}.faults.jsonl"
        env = {"SLIP_STATS_FILE": str(t.dir / f"{name}.stats.jsonl"),
               "SLIPFAULT_REPORT": str(reports[side])}
        if not t.settings.plain:
            env["LD_PRELOAD"] = ":".join(x for x in preload_order(lib, shim) if x)
            env["SLIPFAULT"] = specs.get(side, "")
            if specs:
                env["SLIP_HANDSHAKE_TIMEOUT_MS"] = str(FAULT_HANDSHAKE_TIMEOUT_MS)
        p = t.start(name, argv, side, slip=False, env=env)
        p.slip = not t.settings.plain  # (for the failure report: under Slipstream)
        procs[side] = p
        return p

    t0 = time.monotonic()
    sizes = ["--max-reply", MAX_REPLY]
    server = start("server", [exe, "serve", "--port", port, "--mode", "close", *sizes])
    try:
        server.wait_until(lambda: is_listening(port), f"a listener on {port}")
    except TestFailure as e:
        problems.append(f"server: {e}")
    if not problems:
        client = start("client", [exe, "client", "--port", port, "--mode", "storm", "--conns",
                                  conns, "--concurrency", concurrency, "--rounds", 1, "--gate",
                                  gate, "--max-request", MAX_REQUEST, *sizes])
        try:
            client.popen.wait(RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            problems.append(f"hang: the client was not done after {RUN_TIMEOUT_S} s")
            for side, p in procs.items():
                bt = gdb_backtraces(p.popen.pid, t.dir / f"{tag}-{side}.hang-backtrace.txt")
                if bt:
                    problems.append(f"{side} stacks: {bt}")
            client.kill()
    seconds = time.monotonic() - t0
    server.signal(signal.SIGTERM)
    try:
        server.popen.wait(EXIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        problems.append(f"hang: the server did not exit within {EXIT_TIMEOUT_S} s of SIGTERM")
        server.kill()
    hung = any(x.startswith("hang") for x in problems)
    for side, p in procs.items():
        rc = p.popen.returncode
        if rc is not None and rc < 0 and not (side == "client" and hung):
            said = [x for x in p.stderr().splitlines() if x and not x.startswith("slipfault:")]
            problems.append(f"{side} died of {signal_name(rc)}" +
                            (f" ({said[-1].strip()})" if said else ""))
        elif rc is not None and rc > 0:
            problems.append(f"{side} exited with status {rc}")

    # Content: each program's own byte-by-byte checks and counts, and that they agree.
    out = {}
    for side, p in procs.items():
        try:
            out[side] = p.json_output()
        except TestFailure as e:
            problems.append(str(e))
    if len(out) == 2:
        c, sv = out["client"], out["server"]
        if c.get("errors") or c.get("ok") != conns:
            problems.append(f"client: {c.get('ok')} of {conns} replies checked, errors "
                            f"{c.get('errors')}: {c.get('first_errors')}")
        if sv.get("errors") or sv.get("bad_requests"):
            problems.append(f"server: errors {sv.get('errors')}: {sv.get('first_errors')}")
        if (sv.get("accepted"), sv.get("served"), sv.get("open_at_exit")) != (conns, conns, 0):
            problems.append(f"server: accepted {sv.get('accepted')}, served {sv.get('served')}, "
                            f"{sv.get('open_at_exit')} open at exit; expected {conns}, {conns}, 0")
        if (sv.get("bytes_in"), sv.get("bytes_out")) != (c.get("bytes_out"), c.get("bytes_in")):
            problems.append(f"bytes: the server read {sv.get('bytes_in')} and wrote "
                            f"{sv.get('bytes_out')}, the client wrote {c.get('bytes_out')} and "
                            f"read {c.get('bytes_in')}")

    # Transports, from the stats exit records: one per process, every connection listed.
    # Stats need memory too: a side whose allocations fail may leave a connection it could
    # not track (plain, and safe) out of them, or write no record at exit. Its stats are
    # then read for what they say, and only their agreement with the other side's checked.
    transports, by_tuple = {}, {}
    short_of_memory = {side for side, spec in specs.items()
                       if "alloc" in spec or "site=all" in spec}
    for side, p in procs.items():
        if t.settings.plain:
            transports[side] = ["tcp"] * conns
            continue
        try:
            records = p.stats_records()
        except TestFailure as e:
            problems.append(str(e))
            records = []
        if not records and SHIM_OFF in p.stderr():
            # The shim could not start (its configuration, say) and said so: plain TCP for
            # the whole process, no stats. A fine outcome.
            transports[side] = ["off"] * conns
            continue
        if len(records) != 1:
            if not (side in short_of_memory and not records):
                problems.append(f"{side}: {len(records)} stats records, expected 1")
            transports[side] = []
            continue
        rec = records[0]
        key = "local" if side == "server" else "remote"
        ours = [x for x in rec.get("connections", []) if port_of(x[key]) == port]
        transports[side] = [x["transport"] + (f"/{x['reason']}" if x["reason"] else "")
                            for x in ours]
        if side in short_of_memory:
            pass
        elif rec.get("dropped") or len(ours) != conns:
            problems.append(f"{side}: stats list {len(ours)} connections (dropped "
                            f"{rec.get('dropped')}), expected {conns}")
        if side in out and side not in short_of_memory:
            moved = (out[side].get("bytes_out"), out[side].get("bytes_in"))
            counted = (sum(x["bytes_sent"] for x in ours), sum(x["bytes_received"] for x in ours))
            if moved != counted:
                problems.append(f"{side}: stats count {counted[0]} B sent, {counted[1]} B "
                                f"received; the program moved {moved[0]} and {moved[1]}")
        for x in ours:
            pair = (x["local"], x["remote"]) if side == "client" else (x["remote"], x["local"])
            by_tuple.setdefault(pair, {})[side] = x["transport"]
    for pair, sides in by_tuple.items():
        if len(set(sides.values())) > 1:
            problems.append(f"connection {pair[0]} -> {pair[1]}: the two sides' stats disagree "
                            f"on its transport: " +
                            ", ".join(f"{k} {v}" for k, v in sorted(sides.items())))

    # The faults: what each side was asked for, and what it did.
    faults = {side: {"calls": {}, "injected": []} for side in FAULT_SIDES}
    for side, p in procs.items():
        lines = read_jsonl(reports[side])
        pids = {x.get("pid") for x in lines}
        if len(pids) > 1:
            problems.append(f"{side}: fault reports of {len(pids)} processes, expected 1")
        exits = [x for x in lines if x.get("exit")]
        faults[side]["injected"] = [x["injected"] for x in lines if "injected" in x]
        if exits:
            faults[side].update(calls=exits[-1]["calls"], exited=True)
        elif p.popen.returncode == 0 and not t.settings.plain:
            problems.append(f"{side}: exited without its fault library's exit report")
    if not problems:
        del t.procs[started:]  # kept (for the failure report) only when something failed
    return {"tag": tag, "specs": specs, "problems": problems, "transports": transports,
            "faults": faults, "seconds": seconds}


def injected_nth(run, side, cls, nth):
    """The record of the nth call of `cls` failing on `side`, or None."""
    for r in run["faults"][side]["injected"]:
        if r["class"] == cls and r["n"] == nth:
            return r
    return None


class Symbolizer:
    """Return addresses in libslipstream.so -> the shim's functions (addr2line -i: the
    inlined ones too), innermost first."""

    def __init__(self, lib):
        self.lib, self.frames = str(lib), {}

    @staticmethod
    def short(name):
        """slip::shm::Rendezvous::Publish(...) -> Rendezvous::Publish; slip::sys::MoveAbove
        -> MoveAbove."""
        name = re.sub(r"<[^<>]*>", "", name.replace("(anonymous namespace)::", ""))
        parts = [x for x in name.split("(", 1)[0].split("::") if x]
        if len(parts) >= 2 and parts[-2][:1].isupper():
            return "::".join(parts[-2:])
        return parts[-1] if parts else name

    def resolve(self, offsets):
        todo = sorted({o for o in offsets if o not in self.frames})
        if not todo or not shutil.which("addr2line"):
            return
        out = subprocess.run(["addr2line", "-f", "-C", "-i", "-a", "-e", self.lib,
                              *[hex(int(o, 16) - 1) for o in todo]],
                             capture_output=True, text=True).stdout.splitlines()
        found, current, i = {}, None, 0
        while i < len(out):
            if re.fullmatch(r"0x[0-9a-f]+", out[i]):
                current = found.setdefault(int(out[i], 16), [])
                i += 1
                continue
            if current is not None and i + 1 < len(out):
                current.append((self.short(out[i]), out[i + 1].split(" (")[0]))
            i += 2  # function, then file:line
        for o in todo:
            self.frames[o] = found.get(int(o, 16) - 1, [])

    def chain(self, record, depth=5):
        """The shim's functions that made the call, innermost first."""
        names = []
        for o in record.get("frames", []):
            for n in [f for f, _ in self.frames.get(o, [])] or [o]:
                if not names or names[-1] != n:
                    names.append(n)
        return " < ".join(names[:depth]) if names else "?"

    def where(self, record):
        """The innermost place in the project's own sources (not a libstdc++ header)."""
        root = str(HERE.parent.parent) + "/"
        for o in record.get("frames", []):
            for _, place in self.frames.get(o, []):
                if place.startswith(root):
                    return place[len(root):]
        return "?"


def transports_text(ts, compact=False):
    if not ts:
        return "-"
    if not compact:
        return " ".join(ts)
    counts = {}
    for x in ts:
        counts[x] = counts.get(x, 0) + 1
    return ", ".join(f"{n} {x}" for x, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def clean_runs(t, what):
    """Two runs with nothing injected: the counts of eligible calls per side and class
    (the smaller of the two), and a check that the fault library alone changes nothing."""
    runs = [fault_run(t, f"clean{i}", {}) for i in range(2)]
    for run in runs:
        t.check(not run["problems"], f"{what}: a run with no fault failed: {run['problems']}")
        if not t.settings.plain:
            for side, ts in run["transports"].items():
                t.check(ts == ["shm"] * SWEEP_CONNS,
                        f"{what}: with nothing injected, the {side}'s connections were {ts}")
    counts = {side: {c: min(r["faults"][side]["calls"].get(c, 0) for r in runs)
                     for c in FAULT_CLASSES} for side in FAULT_SIDES}
    print(f"{what}: eligible calls with nothing injected ({SWEEP_CONNS} connections, one after "
          f"another): " + "; ".join(f"{side} " + ", ".join(f"{c} {n}" for c, n in cs.items())
                                     for side, cs in counts.items()))
    return counts


def spread(n, cap):
    if n <= cap:
        return list(range(1, n + 1))
    return sorted({1 + round(i * (n - 1) / (cap - 1)) for i in range(cap)})


def sweep(t, what, classes, targeted=()):
    """For each class, side and mode: nth = 1..N (N from the clean runs; at most the mode's
    number of positions, evenly spread), one run each with that call failing on that side (the other side has the
    library too, injecting nothing). Mode "once": that call alone fails (a transient
    shortage); mode "from": it and every later call of the class fail (the process stays
    at its limit). Prints one row per run; fails at the end if any run failed a check, or
    if the fault did not happen in more than a tenth of the positions."""
    start = time.monotonic()
    if t.settings.plain:
        run = fault_run(t, "plain", {})
        t.check(not run["problems"], f"{what}: {run['problems']}")
        print(f"{what}: plain mode: nothing to inject into; one plain storm passed")
        return
    counts = clean_runs(t, what)
    sym = Symbolizer(t.settings.build_dir / "lib" / "libslipstream.so")
    rows, unreached, skipped = [], [], 0
    for cls in classes:
        for side in FAULT_SIDES:
            for mode, count, cap in SWEEP_MODES:
                for nth in spread(counts[side][cls], cap):
                    if time.monotonic() - start > CASE_BUDGET_S:
                        skipped += 1
                        continue
                    spec = f"site={cls},nth={nth},count={count}"
                    tag = f"{cls}-{side}-{mode}-{nth}"
                    run = fault_run(t, tag, {side: spec})
                    record = injected_nth(run, side, cls, nth)
                    for again in (1, 2):
                        if record is not None or run["problems"]:
                            break
                        # Threads took other turns (the control thread's accept4 that
                        # finds nothing, say) and this run made fewer calls: once more.
                        run = fault_run(t, f"{tag}-again{again}", {side: spec})
                        record = injected_nth(run, side, cls, nth)
                    if record is None and not run["problems"]:
                        made = run["faults"][side]["calls"].get(cls, 0)
                        t.check(0 < made < nth, f"{what}: {side} SLIPFAULT={spec}: {made} calls "
                                                f"of class {cls}, but call {nth} did not fail")
                        unreached.append(f"{side} {spec} (the run made {made} such calls)")
                    rows.append(((cls, side, mode, nth), record, run))
    for i, (why, side, spec, conns) in enumerate(targeted):
        # Faults placed by call name and thread, where the sweep's one-at-a-time positions
        # depend on which thread gets there first: each repeated, many connections each.
        for k in range(TARGETED_RUNS):
            run = fault_run(t, f"targeted{i}-{k}", {side: spec}, conns)
            rows.append(((spec, side, "targ", k + 1), None, run))
            if run["problems"]:
                break
        print(f"{what}: targeted: {why}: {side} SLIPFAULT={spec}, {conns} connections, "
              f"{TARGETED_RUNS} runs")
    sym.resolve(o for *_, run in rows for side in FAULT_SIDES
                for r in run["faults"][side]["injected"] for o in r["frames"])
    print(f"{what}: per run, one side's call number nth of the class fails (once: that call; "
          f"from: every one from it on); the shim's call that failed; then the connections' "
          f"transports in connection order, from both sides' stats ('off': the shim turned "
          f"itself off; '-': no stats)")
    print(f"  {'class':5} {'side':6} {'mode':4} {'nth':>4}  {'failed call, in':78} "
          f"{'client':38} server")
    for (cls, side, mode, nth), record, run in rows:
        mark = "  FAIL" if run["problems"] else ""
        if mode == "targ":
            injected = run["faults"][side]["injected"]
            print(f"  targeted {side:6} run {nth}: {cls}: {len(injected)} calls failed; client "
                  f"{transports_text(run['transports'].get('client'), True)}; server "
                  f"{transports_text(run['transports'].get('server'), True)}{mark}")
            continue
        call = f"{record['call']} in {sym.chain(record)}" if record else "(not reached)"
        print(f"  {cls:5} {side:6} {mode:4} {nth:4}  {call[:78]:78} "
              f"{transports_text(run['transports'].get('client')):38} "
              f"{transports_text(run['transports'].get('server'))}{mark}")
    summarize(what, rows, start, skipped)
    if unreached:
        print(f"{what}: not reached in 3 runs (fewer calls than in the runs with nothing "
              f"injected): {'; '.join(unreached)}")
    report_failed(t, what, rows, sym)
    t.check(len(unreached) * 10 <= len(rows),
            f"{what}: the fault did not happen in {len(unreached)} of {len(rows)} positions")


def summarize(what, rows, start, skipped):
    outcomes = {}
    for *_, run in rows:
        ts = run["transports"].get("client", []) + run["transports"].get("server", [])
        k = ("FAILED" if run["problems"] else
             "all shm (fault absorbed)" if ts and all(x == "shm" for x in ts) else
             "some connections plain TCP" if ts else "no stats")
        outcomes[k] = outcomes.get(k, 0) + 1
    print(f"{what}: {len(rows)} runs in {time.monotonic() - start:.1f} s: " +
          ", ".join(f"{n} {k}" for k, n in sorted(outcomes.items())) +
          (f"; {skipped} positions NOT run (over the {CASE_BUDGET_S} s budget)" if skipped else ""))


def report_failed(t, what, rows, sym):
    """Fails with every failed run (its faults, where in the shim, what went wrong), then
    the places whose failure was the first in a failed run."""
    lines, first = [], Counter()
    for _, record, run in rows:
        if not run["problems"]:
            continue
        problems = "; ".join(run["problems"])
        lines.append(f"{run['tag']} (SLIPFAULT {run['specs']}): "
                     f"{problems if len(problems) < 600 else problems[:600] + ' [...]'}")
        injected = [(side, r) for side in FAULT_SIDES for r in run["faults"][side]["injected"]]
        lines += [f"    injected on the {side}: {r['class']} call {r['n']}, {r['call']} in "
                  f"{sym.chain(r, 8)} ({sym.where(r)})" for side, r in injected[:4]]
        if len(injected) > 4:
            lines.append(f"    ... and {len(injected) - 4} more")
        if injected:
            side, r = injected[0]
            first[f"{side}: {r['call']} in {sym.chain(r, 6)} ({sym.where(r)})"] += 1
    if lines:
        failed = sum(1 for *_, run in rows if run["problems"])
        raise TestFailure(
            f"{what}: {failed} of {len(rows)} runs failed:\n  " + "\n  ".join(lines) +
            f"\n{what}: the first fault of each failed run, by place:\n  " +
            "\n  ".join(f"{n:3}x {place}" for place, n in first.most_common()))


def random_runs(t, what):
    """Both sides inject: each eligible call of the RANDOM_SITES classes fails with
    probability RANDOM_PROB (seeded), in storms of RANDOM_CONNS connections,
    RANDOM_CONCURRENCY in flight: several faults per process, in every order."""
    start = time.monotonic()
    if t.settings.plain:
        run = fault_run(t, "plain", {}, RANDOM_CONNS, RANDOM_CONCURRENCY)
        t.check(not run["problems"], f"{what}: {run['problems']}")
        print(f"{what}: plain mode: nothing to inject into; one plain storm passed")
        return
    sym = Symbolizer(t.settings.build_dir / "lib" / "libslipstream.so")
    rows, skipped = [], 0
    for seed in range(1, RANDOM_SEEDS + 1):
        if time.monotonic() - start > CASE_BUDGET_S:
            skipped += 1
            continue
        specs = {side: f"site={RANDOM_SITES},prob={RANDOM_PROB},seed={2 * seed + k}"
                 for k, side in enumerate(FAULT_SIDES)}
        run = fault_run(t, f"seed{seed}", specs, RANDOM_CONNS, RANDOM_CONCURRENCY)
        rows.append((seed, None, run))
    records = [(side, r) for *_, run in rows for side in FAULT_SIDES
               for r in run["faults"][side]["injected"]]
    sym.resolve(o for _, r in records for o in r["frames"])
    print(f"{what}: SLIPFAULT=site={RANDOM_SITES},prob={RANDOM_PROB},seed=S on both sides, "
          f"{RANDOM_CONNS} connections ({RANDOM_CONCURRENCY} in flight) per run; per run the "
          f"faults injected on each side, then the connections' transports (stats)")
    for seed, _, run in rows:
        mark = "  FAIL" if run["problems"] else ""
        injected = "; ".join(
            f"{side} " + (" ".join(f"{c}x{n}" for c, n in sorted(Counter(
                r["class"] for r in run["faults"][side]["injected"]).items())) or "none")
            for side in FAULT_SIDES)
        print(f"  seed {seed:3} ({injected}): client "
              f"{transports_text(run['transports'].get('client'), True)}; server "
              f"{transports_text(run['transports'].get('server'), True)}{mark}")
    sites = Counter((side, r["call"], sym.chain(r, 4)) for side, r in records)
    print(f"{what}: the calls that failed, by side and place ({len(records)} faults in all):")
    for (side, call, chain), n in sorted(sites.items(), key=lambda kv: (kv[0][0], -kv[1])):
        print(f"  {n:4}x {side:6} {call} in {chain}")
    summarize(what, rows, start, skipped)
    t.check(records, f"{what}: no fault was injected in {len(rows)} runs")
    report_failed(t, what, rows, sym)


TARGETED_RUNS = 3
# The application's accept() reads the registrations queued on the rendezvous itself
# (Rendezvous::Take) when the control thread has not yet: there every accept4 fails, while
# the control thread's succeed a moment later (README, "Findings", 2).
TAKE_ACCEPT4 = ("accept4 of the rendezvous in the application's accept() only", "server",
                "site=fd,call=accept4,thread=main,nth=1,count=0", 20)

FAULT_CASES = {
    "fd_sweep": lambda t: sweep(t, "faults.fd_sweep", ["fd"], [TAKE_ACCEPT4]),
    "alloc_sweep": lambda t: sweep(t, "faults.alloc_sweep", ["alloc"]),
    "memfd_mmap": lambda t: sweep(t, "faults.memfd_mmap", ["memfd", "mmap"]),
    "sock_sweep": lambda t: sweep(t, "faults.sock_sweep", ["sock"]),
    "random": lambda t: random_runs(t, "faults.random"),
}


@case("faults", list(FAULT_CASES))
def faults(t, variant):
    raise_nofile()
    FAULT_CASES[variant](t)


if __name__ == "__main__":
    sys.exit(harness_main(__doc__, CASES))
