"""Pre-proof state of the fabric transport: what a peer that never makes the TCP connection
it announces costs the server (docs/SECURITY.md "Resource exhaustion", "Remote hosts
(fabric streams)").

A fabric listener answers REQ datagrams on its UDP twin and keeps each request pending
(rings, registrations, completion queues) until the TCP connection it names is accepted or
30 s pass; with connected endpoints its process also listens for the provider's
connections. Both are reachable by every local user (and by any host that reaches the
addresses), before anything proves that a TCP connection exists. Such a peer must cost the
application nothing it can run out of: no descriptor below the hidden-descriptor floor
(half the soft RLIMIT_NOFILE; libfabric opens its own at the lowest free numbers), bounded
memory, a bounded share of the CPU, and the real clients of the listener are still served,
accelerated (they connect from 127.0.0.1, an address the attacks do not use, so a listener
that shares out what it keeps by source can serve them).

The victim is the threaded echo server (progs/servers.py, accept() failures counted and
retried, as production servers do) under slip-run with SLIP_TRANSPORTS=fabric,tcp over
libfabric's tcp provider and RLIMIT_NOFILE 1024 (floor 512). Registered only where the
fabric module is built (CMake skips the fabric_ cases otherwise).
"""

import os
import random
import time
from pathlib import Path

from cases import (DEADLINE, MANY_FDS_LIMIT, NOBODY, MiB, TestFailure, case,
                   check_client_results, connections, cpu_seconds, describe_connections,
                   finish, json_lines, last_json, launch, sec, status_text, stop,
                   wait_listening)

NOFILE = 1024
FLOOR = NOFILE // 2  # core/sys.h HiddenFdFloor: half the soft limit at start
SERVER_LIMIT = ["prlimit", f"--nofile={NOFILE}:{NOFILE}", "--"]
# The flood: 20 loopback source addresses, 64 REQs from each (the per-source cap),
# 1280 in all (the per-listener cap is 1024); then REQs as fast as the attacker can for
# SUSTAIN_S, while the legitimate clients connect.
FLOOD_SOURCES = 20
FLOOD_PER_SOURCE = 64
SUSTAIN_S = 5.0
CPU_WINDOW_S = 1.5
LINKS = 1100  # silent connections to the connection listener: more than the server's limit
LEGIT = 6
# Descriptors below the floor that may come and go meanwhile without being the flood's (the
# application is idle in accept()).
MAX_LOW_FD_GROWTH = 2
# What a flood of unproven requests may hold, whatever its size: a budget, not a count of
# requests. 256 MiB of address space is the rings of 128 connections at the default
# SLIP_RING_SIZE (2 x 1 MiB each: 64 pending requests, one source's share today, measured
# +129 MiB with the allocator's own), an eighth of what 1024 pending requests take today
# (2 GiB, which a server under RLIMIT_AS or strict overcommit may not have); 32 MiB
# resident is room for their bookkeeping and the provider's queues (today ~14-22 KiB
# each). (Taken after a warm-up connection: the program's threads and their malloc arenas
# exist already.)
MAX_VMSIZE_GROWTH_KB = 256 * 1024
MAX_RSS_GROWTH_KB = 32 * 1024
# The server's CPU (all its threads) while the attack goes on, as a share of one CPU. The
# attacker's rate is its own to choose (a Python sender makes ~50,000 REQs/s here), so what
# bounds the listener's share is the listener: a budget of REQs served, or work per REQ
# small enough. Half a CPU: a flood from one local user may slow the host's other work, not
# take a CPU from it. Not a bound in a sanitizer run (SLIP_TEST_SANITIZER_RUNTIME), where
# every access of the shim is checked at several times its cost: the share is printed only.
SANITIZED = bool(os.environ.get("SLIP_TEST_SANITIZER_RUNTIME"))
MAX_CPU_SHARE = None if SANITIZED else 0.5


def fabric_env(endpoint):
    env = {"SLIP_TRANSPORTS": "fabric,tcp", "SLIP_FABRIC_PROVIDER": "tcp",
           "SLIP_FABRIC_ENDPOINT": endpoint}
    if SANITIZED:
        # The legitimate requests wait behind the flood in a server that the sanitizer
        # slows several times: they are given the time (elsewhere, the default 2 s).
        env["SLIP_HANDSHAKE_TIMEOUT_MS"] = "10000"
    return env


