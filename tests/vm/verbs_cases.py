"""Verbs-only test cases, run inside the Soft-RoCE guest by tests/vm/verbs-suite.sh:
`verbs_cases.py --build-dir build CASE VARIANT` (or --list).

They use the integration harness (tests/integration/harness.py) with SLIP_TEST_HOST=10.77.0.1
and SLIP_TEST_TRANSPORTS=verbs,tcp set by the suite, and check what only the verbs transport
has: rdma_cm requests forged or malformed by a hostile peer (tests/vm/progs/forge_cm.c), the
SEND-based notification path (iWARP's), RLIMIT_MEMLOCK too low to pin the rings, the
negative cache, and failover to TCP when the RDMA device goes away mid-stream. Every case
checks the bytes it moved (SHA-256) and the transport used.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))

from harness import LOOPBACK, PYTHON, _tcp_table, main, pick_port, port_of, py  # noqa: E402

MiB = 1 << 20
BULK = 2 * MiB
CASES = {}


def case(name, variants=("run",)):
    def register(function):
        CASES[name] = (function, tuple(variants))
        return function
    return register


def forge_path(t):
    path = t.settings.build_dir / "tests" / "vm" / "forge_cm"
    t.check(path.exists(), f"{path} is not built")
    return path


def first_difference(sent, received):
    """Where two dumped streams first differ, and how far the difference runs (diagnosis)."""
    a, b = Path(sent).read_bytes(), Path(received).read_bytes()
    at = next((i for i in range(0, min(len(a), len(b)), 4096) if a[i:i + 4096] != b[i:i + 4096]),
              None)
    if at is None:
        return f"equal for {min(len(a), len(b))} bytes (lengths {len(a)}, {len(b)})"
    while a[at] == b[at]:
        at += 1
    end = at
    while end < min(len(a), len(b)) and a[end] != b[end]:
        end += 1
    found = a.find(b[at:at + 64])
    return (f"first difference at byte {at}, runs to {end} at least; the received bytes there "
            f"are the sent bytes at {found}")


def bulk_pair(t, server_slip=True, client_slip=True, server_env=None, client_env=None,
              client_args=(), client_wrap=(), total=BULK, meanwhile=None, dump=False, hold=None):
    """progs/bulk.py both ways; returns (server, client, traffic) after checking content.
    `meanwhile(server, client)` runs while the transfer is under way; with `hold` (a path)
    both ends keep their connection open after the transfer until that file exists."""
    holds = ["--hold", hold] if hold else []
    dumps = ["--dump", t.dir / "server"] if dump else []
    server = t.serve("server", py("bulk.py", "server", "--port", t.port, "--bind", LOOPBACK,
                                  "--seed", 1, "--total", total, *dumps, *holds),
                     slip=server_slip, env=server_env)
    dumps = ["--dump", t.dir / "client"] if dump else []
    argv = py("bulk.py", "client", "--port", t.port, "--host", LOOPBACK, "--seed", 2,
              "--total", total, *dumps, *holds, *client_args)
    client = t.start("client", [*client_wrap, *argv], slip=client_slip, env=client_env)
    if client_wrap:
        client.exe = os.path.realpath(PYTHON)  # what the stats record will name
    if meanwhile:
        meanwhile(server, client)
    client.expect_exit(0)
    server.expect_exit(0)
    s, c = server.json_output(), client.json_output()
    if dump:
        print("client -> server:", first_difference(t.dir / "client.sent", t.dir / "server.received"))
        print("server -> client:", first_difference(t.dir / "server.sent", t.dir / "client.received"))
    t.expect_same_stream("client -> server", c, s)
    t.expect_same_stream("server -> client", s, c)
    return server, client, {server: (s["sent"], s["received"]), client: (c["sent"], c["received"])}


def serve_real_client(t, server, total=BULK, meanwhile=None):
    """A legitimate client of `server` (bulk.py, seed 1, `total` bytes each way; `meanwhile()`
    runs while it streams): both streams exact, both ends on verbs."""
    client = t.start("client", py("bulk.py", "client", "--port", t.port, "--host", LOOPBACK,
                                  "--seed", 2, "--total", total), slip=True)
    if meanwhile:
        meanwhile()
    client.expect_exit(0)
    server.expect_exit(0)
    s, c = server.json_output(), client.json_output()
    t.expect_same_stream("client -> server", c, s)
    t.expect_same_stream("server -> client", s, c)
    t.expect_stats(server, "verbs", "")
    t.expect_stats(client, "verbs", "")


@case("notify_send", variants=("both", "server"))
def notify_send(t, variant):
    """RDMA WRITE followed by a SEND notification, as iWARP (no immediate data) needs: forced
    on both ends, or on the server only (the REQ/REP flags make both ends agree)."""
    send = {"SLIP_VERBS_NOTIFY": "send"}
    server, client, traffic = bulk_pair(t, server_env=send,
                                        client_env=send if variant == "both" else None)
    for proc in (server, client):
        t.expect_stats(proc, "verbs", "", traffic=traffic[proc])


@case("malformed")
def malformed(t, variant):
    """Requests with garbage, cut-short, wrong-version and wrong-tuple private data, and one
    for rings larger than the listener's own SLIP_RING_SIZE (a client must not choose what
    the server pins), are each rejected by the listener, which then serves a real
    connection over verbs unharmed."""
    server = t.serve("server", py("bulk.py", "server", "--port", t.port, "--bind", LOOPBACK,
                                  "--seed", 1, "--total", BULK), slip=True)
    for mode in ("garbage", "short", "version", "tuple", "bigring"):
        forge = t.start(f"forge_{mode}", [forge_path(t), LOOPBACK, t.port, mode])
        code = forge.wait(timeout=30)
        t.check(code == 0 and "rejected" in forge.stdout(),
                f"forged request ({mode}): exit {code}, said {forge.stdout().strip()!r}")
    serve_real_client(t, server)


def expect_dropped(t, forge):
    """forge_cm's request was disconnected by the listener (it reports it and exits 0)."""
    code = forge.wait(timeout=30)
    t.check(code == 0 and "disconnected" in forge.stdout(),
            f"the forged request was not dropped: exit {code}, said {forge.stdout().strip()!r}")


