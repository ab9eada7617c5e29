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
judge them. Reuses ../integration/harness.py (SLIP_BUILD_DIR, SLIP_TEST_PLAIN=1).
"""

import json
import os
import re
import resource
import signal
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))

from harness import TestFailure, is_listening, pick_port  # noqa: E402
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
CASES = {}


def case(name, variants):
    def register(function):
        CASES[name] = (function, tuple(variants))
        return function
    return register


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
        m = re.fullmatch(r"slipstream-stats\.(\d+)", name)
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


if __name__ == "__main__":
    sys.exit(harness_main(__doc__, CASES))