def low_fds(pid):
    """The process's descriptors below the floor: number -> what /proc says it is."""
    out = {}
    for entry in Path(f"/proc/{pid}/fd").iterdir():
        if int(entry.name) < FLOOR:
            try:
                out[int(entry.name)] = os.readlink(entry)
            except OSError:
                pass
    return out


def kinds(links):
    counted = {}
    for link in links:
        kind = "socket" if link.startswith("socket:") else link
        counted[kind] = counted.get(kind, 0) + 1
    return ", ".join(f"{n} {k}" for k, n in sorted(counted.items(), key=lambda x: -x[1])) or \
        "none"


def memory_kb(pid):
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmSize", "VmRSS"):
            fields[key] = int(value.split()[0])
    return fields


class Snapshot:
    def __init__(self, pid):
        self.fds = low_fds(pid)
        self.memory = memory_kb(pid)


def cpu_over(pid, seconds):
    """The process's CPU seconds (every thread) over the next `seconds`, and the seconds."""
    used, started = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return cpu_seconds(pid) - used, time.monotonic() - started


def start_victim(t, endpoint):
    if not (t.settings.build_dir / "lib" / "libslipstream-fabric.so").is_file():
        raise TestFailure("the fabric module (lib/libslipstream-fabric.so) is not built")
    server = launch(t, "server", sec("servers.py", "--impl", "threaded", "--port", t.port,
                                     "--keep-accepting"),
                    slip=True, role="server", env=fabric_env(endpoint), prefix=SERVER_LIMIT)
    wait_listening(server, t.port)
    pid = server.popen.pid
    t.check(os.path.basename(os.readlink(f"/proc/{pid}/exe")).startswith("python"),
            f"setup: pid {pid} is {os.readlink(f'/proc/{pid}/exe')}, not the server itself")
    # A first connection: the program's threads (and Slipstream's) are up, and the
    # transport does carry this listener's connections here (else the attack is not played).
    warm = launch(t, "warmup", sec("client.py", "--port", t.port, "--connections", 1,
                                   "--max-bytes", 64 * 1024, "--seed", random.randrange(1 << 30)),
                  slip=True, env=fabric_env(endpoint))
    check_client_results(t, warm, 1, finish(warm, 20))
    conns = connections(t, warm, t.port, "remote")
    t.check([c["transport"] for c in conns] == ["fabric"],
            f"precondition: the warm-up connection is {describe_connections(conns)}, not "
            f"fabric: the attack cannot be played here")
    time.sleep(0.3)
    return server, Snapshot(pid)


def legit_clients(t, endpoint):
    return launch(t, "legit", sec("client.py", "--port", t.port, "--connections", LEGIT,
                                  "--connect-first", "--min-bytes", 64 * 1024,
                                  "--max-bytes", MiB, "--stall", 8,
                                  "--seed", random.randrange(1 << 30)),
                  slip=True, env=fabric_env(endpoint))