@case("forged_nonce")
def forged_nonce(t, variant):
    """A well-formed request for a real connection's 4-tuple but with a nonce nobody
    confirms: the listener accepts it at the rdma_cm level (it cannot know yet); the TCP
    connection from that port is a plain client whose first bytes are its own data, so the
    server keeps them for the application, serves it on TCP, and drops the forged request.
    (Should the client's SYN come more than a second after the forged REP, as under
    emulation it may, the listener has dropped the request for its grace already, and the
    connection held for its record is plain as rendezvous_busy.)"""
    server = t.serve("server", py("bulk.py", "server", "--port", t.port, "--bind", LOOPBACK,
                                  "--seed", 1, "--total", BULK), slip=True)
    source_port = pick_port()
    forge = t.start("forge", [forge_path(t), LOOPBACK, t.port, "nonce", source_port])
    forge.wait_until(lambda: "established" in forge.stdout(), "the forged request accepted")
    client = t.start("client", py("bulk.py", "client", "--port", t.port, "--host", LOOPBACK,
                                  "--source-port", source_port, "--seed", 2, "--total", BULK))
    client.expect_exit(0)
    server.expect_exit(0)
    s, c = server.json_output(), client.json_output()
    t.expect_same_stream("client -> server", c, s)
    t.expect_same_stream("server -> client", s, c)
    t.expect_stats(server, "tcp", ("peer_not_slipstream", "rendezvous_busy"))
    expect_dropped(t, forge)


@case("forged_silent")
def forged_silent(t, variant):
    """A forged request made to look committed (HELLO sent, bytes RDMA-written into the
    listener's ring with a data note) for the 4-tuple of a plain client that then connects
    and stays silent, waiting for its server to speak first: the server's accept() returns
    at once (the connection is held, not waited for), the held connection settles as plain
    TCP at the handshake timeout, the client gets the server's bytes (nothing of ours, no
    DECLINE) and both streams are exact, none of the forger's bytes reaching the server's
    application; the forged request is disconnected and its ring slot deregistered."""
    go = t.dir / "go"
    server = t.serve("server", py("speak_first.py", "server", "--port", t.port, "--bind", LOOPBACK,
                                  "--seed", 1, "--total", BULK, "--go", go), slip=True)
    source_port = pick_port()
    forge = t.start("forge", [forge_path(t), LOOPBACK, t.port, "committed", source_port])
    forge.wait_until(lambda: "committed" in forge.stdout(), "the forged request committed")
    client = t.start("client", py("speak_first.py", "client", "--port", t.port, "--host",
                                  LOOPBACK, "--source-port", source_port, "--seed", 3,
                                  "--total", BULK))
    # Once the client's connection is queued, accept() finds it there: what it takes is
    # Slipstream's own work.
    client.wait_until(lambda: "connected" in client.stdout(), "the client connected")
    go.write_text("go")
    client.expect_exit(0)
    server.expect_exit(0)
    s, c = server.json_output(), client.json_output()
    t.expect_same_stream("server -> client", s, c)
    t.expect_same_stream("client -> server", c, s)
    t.check(s["accept_s"] < 0.5, f"accept() took {s['accept_s']:.2f} s (it waited for the "
                                 "forged request's CONFIRM)")
    timeout_s = 2.0  # SLIP_HANDSHAKE_TIMEOUT_MS's default
    t.check(c["first_byte_s"] is not None and c["first_byte_s"] < timeout_s + 1.5,
            f"the server's first bytes came after {c['first_byte_s']} s")
    t.expect_stats(server, "tcp", "handshake_timeout")
    # On TCP for good, the connection gives its ring slot back (a 1 MiB ring's slot is
    # 2 MiB): a forged request pins nothing for the life of the plain connection.
    t.check(s["pinned_after"] <= s["pinned_before"] + 1024,
            f"the plain connection still pins {s['pinned_after'] - s['pinned_before']} KiB")
    expect_dropped(t, forge)


@case("late_confirm")
def late_confirm(t, variant):
    """A verbs client held up between its TCP handshake and its CONFIRM past the server's
    handshake timeout (its rdma_cm request, with HELLO, made by forge_cm; its TCP side by
    hand): the server has settled the connection as plain TCP meanwhile, so the late CONFIRM
    must not reach its application as data: the connection is reset, and the application
    read nothing."""
    server = t.serve("server", py("late_confirm.py", "server", "--port", t.port), slip=True)
    source_port = pick_port()
    forge = t.start("forge", [forge_path(t), LOOPBACK, t.port, "committed", source_port])
    forge.wait_until(lambda: "committed" in forge.stdout(), "the request committed")
    nonce = int(forge.stdout().split("committed", 1)[1].split()[0])
    client = t.start("client", py("late_confirm.py", "client", "--port", t.port, "--mode",
                                  "verbs", "--nonce", nonce, "--source-port", source_port,
                                  "--delay", 3.5))
    client.expect_exit(0)
    server.expect_exit(0)
    s, c = server.json_output(), client.json_output()
    t.check(s["count"] == 0 and s["end"] == "reset",
            f"the server's application read {s['count']} bytes ({s['received'][:64]}...) and "
            f"saw {s['end']}: the late CONFIRM must reset the connection")
    t.check(c["end"] == "reset", f"the late client saw {c['end']}, not a reset")
    t.expect_stats(server, "tcp", "handshake_timeout")


def pinned_kib(proc):
    """The process's pinned memory (VmPin: what its RDMA registrations hold), in KiB."""
    for line in Path(f"/proc/{proc.popen.pid}/status").read_text().splitlines():
        if line.startswith("VmPin:"):
            return int(line.split()[1])
    raise AssertionError("no VmPin line")


def low_device_fds(proc, floor):
    """How many of the process's descriptors below `floor` are files of an RDMA device."""
    count = 0
    for entry in Path(f"/proc/{proc.popen.pid}/fd").iterdir():
        try:
            if int(entry.name) < floor and "infiniband" in os.readlink(entry):
                count += 1
        except OSError:
            pass
    return count