def judge(t, server, legit, legit_status, before, after, cpu, what):
    """Every check, each failure said (with its numbers) rather than only the first.
    `cpu`: (the server's CPU seconds, over how many seconds of the attack)."""
    failures = []
    grown = {fd: link for fd, link in after.fds.items() if before.fds.get(fd) != link}
    print(f"descriptors below the floor ({FLOOR}): {len(before.fds)} before {what}, "
          f"{len(after.fds)} after (new: {kinds(grown.values())})")
    vm = after.memory["VmSize"] - before.memory["VmSize"]
    rss = after.memory["VmRSS"] - before.memory["VmRSS"]
    print(f"memory: VmSize {before.memory['VmSize']} -> {after.memory['VmSize']} kB "
          f"(+{vm}), VmRSS {before.memory['VmRSS']} -> {after.memory['VmRSS']} kB (+{rss})")
    if len(after.fds) - len(before.fds) > MAX_LOW_FD_GROWTH:
        failures.append(f"{what} took {len(after.fds) - len(before.fds)} of the application's "
                        f"descriptors below the floor ({len(before.fds)} -> {len(after.fds)}, "
                        f"limit +{MAX_LOW_FD_GROWTH}; new: {kinds(grown.values())})")
    if vm > MAX_VMSIZE_GROWTH_KB or rss > MAX_RSS_GROWTH_KB:
        failures.append(f"{what} grew the server by {vm} kB of address space and {rss} kB "
                        f"resident (limits {MAX_VMSIZE_GROWTH_KB} and {MAX_RSS_GROWTH_KB} kB)")
    used, window = cpu
    if MAX_CPU_SHARE is not None and used > MAX_CPU_SHARE * window:
        failures.append(f"the server spent {used:.2f} s of CPU in {window:.1f} s of {what} "
                        f"({100 * used / window:.0f}% of a CPU, limit "
                        f"{100 * MAX_CPU_SHARE:.0f}%)")
    alive = server.popen.poll() is None
    if not alive:
        failures.append(f"the server died: {status_text(server.popen.poll())}")
    else:
        stop(server)
        said = last_json(server)
        print(f"server: {said}")
        if said["accept_errors"]:
            failures.append(f"the server's accept() failed: {said['accept_errors']}")
    reported = json_lines(legit)
    if not reported:
        failures.append(f"legitimate clients: {status_text(legit_status)}, no report")
    else:
        try:
            check_client_results(t, legit, LEGIT, legit_status)
        except TestFailure as e:
            failures.append(str(e))
        if legit_status != 0:
            failures.append(f"legitimate clients: {status_text(legit_status)}")
    conns = connections(t, legit, t.port, "remote")
    print(f"legitimate connections: {describe_connections(conns)}")
    if len(conns) != LEGIT or any(c["transport"] != "fabric" for c in conns):
        failures.append(f"the {LEGIT} legitimate connections were "
                        f"{describe_connections(conns)}, expected fabric each")
    if failures:
        raise TestFailure("\n  ".join([f"{len(failures)} check(s) failed:", *failures]))


@case("fabric_requests", ("msg", "rdm"), serial=True)
def fabric_requests(t, endpoint):
    """A user (nobody) floods a root server's fabric listener with well-formed REQs on its UDP
    twin (progs/fabric_req_flood.py): 64 from each of 20 loopback source addresses
    (127.0.0.2-21), each for a 4-tuple of its own and a 1 MiB ring, none followed by a TCP
    connection; then fresh ones as fast as it can for 5 s, during which 6 legitimate
    clients (under slip-run, from 127.0.0.1) connect and echo 64 KiB-1 MiB each. msg: the
    tcp provider's connected endpoints (the default over tcp); rdm: its reliable datagrams
    (tcp;ofi_rxm). The server's accept() must never fail; every echo must be exact and on
    the fabric; its descriptors below the floor must not grow with the flood; its memory
    must stay within a budget (VmSize +256 MiB, VmRSS +32 MiB); and it may spend at most
    half a CPU on the sustained flood (its CPU per REQ sent is printed too)."""
    server, before = start_victim(t, endpoint)
    pid = server.popen.pid
    flood = launch(t, "flood", sec("fabric_req_flood.py", "--port", t.port, "--endpoints",
                                   endpoint, "--sources", FLOOD_SOURCES, "--per-source",
                                   FLOOD_PER_SOURCE, "--duration", SUSTAIN_S,
                                   "--seed", random.randrange(1 << 30)),
                   prefix=NOBODY)
    flood.wait_output("SUSTAINED")
    cpu, window = cpu_over(pid, CPU_WINDOW_S)
    after = Snapshot(pid)
    legit = legit_clients(t, endpoint)
    legit_status = finish(legit, 30)
    flood_status = finish(flood, max(1.0, DEADLINE - time.monotonic() - 10))
    t.check(flood_status == 0, f"flood: {status_text(flood_status)}")
    said = last_json(flood)
    t.check(said["uid"] == 65534, f"the flood ran as uid {said['uid']}, not nobody")
    rate = said["sustained_sent"] / SUSTAIN_S
    print(f"flood (uid nobody): {said}")
    print(f"server CPU over {window:.1f} s of the sustained flood (~{rate:.0f} REQs/s): "
          f"{cpu:.2f} s ({100 * cpu / window:.0f}% of a CPU, "
          f"~{1e6 * cpu / max(1, rate * window):.1f} us per REQ sent)")
    judge(t, server, legit, legit_status, before, after, (cpu, window),
          f"{said['sent']} REQs ({said['rep']} answered REP) and a sustained flood")