@case("cross_write")
def cross_write(t, variant):
    """A remote peer that learned one connection's ring (address and key, from the answer to
    a request it then abandoned) RDMA-WRITEs there through a second connection of its own
    while a legitimate connection, which may have got that ring from the pool, streams:
    the device refuses the writes (each connection's queue pair and rings have a protection
    domain of their own) and the legitimate stream arrives exactly, on verbs. (The server
    keeps listening while it serves: the attacker's second request needs a listener, and
    one that closed at its accept made this case depend on who was faster.)"""
    go = t.dir / "go"
    server = t.serve("server", py("bulk.py", "server", "--port", t.port, "--bind", LOOPBACK,
                                  "--seed", 1, "--total", 48 * MiB, "--keep-listening"),
                     slip=True)
    attacker = t.start("attacker", [forge_path(t), LOOPBACK, t.port, "cross", pick_port(), go, 5])
    attacker.wait_until(lambda: "learned" in attacker.stdout(), "the first request answered")
    time.sleep(0.5)  # its disconnect reaches the listener: the ring goes back to the pool
    attack = {}

    def write_across():
        # The legitimate connection is up (its request, which took a ring from the pool,
        # precedes its SYN): only then may the attacker's second request come, or it could
        # take the learned ring itself and write into its own request's ring. (A fixed
        # second was not always enough under emulation: loading the verbs module is slow.)
        server.wait_until(lambda: any(p == t.port and state == "01" for p, state in _tcp_table()),
                          "the legitimate connection established")
        time.sleep(0.3)
        go.write_text("go")
        attack["code"] = attacker.wait(timeout=60)

    serve_real_client(t, server, total=48 * MiB, meanwhile=write_across)
    code, said = attack["code"], attacker.stdout().strip()
    t.check(code == 0 and "refused" in said,
            f"the cross-connection writes were not refused: exit {code}, said {said!r}")


@case("flood", variants=("source", "budget", "fdlimit"))
def flood(t, variant):
    """Requests from one host that no SYN follows: the listener holds at most 64 of one
    source address at once (source), or as many as the pinned-memory budget holds (budget:
    8 MiB, three 1 MiB-ring connections; the server's VmPin stays within it, and 30 s after
    the flood, its idle slots deregistered, is back where it was), and rejects the rest;
    each one it held it drops once its grace is over and the kernel shows no TCP
    connection for it (all of them within the flood's hold). fdlimit: 130 requests at a
    server whose descriptor limit is 128 (each pending request once took a descriptor of
    the application's, which then failed accept() with EMFILE). Once the flood lets go, a
    real connection is served over verbs with its bytes intact."""
    count, limit = {"source": (80, 64), "budget": (10, 3), "fdlimit": (130, 64)}[variant]
    env = {"SLIP_VERBS_PIN_MAX": "8M"} if variant == "budget" else None
    wrap = ["prlimit", "--nofile=128:128"] if variant == "fdlimit" else []
    server = t.serve("server", [*wrap, *py("bulk.py", "server", "--port", t.port, "--bind",
                                           LOOPBACK, "--seed", 1, "--total", BULK)],
                     slip=True, env=env)
    if wrap:
        server.exe = os.path.realpath(PYTHON)  # what the stats record will name
    before = pinned_kib(server)
    forge = t.start("flood", [forge_path(t), LOOPBACK, t.port, "flood", pick_port(), count, 4])
    forge.wait_until(lambda: "most" in forge.stdout(), "the flood's requests answered",
                     timeout=120)
    said = forge.stdout().split()
    established, rejected, most = int(said[1]), int(said[3]), int(said[5])
    t.check(established + rejected == count and 1 <= most <= limit,
            f"expected at most {limit} of {count} requests held at once, got {' '.join(said)!r}")
    if variant == "budget":
        pinned = pinned_kib(server)
        t.check(pinned <= 8 * 1024, f"the server pins {pinned} KiB, over its 8 MiB budget")
    if variant == "fdlimit":
        # The application's numbers (below the floor, 64 at this limit) hold the device's
        # context files, not a completion channel per request.
        low = low_device_fds(server, 64)
        t.check(low <= 4, f"{low} descriptors of the RDMA device below the floor during the flood")
    t.check(forge.wait(timeout=60) == 0, "the flood program failed")
    dropped = int(forge.stdout().split("dropped")[1].split()[0])
    t.check(dropped == established,
            f"the listener dropped {dropped} of the {established} requests it held, 4 s after "
            "the flood (none had a TCP connection)")
    if variant == "budget":
        # The flood's slots went back to the pool, still registered; idle for 30 s they are
        # given back (deregistered): the server pins what it did before the flood, give or
        # take the device's own queues (a slot is 2 MiB here).
        deadline = time.monotonic() + 40
        while pinned_kib(server) > before + 1024 and time.monotonic() < deadline:
            time.sleep(1)
        pinned = pinned_kib(server)
        t.check(pinned <= before + 1024,
                f"the server still pins {pinned} KiB 40 s after the flood ({before} KiB before)")
    serve_real_client(t, server)


@case("memlock")
def memlock(t, variant):
    """A client whose RLIMIT_MEMLOCK (64 KiB, no CAP_IPC_LOCK) cannot pin the rings says so in
    its log and stays on TCP with reason "memlock"; the bytes are intact."""
    log = t.dir / "client.log"
    wrap = ["prlimit", "--memlock=65536:65536", "setpriv", "--inh-caps=-ipc_lock",
            "--bounding-set=-ipc_lock"]
    server, client, traffic = bulk_pair(
        t, client_wrap=wrap, client_env={"SLIP_LOG": "warn", "SLIP_LOG_FILE": str(log)})
    # (The stats record names the program prlimit and setpriv finally exec'd.)
    t.expect_stats(client, "tcp", "memlock", traffic=traffic[client])
    t.expect_stats(server, "tcp", "peer_not_slipstream", traffic=traffic[server])
    text = log.read_text() if log.exists() else ""
    t.check("RLIMIT_MEMLOCK" in text, f"no RLIMIT_MEMLOCK message in the client's log: {text!r}")