@case("fabric_links", ("run", "header"), serial=True)
def fabric_links(t, variant):
    """A user (nobody) learns the root server's fabric connection listener from the REP to
    one REQ (connected endpoints over the tcp provider: a passive endpoint on the domain's
    address) and opens 1100 TCP connections to it (more than the server's RLIMIT_NOFILE)
    that never send the provider's connection request (progs/fabric_link_hold.py), held
    open; then 6 legitimate clients connect and echo. header: one connection only, which
    sends the request's header promising 16 bytes of connection data and never sends them
    (the provider read the rest from a blocking socket, in the thread that answers every
    REQ). As fabric_requests: the server's accept() never fails, every echo is exact and on
    the fabric, its descriptors below the floor do not grow, its memory stays within the
    same budget, and it spends at most half a CPU while they are held."""
    server, before = start_victim(t, "msg")
    shape = ["--count", LINKS] if variant == "run" else ["--count", 1, "--promise", 16]
    holder = launch(t, "holder", sec("fabric_link_hold.py", "--port", t.port, *shape,
                                     "--hold", 30, "--seed", random.randrange(1 << 30)),
                    prefix=[*MANY_FDS_LIMIT, *NOBODY])
    holder.wait_output("HELD")
    said = last_json(holder)
    print(f"holder (uid nobody): {said}")
    t.check(said["uid"] == 65534, f"the holder ran as uid {said['uid']}, not nobody")
    t.check(said["answer"] == "rep" and said["held"] > 0,
            f"precondition: the holder found no connection listener to connect to: {said}")
    time.sleep(0.5)  # (the progress thread takes the connections in)
    cpu, window = cpu_over(server.popen.pid, CPU_WINDOW_S)
    print(f"server CPU over {window:.1f} s with the connections held: {cpu:.2f} s")
    after = Snapshot(server.popen.pid)
    legit = legit_clients(t, "msg")
    legit_status = finish(legit, 30)
    holder.kill()
    judge(t, server, legit, legit_status, before, after, (cpu, window),
          f"{said['held']} silent connections to the connection listener")


@case("fabric_late_syn", ("msg", "rdm"), serial=True)
def fabric_late_syn(t, endpoint):
    """A client's TCP connection comes after the listener dropped its request: a REQ
    answered, then 1.6 s of silence (past the listener's grace: the kernel showed no
    connection for its 4-tuple), then the connection, its CONFIRM and plain bytes, played
    by hand (progs/fabric_late_syn.py) against a server under slip-run that reads what
    comes. The CONFIRM must never reach the server's application (nor come back): the
    dropped request's record makes accept() hold the connection, and the CONFIRM moves
    it onto TCP, so that the server's FAILOVER is the first thing the client reads. (Over
    connected endpoints a request kept that long fails over too: its client never
    connected an endpoint. Over rdm it carried the connection on the fabric: there the
    FAILOVER is what says the request was dropped, and its record found.)"""
    server = launch(t, "server", sec("fabric_late_syn.py", "server", "--port", t.port),
                    slip=True, role="server", env=fabric_env(endpoint))
    wait_listening(server, t.port)
    client = launch(t, "client", sec("fabric_late_syn.py", "client", "--port", t.port,
                                     "--endpoints", endpoint, "--wait", 1.6,
                                     "--seed", random.randrange(1 << 30)))
    client_status = finish(client, 20)
    server_status = finish(server, 20)
    t.check(client_status == 0, f"client: {status_text(client_status)}")
    t.check(server_status == 0, f"server: {status_text(server_status)}")
    said, read = last_json(client), last_json(server)
    print(f"client: {said}\nserver's application read: {read}")
    t.check(said["rep"], "precondition: the listener did not answer the REQ")
    t.check(not said["echoed_confirm"], "the CONFIRM came back: the application read it as data")
    t.check(not bytes.fromhex(read["received"]).startswith(b"SLIP"),
            f"the server's application read the CONFIRM: {read['received'][:64]}")
    if endpoint == "rdm":
        t.check(said["first_type"] == 6,
                f"the first message back is type {said['first_type']}, not FAILOVER (6)")