# Both ends over libfabric's verbs provider (the shim's fabric streams; FI_UNIVERSE_SIZE as
# in verbs-suite.sh).
FABRIC_ENV = {"SLIP_TRANSPORTS": "fabric,tcp", "SLIP_FABRIC_PROVIDER": "verbs",
              "FI_UNIVERSE_SIZE": "64"}


@case("fabric_memlock")
def fabric_memlock(t, variant):
    """Over libfabric's verbs provider, which pins what it registers: a client whose
    RLIMIT_MEMLOCK (64 KiB, no CAP_IPC_LOCK) cannot pin its rings says so in its log and
    stays on TCP with reason "memlock"; the bytes are intact, and the server (whose client
    asked for nothing) is plain."""
    log = t.dir / "client.log"
    wrap = ["prlimit", "--memlock=65536:65536", "setpriv", "--inh-caps=-ipc_lock",
            "--bounding-set=-ipc_lock"]
    server, client, traffic = bulk_pair(
        t, server_env=FABRIC_ENV, client_wrap=wrap,
        client_env={**FABRIC_ENV, "SLIP_LOG": "info", "SLIP_LOG_FILE": str(log)})
    text = log.read_text() if log.exists() else ""
    print("client log:", text.strip().replace("\n", " | ")[:600])
    # (The endpoint's own queues fit in 64 KiB; the rings' registration is what fails.)
    t.expect_stats(client, "tcp", "memlock", traffic=traffic[client])
    t.expect_stats(server, "tcp", "peer_not_slipstream", traffic=traffic[server])
    t.check("RLIMIT_MEMLOCK" in text, f"no RLIMIT_MEMLOCK message in the client's log: {text!r}")


@case("negative_cache")
def negative_cache(t, variant):
    """A Slipstream client making two connections to a plain server: the first learns from
    the rdma_cm rejection (reason peer_not_slipstream), the second goes plain from the
    negative cache without asking again; both echo 64 KiB intact."""
    log = t.dir / "client.log"
    twice = [PYTHON, HERE / "progs" / "twice.py"]
    server = t.serve("server", [*twice, "server", "--host", LOOPBACK, "--port", t.port])
    client = t.start("client", [*twice, "client", "--host", LOOPBACK, "--port", t.port],
                     slip=True, env={"SLIP_LOG": "debug", "SLIP_LOG_FILE": str(log)})
    client.expect_exit(0)
    server.expect_exit(0)
    report = client.json_output()
    t.check(report["connections"] == 2 and report["ok"] == 2, f"echo failed: {report}")
    t.expect_stats(client, "tcp", "peer_not_slipstream", count=2)
    text = log.read_text() if log.exists() else ""
    t.check(text.count("negative cache") == 1,
            f"expected one answer from the negative cache, log: {text!r}")


def listeners_on(port):
    return sum(1 for p, state in _tcp_table() if p == port and state == "0A")


def ends_on_port(t, proc, port, key):
    """{peer port: (transport, reason)} of `proc`'s connections on `port` (`key`: which side
    of the record is ours), and how many it recorded."""
    found = {}
    count = 0
    for record in proc.stats_records():
        for c in record.get("connections", []):
            mine, other = (c["local"], c["remote"]) if key == "local" else (c["remote"],
                                                                            c["local"])
            if port_of(mine) == port:
                found[port_of(other)] = (c["transport"], c["reason"])
                count += 1
    return found, count


@case("reuseport", variants=("one", "sockets", "procs", "mixed", "takeover", "squat"))
def reuseport(t, variant):
    """SO_REUSEPORT listeners over verbs (docs/DESIGN.md "Servers that share a port"), under
    a storm of connections whose clients speak first (progs/reuseport.py: random sizes both
    ways, every byte checked). one: a single member, as gRPC's default listener is. sockets:
    two members in one process, sharing the port's rdma_cm listener. procs: three Slipstream
    processes: the first holds the port's rdma_cm listener, the others listen on rdma_cm
    ports of their own, and the holder redirects each request to the process whose member
    the SYN will reach. In all three every connection is on verbs at both ends, at the
    member that served it, and every member serves. mixed: the holder and a plain member:
    the plain member's connections are plain at both ends (reason reuseport at the client,
    at once, without the client remembering the destination as plain), exact, never a byte
    of ours; the holder's on verbs. takeover: the holder's process exits first; the other
    member's process takes the port's rdma_cm listener over (within a second) and serves
    every connection on verbs. squat: as mixed, and a local user (nobody) holds the plain
    member's directory name and answers with a port of its own: the holder does not believe
    it (it does not own the member's socket), says so in its log, and the plain member's
    connections stay plain (reason reuseport), never redirected."""
    count, parallel = 24, 4
    members = {"one": [("a", 1, True)], "sockets": [("s", 2, True)],
               "procs": [("a", 1, True), ("b", 1, True), ("c", 1, True)],
               "mixed": [("a", 1, True), ("plain", 1, False)],
               "takeover": [("gone", 1, True), ("b", 1, True)],
               "squat": [("a", 1, True), ("plain", 1, False)]}[variant]
    servers = {}
    listening = 0
    log = t.dir / "member.log"
    holder_log = t.dir / "holder.log"
    for name, sockets, slip in members:
        env = {"SLIP_LOG": "info", "SLIP_LOG_FILE": str(log)} if name == "b" else None
        if name == "a":
            env = {"SLIP_LOG": "info", "SLIP_LOG_FILE": str(holder_log)}
        server = t.start(f"server-{name}",
                         py("reuseport.py", "server", "--port", t.port, "--bind", LOOPBACK,
                            "--member", name, "--sockets", sockets),
                         role="server", slip=slip, env=env)
        listening += sockets
        server.wait_until(lambda n=listening: listeners_on(t.port) >= n,
                          f"{listening} listener(s) on port {t.port}")
        servers[name] = server
    if variant == "takeover":
        gone = servers.pop("gone")
        gone.signal(signal.SIGTERM)
        gone.expect_exit(0)
        members = members[1:]
        servers["b"].wait_until(
            lambda: log.exists() and "this process's now" in log.read_text(),
            "the second member taking the port's rdma_cm listener over")
    squatter = None
    if variant == "squat":
        pid = servers["plain"].popen.pid
        inodes = [int(os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1])
                  for fd in os.listdir(f"/proc/{pid}/fd")
                  if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:[")]
        t.check(len(inodes) == 1, f"the plain member holds sockets {inodes}, expected one")
        squatter = t.start("squatter", ["setpriv", "--reuid=65534", "--regid=65534",
                                        "--clear-groups", PYTHON, HERE / "progs" /
                                        "group_squatter.py", "--port", t.port,
                                        "--inode", inodes[0], "--answer", 1234])
        squatter.wait_output("READY")
    started = time.monotonic()
    client = t.start("client", py("reuseport.py", "client", "--port", t.port, "--host", LOOPBACK,
                                  "--count", count, "--parallel", parallel), slip=True)
    client.expect_exit(0, timeout=180)
    took = time.monotonic() - started
    if squatter:
        squatter.signal(signal.SIGTERM)
        squatter.expect_exit(0)
        said = json.loads(squatter.stdout().strip().splitlines()[-1])
        t.check(said["uid"] == 65534, f"the squatter ran as uid {said['uid']}")
        text = holder_log.read_text() if holder_log.exists() else ""
        print(f"the holder asked the squatter {said['asked']} time(s)")
        t.check("not by the socket's owner" in text,
                f"the holder did not say it ignored the squatter: {text[-2000:]!r}")
    for server in servers.values():
        server.signal(signal.SIGTERM)
    for server in servers.values():
        server.expect_exit(0)
    accepted = [(int(port), member) for port, member in client.json_output()["accepted"]]
    t.check(len(accepted) == count, f"{len(accepted)} of {count} connections answered")
    by_member = {}
    for _, member in accepted:
        by_member[member] = by_member.get(member, 0) + 1
    at_client, client_count = ends_on_port(t, client, t.port, "remote")
    t.check(client_count == count, f"the client's stats list {client_count} connections")
    at_server = {name: ends_on_port(t, server, t.port, "local")[0]
                 for name, server in servers.items()}
    print(f"{took:.1f} s; connections per member: {by_member}; client ends: "
          f"{sorted(set(at_client.values()))}")
    verbs = ("verbs", "")
    once = {p for p in at_client if sum(1 for q, _ in accepted if q == p) == 1}
    for port, member in accepted:
        if port not in once:
            continue  # (a port used twice: its record cannot be told apart)
        name = next(n for n in servers if member.startswith(n))
        said = at_client[port]
        if servers[name].slip:
            t.check(said == verbs, f"port {port} ({member}): {said} at the client, not verbs")
            t.check(at_server[name].get(port) == verbs,
                    f"port {port} ({member}): {at_server[name].get(port)} at its server")
        else:
            t.check(said == ("tcp", "reuseport"),
                    f"port {port} ({member}): {said} at the client, not tcp/reuseport")
        for other, ends in at_server.items():
            t.check(other == name or port not in ends,
                    f"port {port} ({member}) is in {other}'s stats too")
    expected_members = sum(sockets for _, sockets, _ in members)
    t.check(len(by_member) == expected_members,
            f"{expected_members} members, {len(by_member)} served: {by_member}")


@case("crr", variants=("reuseport",))
def crr(t, variant):
    """slip-perf tcp_crr (connect, 64 B request, 64 B reply, close, one after another, 3 s)
    against a server whose listener has SO_REUSEPORT: every connection waits for its TAKEN,
    and the server's reader sleeps on a held connection before its request lands. That
    reader once never woke (the completion queue was not armed for a sleeper that came
    while the connection was held): 1 run in 2 hung while the client looked for its TAKEN
    at 1, 2, 4 ... ms. With today's schedule (every millisecond) 3 runs without that fix
    did not hang, so this is a smoke test of the path, not proof of the fix. The run must
    end, and all but a few connections (a client port whose 4-tuple is in TIME_WAIT at the
    server: plain, reason reuseport) be on verbs at both ends."""
    perf = t.settings.build_dir / "bin" / "slip-perf"
    t.check(perf.is_file(), f"{perf} not built")
    server = t.serve("server", [perf, "server", "--bind", LOOPBACK, "-p", t.port, "--once",
                                "--reuseport"], slip=True)
    client = t.start("client", [perf, "client", LOOPBACK, "-p", t.port, "tcp_crr",
                                "--duration", 3, "--format", "csv"], slip=True)
    client.expect_exit(0, timeout=60)
    server.expect_exit(0, timeout=30)
    said = {}
    for record in client.stats_records():
        for c in record.get("connections", []):
            key = (c["transport"], c["reason"])
            said[key] = said.get(key, 0) + 1
    print(f"client ends: {said}")
    verbs = said.get(("verbs", ""), 0)
    others = {k: v for k, v in said.items() if k != ("verbs", "")}
    t.check(verbs >= 50, f"only {verbs} connections on verbs: {said}")
    t.check(set(others) <= {("tcp", "reuseport")} and sum(others.values()) <= verbs // 20,
            f"connections not on verbs: {others} of {verbs + sum(others.values())}")


@case("grpc", variants=("default",))
def grpc_default(t, variant):
    """A gRPC (python3-grpcio) parameter server and two workers with gRPC's DEFAULT options:
    its listener has SO_REUSEPORT (tests/workloads/grpc_ps.py, 4 synchronous SGD steps of
    3.2 MiB pulled and pushed per worker). Both ends under slip-run: the final parameters
    equal, bit for bit, the single-process computation's, and every connection to the PS is
    on verbs at both ends."""
    workloads = HERE.parent / "workloads"
    grpc_ps = [PYTHON, workloads / "grpc_ps.py"]
    steps = 4
    expected = t.dir / "expected.bin"
    out = t.dir / "params.bin"
    calc = t.start("expected", [*grpc_ps, "expected", "--steps", steps, "--out", expected])
    calc.expect_exit(0)
    logs = {name: t.dir / f"{name}.log" for name in ("ps", "worker0", "worker1")}
    env = {name: {"SLIP_LOG": "debug", "SLIP_LOG_FILE": str(path)} for name, path in logs.items()}
    ps = t.serve("ps", [*grpc_ps, "ps", "--host", LOOPBACK, "--port", t.port, "--steps", steps,
                        "--out", out], slip=True, env=env["ps"])
    workers = [t.start(f"worker{i}", [*grpc_ps, "worker", "--host", LOOPBACK, "--port", t.port,
                                      "--id", i, "--steps", steps], slip=True,
                       env=env[f"worker{i}"])
               for i in range(2)]
    for w in workers:
        w.expect_exit(0, timeout=240)
    ps.expect_exit(0, timeout=60)
    report = ps.json_output()
    t.check(report["steps"] == steps and not report["errors"], f"PS report {report}")
    t.check(out.read_bytes() == expected.read_bytes(),
            "the final parameters differ from the single-process computation")
    for w in workers:
        t.check(w.json_output()["final_digest"] == report["digest"], f"{w.name}: other digest")
    at_ps, n = ends_on_port(t, ps, t.port, "local")
    print(f"connections to the PS: {n}, {sorted(set(at_ps.values()))}")
    t.check(n >= 2 and set(at_ps.values()) == {("verbs", "")},
            f"connections at the PS: {at_ps}")
    for w in workers:
        at_worker, _ = ends_on_port(t, w, t.port, "remote")
        t.check(at_worker and set(at_worker.values()) == {("verbs", "")},
                f"{w.name}'s connections to the PS: {at_worker}")


@case("reuse", variants=("paced", "tight", "off", "send"))
def reuse(t, variant):
    """Sequential short connections from one client process to one server process (random
    sizes from 1 B to 512 KiB, every byte compared): after the first, a connection claims
    the queue pair that a closed one parked (docs/DESIGN.md "Reusing queue pairs") instead
    of a new rdma_cm exchange and queue pair. paced: a pause between connections lets both
    ends park, so every connection after the first reuses; tight: back to back, at least
    one does; off: SLIP_VERBS_REUSE=0 on the client, none does; send: paced, with iWARP's
    SEND notifications (SLIP_VERBS_NOTIFY=send). Every connection is on verbs at both ends,
    and every claim the client made was served by the listener."""
    count = 12
    logs = {name: t.dir / f"{name}.log" for name in ("server", "client")}
    env = {name: {"SLIP_LOG": "debug", "SLIP_LOG_FILE": str(path)} for name, path in logs.items()}
    if variant == "off":
        env["client"]["SLIP_VERBS_REUSE"] = "0"
    if variant == "send":
        for name in env:
            env[name]["SLIP_VERBS_NOTIFY"] = "send"
    twice = [PYTHON, HERE / "progs" / "twice.py"]
    server = t.serve("server", [*twice, "server", "--host", LOOPBACK, "--port", t.port,
                                "--count", count], slip=True, env=env["server"])
    pause = ["--pause", "1"] if variant in ("paced", "send") else []
    client = t.start("client", [*twice, "client", "--host", LOOPBACK, "--port", t.port,
                                "--count", count, "--seed", 7, *pause],
                     slip=True, env=env["client"])
    client.expect_exit(0)
    server.expect_exit(0)
    report = client.json_output()
    t.check(report["connections"] == count and report["ok"] == count, f"echo failed: {report}")
    moved = report["bytes"]
    t.expect_stats(client, "verbs", "", count=count, traffic=(moved, moved))
    t.expect_stats(server, "verbs", "", count=count, traffic=(moved, moved))
    text = {name: path.read_text() if path.exists() else "" for name, path in logs.items()}
    reused = text["client"].count("reusing parked queue pair")
    served = text["server"].count(": pending")
    print(f"{reused} of {count} connections reused a parked queue pair; {served} claims served")
    t.check(served == reused, f"the client claimed {reused} queue pairs, the listener served "
                              f"{served}: {text['server'][-3000:]!r}")
    expected = {"paced": count - 1, "send": count - 1, "off": 0}.get(variant)
    if expected is not None:
        t.check(reused == expected, f"expected {expected} reused queue pairs, got {reused}: "
                                    f"{text['client'][-3000:]!r}")
    else:
        t.check(reused >= 1, f"no connection reused a queue pair: {text['client'][-3000:]!r}")


@case("reuse_restart")
def reuse_restart(t, variant):
    """The listener's process exits while the client keeps queue pairs parked with it, and a
    new one listens on the same port: the client's next connections must not use the dead
    queue pairs (their disconnect retires them). Six connections, two seconds apart, random
    sizes echoed and compared: three to the first server, three to the second; all on
    verbs, and the second server's first connection is a new queue pair, not a claim."""
    logs = {name: t.dir / f"{name}.log" for name in ("server1", "server2", "client")}
    env = {name: {"SLIP_LOG": "debug", "SLIP_LOG_FILE": str(path)} for name, path in logs.items()}
    twice = [PYTHON, HERE / "progs" / "twice.py"]
    server1 = t.serve("server1", [*twice, "server", "--host", LOOPBACK, "--port", t.port,
                                  "--count", 3], slip=True, env=env["server1"])
    # The fourth connection waits until the second server listens (a slow start must not
    # make it a refused connection); the pause lets the first server's exit be seen.
    ready = t.dir / "server2.listening"
    client = t.start("client", [*twice, "client", "--host", LOOPBACK, "--port", t.port,
                                "--count", 6, "--seed", 11, "--pause", "2",
                                "--wait-file", ready, "--wait-before", 3],
                     slip=True, env=env["client"])
    server1.expect_exit(0)
    server2 = t.serve("server2", [*twice, "server", "--host", LOOPBACK, "--port", t.port,
                                  "--count", 3], slip=True, env=env["server2"])
    ready.touch()
    client.expect_exit(0)
    server2.expect_exit(0)
    report = client.json_output()
    t.check(report["connections"] == 6 and report["ok"] == 6, f"echo failed: {report}")
    t.expect_stats(client, "verbs", "", count=6)
    t.expect_stats(server1, "verbs", "", count=3)
    t.expect_stats(server2, "verbs", "", count=3)
    text = {name: path.read_text() if path.exists() else "" for name, path in logs.items()}
    served = [text[name].count(": pending") for name in ("server1", "server2")]
    reused = text["client"].count("reusing parked queue pair")
    print(f"claims served: {served}; the client reused {reused}")
    t.check(served == [2, 2] and reused == 4,
            f"expected 2 claims served by each server and 4 reuses, got {served}, {reused}: "
            f"{text['client'][-3000:]!r}")


@case("gid", variants=("default", "explicit", "missing_client", "missing_server"))
def gid(t, variant):
    """The source GID of the queue pairs: by default the RoCE v2 entry of the address (index 1
    on rxe0 here: 0 is the link-local one), as each end's debug log says; SLIP_GID_INDEX=1 the
    same, explicitly; SLIP_GID_INDEX=99 (no such entry) on one end: that end says so in its
    log and the connection stays on TCP, its bytes intact."""
    logs = {name: t.dir / f"{name}.log" for name in ("server", "client")}
    env = {name: {"SLIP_LOG": "debug", "SLIP_LOG_FILE": str(path)} for name, path in logs.items()}
    if variant == "explicit":
        for name in env:
            env[name]["SLIP_GID_INDEX"] = "1"
    elif variant.startswith("missing_"):
        env[variant[len("missing_"):]]["SLIP_GID_INDEX"] = "99"
    server, client, traffic = bulk_pair(t, server_env=env["server"], client_env=env["client"])
    text = {name: path.read_text() if path.exists() else "" for name, path in logs.items()}
    if not variant.startswith("missing_"):
        for proc in (server, client):
            t.expect_stats(proc, "verbs", "", traffic=traffic[proc])
        for name in logs:
            t.check("source GID index 1 (RoCE v2)" in text[name],
                    f"{name}: no 'source GID index 1 (RoCE v2)' in its log: {text[name][-2000:]!r}")
        return
    broken = variant[len("missing_"):]
    t.check("SLIP_GID_INDEX=99" in text[broken] and "no such GID" in text[broken],
            f"{broken}: its log does not name the bad GID index: {text[broken][-2000:]!r}")
    for proc in (server, client):
        stats = proc.stats_records()[0]["connections"]
        t.check(len(stats) == 1 and stats[0]["transport"] == "tcp",
                f"{proc.name}: expected one connection on TCP, stats {stats}")


def nbconnect_argv(role, t, *extra, port=None):
    return [PYTHON, HERE / "progs" / "nbconnect.py", role, "--host", LOOPBACK, "--port",
            port or t.port, *extra]


@case("nbconnect", variants=("verbs", "plain_server", "refused", "closed"))
def nbconnect(t, variant):
    """Non-blocking connect never blocks on detection (tests/vm/progs/nbconnect.py).
    verbs: the Slipstream server is stopped (SIGSTOP: its rdma_cm listener cannot answer)
    while the client issues 12 non-blocking connects: each must return EINPROGRESS at once,
    none complete, a second connect() says EALREADY; then the server continues and every
    connection completes with EPOLLOUT and SO_ERROR 0 (getpeername works, connect() says
    EISCONN), random sizes go both ways intact (SHA-256), and both ends' stats say verbs.
    plain_server: the server is not Slipstream: the rdma_cm request is rejected after
    connect() returned, the TCP socket goes back to the number and its epoll registration
    (made right after connect()) still reports the completion; content intact, stats tcp.
    refused: nothing listens: the completion is EPOLLOUT with SO_ERROR ECONNREFUSED.
    closed: the server is stopped and the client's handshake timeout short (1.5 s): of 8
    connects issued, 4 numbers are taken back while connecting (dup2 of /dev/null over
    them, two closed first); the connector's fallback after the timeout must leave those
    numbers alone (still /dev/null at the end) and put the other 4 back on TCP, where
    they complete and carry their bytes intact (stats: tcp, handshake_timeout)."""
    count = {"verbs": 12, "closed": 8}.get(variant, 4)
    served = count - 4 if variant == "closed" else count
    log = t.dir / "client.log"
    env = {"SLIP_LOG": "debug", "SLIP_LOG_FILE": str(log)}
    if variant == "verbs":
        # Generous, so that nothing times out while the server is stopped.
        env["SLIP_HANDSHAKE_TIMEOUT_MS"] = "20000"
    if variant == "closed":
        env["SLIP_HANDSHAKE_TIMEOUT_MS"] = "1500"
    if variant == "refused":
        client = t.start("client", nbconnect_argv("client", t, "--count", count, "--expect-error",
                                                  "ECONNREFUSED", port=pick_port()),
                         slip=True, env=env)
        client.expect_exit(0)
        report = client.json_output()
        t.check(report["ok"] == count, f"refused: {report}")
        records = client.stats_records()  # none at all: no connection, no record
        t.check(all(r.get("connections") == [] for r in records),
                f"a refused connect is no connection, stats: {records}")
        return
    server = t.serve("server", nbconnect_argv("server", t, "--count", served),
                     slip=variant in ("verbs", "closed"))
    stopped = variant in ("verbs", "closed")
    if stopped:
        server.signal(signal.SIGSTOP)
    extra = ["--expect-pending"] if stopped else []
    if variant == "closed":
        # Held past the handshake timeout: the fallbacks happen while the server is stopped.
        extra += ["--replace", 4, "--hold-ms", 4000]
    try:
        client = t.start("client", nbconnect_argv("client", t, "--count", count, *extra),
                         slip=True, env=env)
        client.wait_until(lambda: '"issued"' in client.stdout(), "the connects issued",
                          timeout=60)
    finally:
        server.signal(signal.SIGCONT)
    client.expect_exit(0, timeout=120)
    server.expect_exit(0, timeout=120)
    issued = json.loads(next(line for line in client.stdout().splitlines() if '"issued"' in line))
    print("client:", issued)
    report = client.json_output()
    t.check(report["ok"] == served, f"client: {report}")
    if variant == "closed":
        t.check(len(issued["replaced"]) == 4, f"client: {issued}")
        t.expect_stats(client, "tcp", "handshake_timeout", count=served)
    elif variant == "verbs":
        t.check(issued["complete_at_once"] == 0 and issued["second_connect"] == "EALREADY",
                f"connect() did not return before detection: {issued}")
        # The server was stopped throughout: only a connect() that does not wait for the
        # listener's answer can have returned at all; the bound is a sanity check.
        t.check(issued["slowest_connect_ms"] < 2000, f"a connect() was slow: {issued}")
        t.expect_stats(server, "verbs", "", count=count)
        t.expect_stats(client, "verbs", "", count=count)
    else:
        t.expect_stats(client, "tcp", "peer_not_slipstream", count=count)


RXE_COUNTERS = Path("/sys/class/infiniband/rxe0/ports/1/hw_counters")


def rdma_packets():
    try:
        return int((RXE_COUNTERS / "sent_pkts").read_text())
    except OSError:
        return -1


def rdma_link(*args):
    done = subprocess.run(["rdma", "link", *args], capture_output=True, text=True, timeout=120)
    return done.returncode, (done.stdout + done.stderr).strip()


@case("failover", variants=("device_removed",))
def failover(t, variant):
    """The RDMA device is deleted (`rdma link delete rxe0`) while 48 MiB flow each way
    over verbs: both ends fail over to their TCP connection at the byte offsets they agree on
    in FAILOVER messages, and the application sees nothing but a slower stream: both streams
    arrive intact (SHA-256), each end's stats say "tcp", reason "failover", and each log
    says why. The device is re-created afterwards for the cases that follow.

    The processes release the device at once (docs/DESIGN.md "Failover"): both ends keep
    their connection open after the transfer until told (bulk.py --hold), and `rdma link
    delete` must return while both still run (rxe cannot disassociate a user context: the
    delete waits until every file of the device is closed), and `rdma link add` too."""
    logs = {name: t.dir / f"{name}.log" for name in ("server", "client")}
    env = {name: {"SLIP_LOG": "info", "SLIP_LOG_FILE": str(path)} for name, path in logs.items()}
    hold = t.dir / "hold"
    removed = {}

    def running(server, client):
        return [proc.name for proc in (server, client) if proc.popen.poll() is None]

    def remove_device(server, client):
        # Only once RDMA really carries the streams (a few MiB), and well before they end.
        start = rdma_packets()
        client.wait_until(lambda: rdma_packets() - start > 3000, "RDMA traffic", timeout=60)
        began = time.monotonic()
        removed["status"] = rdma_link("delete", "rxe0")
        removed["seconds"] = time.monotonic() - began
        removed["running"] = running(server, client)
        removed["added"] = rdma_link("add", "rxe0", "type", "rxe", "netdev", "rxv0")
        removed["running_after_add"] = running(server, client)
        hold.touch()

    try:
        server, client, traffic = bulk_pair(t, server_env=env["server"], client_env=env["client"],
                                            total=48 * MiB, meanwhile=remove_device, dump=True,
                                            hold=hold)
    finally:
        hold.touch()
        if not RXE_COUNTERS.parent.parent.exists():
            rdma_link("add", "rxe0", "type", "rxe", "netdev", "rxv0")
        for name, path in logs.items():  # shown when the case fails
            print(f"--- {name}'s log:\n{path.read_text() if path.exists() else '(none)'}")
    code, said = removed.get("status", (None, "not attempted"))
    t.check(code == 0, f"rdma link delete rxe0 failed ({code}): {said}")
    print(f"device deleted in {removed['seconds']:.2f} s while the transfer ran")
    t.check(removed["running"] == ["server", "client"],
            f"rdma link delete rxe0 returned only after {removed['seconds']:.2f} s, when "
            f"these still ran: {removed['running']} (the processes held the device)")
    code, said = removed["added"]
    t.check(code == 0, f"rdma link add rxe0 failed ({code}): {said}")
    t.check(removed["running_after_add"] == ["server", "client"],
            f"after rdma link add rxe0 only these still ran: {removed['running_after_add']}")
    for proc in (server, client):
        t.expect_stats(proc, "tcp", "failover", traffic=traffic[proc])
    for name, path in logs.items():
        text = path.read_text() if path.exists() else ""
        t.check("continues on TCP" in text, f"{name}: no failover line in its log: {text!r}")


@case("qp_fault", variants=("server_reset", "client_reset", "server_err"))
def qp_fault(t, variant):
    """A queue pair stops behind its owner's back while 48 MiB flow each way:
    tests/vm/progs/qp_fault.c moves it to RESET (no completion, no rdma_cm event: the silent
    case) or to ERR. Both ends continue on TCP from the byte offsets they agree on (a
    connection that waits without progress checks its queue pair and probes the peer's),
    the streams arrive exactly, and nothing hangs."""
    lib = t.settings.build_dir / "tests" / "vm" / "qp_fault.so"
    t.check(lib.exists(), f"{lib} is not built")
    cue = t.dir / "fault"
    side, state = variant.split("_")
    log = t.dir / f"{side}.log"
    fault = {"LD_PRELOAD": str(lib), "QP_FAULT_FILE": str(cue), "QP_FAULT_STATE": state.upper(),
             "SLIP_LOG": "info", "SLIP_LOG_FILE": str(log)}

    def inject(server, client):
        start = rdma_packets()
        client.wait_until(lambda: rdma_packets() - start > 3000, "RDMA traffic", timeout=60)
        cue.touch()

    try:
        server, client, traffic = bulk_pair(t, server_env=fault if side == "server" else None,
                                            client_env=fault if side == "client" else None,
                                            total=48 * MiB, meanwhile=inject)
    finally:
        print(f"--- {side}'s log:\n{log.read_text() if log.exists() else '(none)'}")
    for proc in (server, client):
        t.expect_stats(proc, "tcp", "failover", traffic=traffic[proc])


if __name__ == "__main__":
    sys.exit(main(__doc__, CASES))
