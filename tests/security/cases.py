"""The attack cases: each drives the built library through slip-run the way an attacker (or
an unlucky operator) would, and asserts the victim's safety. CASES maps a case name to its
function and variants; SERIAL names the tests that flood the host or measure time or CPU
(CTest runs them alone). The item of docs/SECURITY.md each case covers is in README.md.

Every content check compares bytes (SHA-256 of random data of random sizes), never only
lengths. Failure messages say what the attacker achieved.
"""

import json
import os
import random
import resource
import shutil
import signal
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))

from harness import PYTHON, TestFailure, is_listening, pick_port  # noqa: E402

PROGS = HERE / "progs"
IT_PROGS = HERE.parent / "integration" / "progs"
sys.path.insert(0, str(IT_PROGS))
from common import tcp_listeners  # noqa: E402
MiB = 1 << 20

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
# Descriptor limit for the flooders (SCM_RIGHTS descriptors in flight count against the
# sender's RLIMIT_NOFILE) and for the quota server: as high as this host lets root set it
# (a container without CAP_SYS_RESOURCE cannot go above its hard limit).
MANY_FDS = min(65536, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
MANY_FDS_LIMIT = ["prlimit", f"--nofile={MANY_FDS}:{MANY_FDS}", "--"]
# A uid of its own for control_thread: RLIMIT_NPROC counts every process of the uid, so a
# uid that other tests (or other users of the host) also run as would make it flaky.
NPROC_UID = 61234

# Every wait of a test ends by this deadline (CTest's own limit is 60 s, and a test killed by
# CTest could not end its programs).
TEST_BUDGET_S = 48
DEADLINE = time.monotonic() + TEST_BUDGET_S

CASES = {}
SERIAL = set()


def case(name, variants=("run",), serial=False):
    """Registers a case; `serial`: True (every variant runs alone) or the variants that do."""
    def register(function):
        CASES[name] = (function, tuple(variants))
        SERIAL.update(f"{name}.{v}" for v in (variants if serial is True else serial or ()))
        return function
    return register


# ------------------------------------------------------------------------------ helpers

def sec(script, *args):
    return [PYTHON, str(PROGS / script), *map(str, args)]


def integ(script, *args):
    return [PYTHON, str(IT_PROGS / script), *map(str, args)]


def world_dir(t):
    """A directory other uids can write into (the test dir itself is root's)."""
    os.chmod(t.dir, 0o755)
    path = t.dir / "world"
    path.mkdir(exist_ok=True)
    os.chmod(path, 0o1777)
    return path


def launch(t, name, argv, slip=False, env=None, prefix=(), role="client", stats_dir=None,
           netns=None):
    """Starts `argv` (under slip-run when `slip`) behind `prefix` (prlimit, setpriv), which
    runs outside slip-run, so that the stats record is the program's own; in network
    namespace `netns` when given."""
    stats = Path(stats_dir or t.dir) / f"{name}.stats.jsonl"
    cmd = [*prefix, str(t.settings.slip_run), f"--stats={stats}", "--", *argv] if slip \
        else [*prefix, *argv]
    proc = t.start(name, cmd, role=role, slip=False, env=env, netns=netns)
    if slip:
        proc.slip = True
        proc.stats_path = stats
        proc.exe = os.path.realpath(shutil.which(str(argv[0])) or argv[0])
    return proc


def wait_listening(proc, port, timeout=15):
    deadline = time.monotonic() + timeout
    while not is_listening(port):
        status = proc.popen.poll()
        if status is not None:
            raise TestFailure(f"{proc.name}: {status_text(status)} before it listened on "
                              f"port {port}")
        if time.monotonic() > deadline:
            raise TestFailure(f"{proc.name}: not listening on port {port} after {timeout} s")
        time.sleep(0.01)


def finish(proc, timeout):
    """The exit status, or None if the program still runs after `timeout` s (or at the
    test's deadline, whichever comes first)."""
    try:
        return proc.wait(max(0.5, min(timeout, DEADLINE - time.monotonic())))
    except TestFailure:
        return None


def status_text(status):
    if status is None:
        return "still running (hung)"
    if status < 0:
        return f"killed by {signal.Signals(-status).name}"
    return f"exit status {status}"


def json_lines(proc):
    out = []
    for line in proc.stdout().splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return out


def last_json(proc):
    lines = json_lines(proc)
    if not lines:
        raise TestFailure(f"{proc.name}: no JSON report on stdout "
                          f"({status_text(proc.popen.poll())})")
    return lines[-1]


def stop(proc, timeout=10):
    """SIGTERM, then the program must exit with status 0 (it reports first)."""
    proc.signal(signal.SIGTERM)
    status = finish(proc, timeout)
    if status != 0:
        raise TestFailure(f"{proc.name}: {status_text(status)} after SIGTERM, expected a "
                          "normal exit with status 0")


def connections(t, proc, port, key):
    """The connections on `port` (by `key`, "local" or "remote") in the program's one stats
    record; [] when it wrote none."""
    records = proc.stats_records()
    if not records:
        return []
    t.check(len(records) == 1, f"{proc.name}: {len(records)} stats records, expected one")
    return [c for c in records[0].get("connections", [])
            if int(c[key].rsplit(":", 1)[1]) == port]


def describe_connections(conns):
    return ", ".join(f"{c['transport']}/{c['reason'] or '-'}" for c in conns) or "none"


def check_client_results(t, proc, expected, status=0):
    """The client.py report: every connection exact and error-free; then its exit status
    (3: it gave up on a stalled exchange, which the report describes)."""
    if status is None or not json_lines(proc):
        raise TestFailure(f"{proc.name}: {status_text(status)}, no report")
    report = last_json(proc)
    results = report["results"]
    bad = [r for r in results if not r["exact"] or r.get("error")]
    t.check(not bad, f"{proc.name}: {len(bad)} of {expected} connections broke: " +
            "; ".join(f"#{r['index']}: {r.get('error') or 'echo differs'} "
                      f"({r.get('received', 0)} of {r.get('sent', '?')} B back)" for r in bad))
    return report


def cpu_seconds(pid):
    """utime + stime of the whole process (all threads), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def random_total(rng, low, high):
    return rng.randint(low, high)


# ------------------------------------------------------------------------------ 1

def squatter_got_nothing(t, squatter):
    """Stops progs/squatter.py and checks that it ran as nobody and was handed no message
    and no descriptor; returns its report."""
    stop(squatter)
    said = last_json(squatter)
    t.check(said["uid"] == 65534, f"the squatter ran as uid {said['uid']}, not nobody")
    t.check(not said["messages"] and said["fds"] == 0,
            f"the squatter (uid nobody) holding {said['bound']} received "
            f"{len(said['messages'])} message(s) and {said['fds']} descriptor(s) from the "
            f"root client: {said['messages'][:3]}")
    return said


def check_bulk_pair(t, statuses, server, client):
    """Both ends of a progs/bulk.py exchange exited 0, and each read exactly what the other
    sent (the server's application: exactly the client's bytes)."""
    for proc, status in statuses.items():
        t.check(status == 0, f"{proc.name}: {status_text(status)}")
    server_said, client_said = last_json(server), last_json(client)
    t.expect_same_stream("client -> server (what the server's application read)",
                         client_said, server_said)
    t.expect_same_stream("server -> client", server_said, client_said)


def printed_inode(proc):
    """The listening socket's inode that progs/late_listen.py printed ("INODE <n>")."""
    for line in proc.stdout().splitlines():
        if line.startswith("INODE "):
            return int(line.split()[1])
    return None


@case("rendezvous_squat", ("exact", "wildcard"))
def rendezvous_squat(t, variant):
    """A user (nobody) binds the v3 rendezvous name of the root server's listening socket
    ("slipstream-v3:<port>:<inode>"; the server, bound to 127.0.0.1 (exact) or 0.0.0.0
    (wildcard), prints its socket's inode and listens only once the squatter holds the
    name, so the shim cannot publish). A root client under slip-run must not hand that
    squatter its registration (message or descriptors), and both streams must be exact:
    the server's application reads exactly the client's bytes."""
    bind = "127.0.0.1" if variant == "exact" else "0.0.0.0"
    rng = random.Random()
    seeds = (rng.randrange(1 << 30), rng.randrange(1 << 30))
    total = random_total(rng, MiB, 3 * MiB)
    print(f"seeds {seeds}, {total} B each way")
    go = t.dir / "listen.go"
    server = launch(t, "server", sec("late_listen.py", go, "server", "--port", t.port,
                                     "--bind", bind, "--seed", seeds[0], "--total", total),
                    slip=True, role="server")
    server.wait_until(lambda: printed_inode(server) is not None, "its socket's inode")
    inode = printed_inode(server)
    squatter = launch(t, "squatter", sec("squatter.py", "--port", t.port, "--inode", inode),
                      prefix=NOBODY)
    squatter.wait_output("READY")
    go.touch()
    wait_listening(server, t.port)
    listeners = tcp_listeners(t.port)
    t.check([(uid, ino) for _, uid, ino in listeners] == [(0, inode)],
            f"setup: the listeners of port {t.port} are {listeners}, expected one of root "
            f"with the inode the server printed ({inode})")
    client = launch(t, "client", integ("bulk.py", "client", "--port", t.port,
                                       "--seed", seeds[1], "--total", total), slip=True)
    statuses = {p: finish(p, 20) for p in (client, server)}
    said = squatter_got_nothing(t, squatter)
    check_bulk_pair(t, statuses, server, client)
    conns = connections(t, client, t.port, "remote")
    print(f"client: {describe_connections(conns)}; server: "
          f"{describe_connections(connections(t, server, t.port, 'local'))}; squatter saw "
          f"{said['connections']} connection(s): {said['peers']}")
    t.check([(c["transport"], c["reason"]) for c in conns] == [("tcp", "untrusted_rendezvous")],
            f"client stats: {describe_connections(conns)}, expected one tcp/untrusted_rendezvous")
    # The client must have reached the squatted name and turned away (the uid check), not
    # merely found no rendezvous: otherwise the attack was not played.
    t.check(client.popen.pid in [p["pid"] for p in said["peers"]],
            f"the client (pid {client.popen.pid}) never connected to the squatted name (the "
            f"squatter's peers: {said['peers']}): the rendezvous check was not exercised")


# ------------------------------------------------------------------------------ 2

# The race window is the server's own (between two reads of the header, ~100 ns): each
# attempt wins it with some probability (about 1 in 4 on a loaded 2-CPU host with the
# flipper at SCHED_FIFO; 1 in 10-20 without), so the attack is repeated.
RACE_ATTEMPTS = 16
RACE_ACCEPT_DELAY_S = 0.4


@case("shm_scribble", ("control", "control_slip", "ring_size_race"), serial=True)
def shm_scribble(t, variant):
    """A hostile peer writes over its own connection's shared region while a legitimate
    connection to the same threaded echo server echoes 8-16 MiB. control: random bytes over
    the control page and the rings while data flows (a raw peer; control_slip: a client
    under slip-run that maps its own region from /proc/self/fd). ring_size_race:
    header.ring_size flips between the registered value and 2 GiB from before REGISTER on,
    while the server waits 0.4 s before each accept(); 16 connections, each a new region.
    The server must survive (and exit 0 when told), the legitimate echo must be exact."""
    race = variant == "ring_size_race"
    server = launch(t, "server", sec("servers.py", "--impl", "threaded", "--port", t.port,
                                     "--accept-delay", RACE_ACCEPT_DELAY_S if race else 0),
                    slip=True, role="server")
    wait_listening(server, t.port)
    if race:
        hostile = launch(t, "hostile", sec("raw_shm.py", "--mode", "ring_size_race",
                                           "--port", t.port, "--attempts", RACE_ATTEMPTS,
                                           "--hold", 2, "--realtime"))
    elif variant == "control_slip":
        hostile = launch(t, "hostile", sec("scribble_self.py", "--port", t.port, "--duration", 4,
                                           "--seed", random.randrange(1 << 30)), slip=True)
        hostile.wait_output("SCRIBBLING")
    else:
        hostile = launch(t, "hostile", sec("raw_shm.py", "--mode", "scribble", "--port", t.port,
                                           "--duration", 4, "--seed", random.randrange(1 << 30)))
    time.sleep(0.3)
    seed = random.randrange(1 << 30)
    legit = launch(t, "legit", sec("client.py", "--port", t.port, "--min-bytes", 8 * MiB,
                                   "--max-bytes", 16 * MiB, "--seed", seed), slip=True)
    legit_status = finish(legit, 40)
    hostile_status = finish(hostile, 40)
    alive = server.popen.poll() is None
    t.check(alive, f"the server died: {status_text(server.popen.poll())} (hostile client: "
                   f"{status_text(hostile_status)})")
    check_client_results(t, legit, 1, legit_status)
    stop(server)
    said = last_json(server)
    hostile_said = json_lines(hostile)
    legit_conns = connections(t, legit, t.port, "remote")
    print(f"legitimate connection: {describe_connections(legit_conns)} (shm expected); "
          f"server connections ended: {said['ended']}; hostile: "
          f"{hostile_said[-1] if hostile_said else status_text(hostile_status)}")


# ------------------------------------------------------------------------------ 3

FD_CLIENTS = 6


@case("fd_limit", ("near_limit", "registration_flood"), serial=("registration_flood",))
def fd_limit(t, variant):
    """near_limit: a server with only 5 free descriptors (RLIMIT_NOFILE 256, the rest taken
    by /dev/null) serves 6 clients one after another. registration_flood: a user (nobody)
    first sends up to 300 registrations with 4 real descriptors each that never connect
    (the listener keeps each, with its rendezvous connection, until it expires; the flood
    stops at the first DECLINE, the per-uid share), to a server with the default limit of
    1024; then 5 clients. Every client's echo must be exact (no reset), the server's
    accept() must never fail, and a client connection left plain must say why: fd_limit."""
    flood_run = variant == "registration_flood"
    count = 5 if flood_run else FD_CLIENTS
    server_args = ["--impl", "sequential", "--port", t.port, "--count", count]
    if not flood_run:
        server_args += ["--free-fds", 5]
    limit = "--nofile=1024:1024" if flood_run else "--nofile=256:256"
    server = launch(t, "server", sec("servers.py", *server_args), slip=True, role="server",
                    prefix=["prlimit", limit, "--"])
    wait_listening(server, t.port)
    if flood_run:
        flood = launch(t, "flood", sec("flood.py", "--mode", "registrations", "--port", t.port,
                                       "--count", 300, "--answer-wait", 1),
                       prefix=[*MANY_FDS_LIMIT, *NOBODY])
        t.check(finish(flood, 30) == 0, f"flood: {status_text(flood.popen.poll())}")
        print(f"flood: {last_json(flood)}")
    else:
        time.sleep(0.3)  # the server fills its descriptor table
    client = launch(t, "client", sec("client.py", "--port", t.port, "--connections", count,
                                     "--seed", random.randrange(1 << 30)), slip=True)
    client_status = finish(client, 40)
    server_status = finish(server, 5)
    server_said = json_lines(server)
    check_client_results(t, client, count, client_status)
    t.check(server_said and not server_said[-1]["accept_errors"],
            f"the server's accept() failed: "
            f"{server_said[-1]['accept_errors'] if server_said else status_text(server_status)}")
    t.check(server_status == 0, f"server: {status_text(server_status)}")
    conns = connections(t, client, t.port, "remote")
    print(f"client connections: {describe_connections(conns)}")
    t.check(len(conns) == count, f"client stats list {len(conns)} connections, expected {count}")
    wrong = [c for c in conns if c["transport"] == "tcp" and c["reason"] != "fd_limit"]
    t.check(not wrong, f"plain client connections that do not say fd_limit: "
                       f"{describe_connections(wrong)}")


# ------------------------------------------------------------------------------ 4

QUOTA_LEGIT = 4


@case("registration_quota", serial=True)
def registration_quota(t, _):
    """4 root clients connect to a server that does not accept yet (their registrations
    wait in the rendezvous' backlog: a listener reads it only once its process accepts);
    then a user (nobody) floods registrations (each kept by the listener, unanswered, as
    v3 answers only at accept) until the server refuses one (a DECLINE) or 5000 are sent;
    the server accepts everything once the flood is over or has filled the rendezvous
    backlog (the flood then continues as the server reads it). Every legitimate echo must
    be exact (none reset), and a fresh root client afterwards must still be accelerated
    (shm): one uid must not fill the registration table for everyone. (Whether the 4 that
    waited through the flood are accelerated is printed, not asserted.)"""
    # (RLIMIT_NOFILE as high as it goes for the server: this case is about the table.)
    server = launch(t, "server", sec("servers.py", "--impl", "threaded", "--port", t.port,
                                     "--wait-signal"),
                    slip=True, role="server", prefix=MANY_FDS_LIMIT)
    wait_listening(server, t.port)
    legit = launch(t, "legit", sec("client.py", "--port", t.port, "--connections", QUOTA_LEGIT,
                                   "--connect-first", "--max-bytes", 128 * 1024, "--stall", 60,
                                   "--seed", random.randrange(1 << 30)), slip=True)
    legit.wait_output("CONNECTED")
    flood = launch(t, "flood", sec("flood.py", "--mode", "registrations", "--port", t.port,
                                   "--count", 5000, "--answer-wait", 1, "--retry-busy", 10),
                   prefix=[*MANY_FDS_LIMIT, *NOBODY])
    # The server starts accepting once the flood is over, or once the rendezvous backlog is
    # full (the flood then goes on as the server reads it).
    while "BUSY" not in flood.stdout().splitlines() and flood.popen.poll() is None:
        t.check(time.monotonic() < DEADLINE, "the flood neither ended nor filled the backlog")
        time.sleep(0.02)
    server.signal(signal.SIGUSR1)
    t.check(finish(flood, 60) == 0, f"flood: {status_text(flood.popen.poll())}")
    print(f"flood (uid nobody): {last_json(flood)}")
    legit_status = finish(legit, 30)
    check_client_results(t, legit, QUOTA_LEGIT, legit_status)
    fresh = launch(t, "fresh", sec("client.py", "--port", t.port, "--connections", 1,
                                   "--seed", random.randrange(1 << 30)), slip=True)
    fresh_status = finish(fresh, 20)
    check_client_results(t, fresh, 1, fresh_status)
    stop(server)
    print(f"legitimate: {describe_connections(connections(t, legit, t.port, 'remote'))}")
    conns = connections(t, fresh, t.port, "remote")
    t.check([c["transport"] for c in conns] == ["shm"],
            f"the fresh root client after the flood got {describe_connections(conns)}, "
            "expected shm")


# ------------------------------------------------------------------------------ 5

MAX_LAG_MS = 250
PROBE_BYTES = 4096  # claim_set: bytes the attacker sends over TCP once declined


@case("accept_stall", ("connect", "claim_set"), serial=True)
def accept_stall(t, variant):
    """An asyncio echo server (non-blocking listener) measures its event loop's lag while a
    legitimate client does echo round trips; an attacker registers and connects TCP from
    the registered 4-tuple, then does nothing at all: it never touches its rings, never
    withdraws (connect; the server takes the connection at accept and must not wait for
    anything from it), or it first writes 1 (taken) into the claim word itself, before the
    server could claim (claim_set; the server's claim then fails: it must not carry the
    connection on the rings, it says DECLINE, and the connection is plain TCP - a probe of
    4 KiB over TCP must come back exactly, or the connection be dropped before the
    application saw it). The loop must never stall 250 ms or more, and every echo must be
    exact."""
    server = launch(t, "server", sec("servers.py", "--impl", "asyncio", "--port", t.port),
                    slip=True, role="server")
    wait_listening(server, t.port)
    legit = launch(t, "legit", sec("client.py", "--mode", "rtt", "--port", t.port,
                                   "--duration", 4, "--seed", random.randrange(1 << 30)),
                   slip=True)
    legit.wait_output("CONNECTED")
    time.sleep(0.5)
    attacker = launch(t, "attacker", sec("raw_shm.py", "--mode",
                                         "claim" if variant == "claim_set" else "connect",
                                         "--port", t.port, "--hold", 3,
                                         "--probe", PROBE_BYTES, "--timeout", 2,
                                         "--seed", random.randrange(1 << 30)))
    legit_status = finish(legit, 30)
    attacker_status = finish(attacker, 30)
    stop(server)
    said = last_json(server)
    rtt = last_json(legit)
    attack = json_lines(attacker)
    print(f"server: {said}; legitimate: {rtt}; attacker: "
          f"{attack[-1] if attack else status_text(attacker_status)}")
    t.check(legit_status == 0 and rtt["exact"] and not rtt["error"],
            f"legitimate client: {status_text(legit_status)}, report {rtt}")
    t.check(said["max_lag_ms"] < MAX_LAG_MS,
            f"the server's event loop stalled {said['max_lag_ms']} ms (limit {MAX_LAG_MS} ms) "
            f"while accepting the attacker's connection; legitimate round trip max "
            f"{rtt['max_rtt_ms']} ms")
    t.check(attack, f"attacker: no report ({status_text(attacker_status)})")
    attack = attack[-1]
    if variant == "connect":
        # The attack was played: the server took the connection onto the rings at accept.
        t.check(attack["accelerated"] and attack["claim"] == "taken" and
                (attack["answer"] or [None])[0] == "accept",
                f"precondition: the server did not take the attacker's registration at "
                f"accept (ACCEPT, claim word 1): {attack}")
        return
    # claim_set: the client's own 1 must make the server's claim fail: DECLINE
    # (no_registration), never ACCEPT, and the connection is not carried on the rings.
    t.check(attack["set_claim"] and (attack["answer"] or [None])[:1] == ["decline"] and
            attack["answer"][2] == 2,
            f"the server answered {attack['answer']} for a registration whose claim word its "
            f"client had set to 1 itself: expected DECLINE no_registration (its claim fails)")
    probe = attack["probe"]
    plain = probe["exact"] and probe["end"] is None
    dropped = probe["received"] == 0 and probe["end"] in ("eof", "ECONNRESET", "EPIPE")
    print("claim_set: the connection was " + (
        "served as plain TCP (the probe came back exactly)" if plain else
        f"dropped before the application saw it (probe: {probe['end']})"
        if dropped else f"neither plain nor dropped: {probe}"))
    # Only the server's own claim makes a connection the rings' (Registration::Abandon):
    # the word its client wrote leaves it plain, never dropped.
    t.check(plain,
            f"the attacker's connection is not plain TCP (its {probe['sent']} B over TCP "
            f"must come back exactly): {probe}")
    # The asyncio server's application saw the legitimate connection, and the attacker's
    # only when it was served plain.
    t.check(said["connections"] == (2 if plain else 1),
            f"the server's application accepted {said['connections']} connection(s); "
            f"expected {2 if plain else 1} (the legitimate one"
            f"{' and the plain attacker' if plain else ''})")


# ------------------------------------------------------------------------------ 6

SIGPIPE_SCENARIOS = {"sigpipe": "close", "sigpipe_unread": "close_unread",
                     "sigpipe_shut_rd": "shut_rd"}


@case("signals", ("xfsz", *SIGPIPE_SCENARIOS))
def signals(t, variant):
    """xfsz: both ends under slip-run with RLIMIT_FSIZE 64 KiB and their stats and log files
    already larger than that: neither program may die by a signal (SIGXFSZ), and both
    streams must be exact. sigpipe*: a writer with SIGPIPE at its default action writes
    1 KiB every 10 ms to a peer that closed (sigpipe), closed with bytes unread
    (sigpipe_unread) or shut down its read side (sigpipe_shut_rd); run plain, then with
    both ends under slip-run: the same writes must succeed and the same write must fail
    (or kill) in the same way."""
    if variant == "xfsz":
        return xfsz(t)
    scenario = SIGPIPE_SCENARIOS[variant]
    outcomes = {}
    for mode, port in (("plain", t.port), ("slip", pick_port())):
        slip = mode == "slip"
        server = launch(t, f"{mode}_server", sec("sigpipe.py", "server", "--port", port,
                                                 "--scenario", scenario, "--hold", 1),
                        slip=slip, role="server")
        wait_listening(server, port)
        client = launch(t, f"{mode}_client", sec("sigpipe.py", "client", "--port", port,
                                                 "--scenario", scenario), slip=slip)
        status = finish(client, 20)
        lines = [line for line in client.stdout().splitlines()
                 if line.startswith("write") or line == "done"]
        finish(server, 10)
        outcomes[mode] = (lines, status)
        if slip:
            print("connections: " + "; ".join(
                f"{p.name} {describe_connections(connections(t, p, port, key))}"
                for p, key in ((server, "local"), (client, "remote"))))
    plain_lines, plain_status = outcomes["plain"]
    slip_lines, slip_status = outcomes["slip"]

    def summary(lines, status):
        said = [line.split(" ", 2)[2] for line in lines if line != "done"]
        text = f"{sum(1 for x in said if x.startswith('ok'))} write(s) succeeded"
        failed = [f"write {n} {x}" for n, x in enumerate(said, 1) if not x.startswith("ok")]
        if failed:
            text += f"; {', '.join(failed)}"
        if status is not None and status < 0:
            text += f"; {status_text(status)} in write {len(said) + 1}"
        else:
            text += f"; {status_text(status)}"
        return text

    for mode, (lines, status) in outcomes.items():
        print(f"{mode}: {summary(lines, status)}")
    t.check((slip_lines, slip_status) == (plain_lines, plain_status),
            f"peer {scenario}: plain TCP: {summary(plain_lines, plain_status)}; under "
            f"Slipstream: {summary(slip_lines, slip_status)}")


def xfsz(t):
    rng = random.Random()
    seeds = (rng.randrange(1 << 30), rng.randrange(1 << 30))
    total = random_total(rng, MiB, 4 * MiB)
    filler = json.dumps({"pid": 0, "exe": "filler", "connections": [], "dropped": 0}) + "\n"
    procs = {}
    for role, seed in (("server", seeds[0]), ("client", seeds[1])):
        stats = t.dir / f"{role}.stats.jsonl"
        log = t.dir / f"{role}.log"
        stats.write_text(filler * (100 * 1024 // len(filler) + 1))
        log.write_text(("filler line of an old log" + "." * 54 + "\n") * 1300)
        env = {"SLIP_LOG": "debug", "SLIP_LOG_FILE": str(log)}
        procs[role] = launch(t, role, integ("bulk.py", role, "--port", t.port, "--seed", seed,
                                            "--total", total),
                             slip=True, role=role, env=env,
                             prefix=["prlimit", "--fsize=65536", "--"])
        if role == "server":
            wait_listening(procs[role], t.port)
    statuses = {role: finish(p, 30) for role, p in procs.items()}
    for role, status in statuses.items():
        t.check(status == 0, f"{role} (RLIMIT_FSIZE 64 KiB, stats and log files over it): "
                             f"{status_text(status)}")
    server_said, client_said = last_json(procs["server"]), last_json(procs["client"])
    t.expect_same_stream("client -> server", client_said, server_said)
    t.expect_same_stream("server -> client", server_said, client_said)


# ------------------------------------------------------------------------------ 7

CONTROL_CLIENTS = 4
NPROC_PROBE = r"""
import json, threading
try:
    threading.Thread(target=lambda: None).start()
    print(json.dumps({"thread": "started"}))
except RuntimeError as e:
    print(json.dumps({"thread": "failed", "error": str(e)}))
"""


@case("control_thread")
def control_thread(t, _):
    """A server under slip-run whose control thread cannot start (its uid may run one
    process: RLIMIT_NPROC 1, checked first with a probe) serves 4 root clients under
    slip-run, one after another: every echo must be exact, none reset."""
    world = world_dir(t)
    prefix = ["prlimit", "--nproc=1:1", "--", "setpriv", f"--reuid={NPROC_UID}",
              f"--regid={NPROC_UID}", "--clear-groups"]
    probe = launch(t, "probe", [PYTHON, "-c", NPROC_PROBE], prefix=prefix)
    t.check(finish(probe, 10) == 0, f"probe: {status_text(probe.popen.poll())}: {probe.stderr()}")
    t.check(last_json(probe)["thread"] == "failed",
            f"setup: a thread still starts for uid {NPROC_UID} with RLIMIT_NPROC 1: "
            f"{last_json(probe)}")
    server = launch(t, "server", sec("servers.py", "--impl", "sequential", "--port", t.port,
                                     "--count", CONTROL_CLIENTS),
                    slip=True, role="server", prefix=prefix, stats_dir=world)
    wait_listening(server, t.port)
    client = launch(t, "client", sec("client.py", "--port", t.port, "--connections",
                                     CONTROL_CLIENTS, "--seed", random.randrange(1 << 30)),
                    slip=True)
    client_status = finish(client, 40)
    server_status = finish(server, 5)
    check_client_results(t, client, CONTROL_CLIENTS, client_status)
    t.check(server_status == 0, f"server: {status_text(server_status)}")
    print(f"client: {describe_connections(connections(t, client, t.port, 'remote'))}; "
          f"server: {describe_connections(connections(t, server, t.port, 'local'))}")


PEER_DEATH_DEADLINE_S = 5


@case("bad_proxies")
def bad_proxies(t, _):
    """A raw client registers server A and server B from two different socketpairs (the
    other end of A's pair passed as its own B), publishes a little data into its ring,
    connects, and once the server took the connection (or, declined, after sending the
    same data over plain TCP) dies (SIGKILL). The server, blocked in recv, must see EOF or
    an error within 5 s, having read exactly the bytes sent before. (A server that refuses
    the connection before its application sees it passes too: nothing can hang on it.)
    The v3 listener checks the proxies when it reads the registration and declines it at
    once (bad_region): the exchange is then plain, which is printed."""
    server = launch(t, "server", sec("servers.py", "--impl", "recv_one", "--port", t.port),
                    slip=True, role="server")
    wait_listening(server, t.port)
    size = random.randint(1000, 60000)
    raw = launch(t, "raw", sec("raw_shm.py", "--mode", "bad_proxies", "--port", t.port,
                               "--bytes", size, "--seed", random.randrange(1 << 30)))
    raw_status = finish(raw, 30)
    died = time.monotonic()
    t.check(raw_status == -signal.SIGKILL, f"raw client: {status_text(raw_status)}, expected "
                                           f"its own SIGKILL")
    raw_said = last_json(raw)
    print(f"raw client: {raw_said}")
    if isinstance(raw_said["consumed"], str):
        # The server refused the connection before its application saw it: nothing can
        # hang on it. (The server still waits in accept(): the cleanup ends it.)
        t.check(server.popen.poll() is None and not server.stdout().strip(),
                f"server: {status_text(server.popen.poll())}, output {server.stdout()!r}")
        print("the server dropped the connection with the bad proxies before its "
              "application saw it")
        return
    status = finish(server, PEER_DEATH_DEADLINE_S)
    t.check(status is not None, f"the server still blocks in recv {PEER_DEATH_DEADLINE_S} s "
                                f"after its peer died (the raw client's proxies: A and B of "
                                f"different socketpairs; accelerated: {raw_said['accelerated']})")
    print(f"the server ended {time.monotonic() - died:.2f} s after the peer died")
    t.check(status == 0, f"server: {status_text(status)}")
    said = last_json(server)
    t.check(said["result"] in ("eof", "ECONNRESET"), f"server recv ended with {said['result']}")
    t.check((said["received"], said["received_sha256"]) == (raw_said["sent"],
                                                           raw_said["sent_sha256"]),
            f"the server read {said['received']} B (sha256 {said['received_sha256']}), the "
            f"client sent {raw_said['sent']} B (sha256 {raw_said['sent_sha256']})")


MAX_IDLE_CPU_S = 0.3


@case("stray_token", serial=True)
def stray_token(t, _):
    """After a normal raw handshake (the server took the connection: claim word 1) and data
    the server read (published into the ring before it took the connection, so no token
    was ever counted for it), the raw client writes stray bytes into the server's proxy B
    without publishing anything. A level-triggered epoll server that reads until EAGAIN
    must then stay idle: under 0.3 s of CPU in 2 s."""
    server = launch(t, "server", sec("servers.py", "--impl", "lt_reader", "--port", t.port),
                    slip=True, role="server")
    wait_listening(server, t.port)
    raw = launch(t, "raw", sec("raw_shm.py", "--mode", "stray_token", "--port", t.port,
                               "--bytes", random.randint(100, 50000), "--hold", 10))
    raw.wait_output("STRAY")
    raw_said = last_json(raw)
    t.check(raw_said["accelerated"] and raw_said["consumed"] is True,
            f"precondition: the raw client's handshake and data were not taken on shm: "
            f"{raw_said}")
    time.sleep(0.3)
    pid = server.popen.pid
    before = cpu_seconds(pid)
    time.sleep(2)
    used = cpu_seconds(pid) - before
    print(f"server CPU over 2 s of idleness after the stray bytes: {used:.2f} s")
    raw.kill()
    stop(server)
    t.check(used < MAX_IDLE_CPU_S, f"the server spent {used:.2f} s of CPU in 2 s with nothing "
                                   f"to read (limit {MAX_IDLE_CPU_S} s): it spins on the stray "
                                   "bytes in its proxy")


LOG_FLOOD_MESSAGES = 20000
MAX_LOG_LINES = 200


@case("log_flood", serial=True)
def log_flood(t, _):
    """A user (nobody) sends 20,000 malformed messages to the rendezvous (junk, bad checksum,
    REGISTER with no or two descriptors, truncated), with plain TCP connections in between
    so that the server reads them. With SLIP_LOG=warn the server's log file must stay under
    200 lines."""
    log = t.dir / "server.log"
    server = launch(t, "server", sec("servers.py", "--impl", "closer", "--port", t.port),
                    slip=True, role="server",
                    env={"SLIP_LOG": "warn", "SLIP_LOG_FILE": str(log)})
    wait_listening(server, t.port)
    flood = launch(t, "flood", sec("flood.py", "--mode", "malformed", "--port", t.port,
                                   "--count", LOG_FLOOD_MESSAGES, "--drain-every", 2000),
                   prefix=[*MANY_FDS_LIMIT, *NOBODY])
    t.check(finish(flood, 60) == 0, f"flood: {status_text(flood.popen.poll())}")
    said = last_json(flood)
    t.check(said["sent"] == LOG_FLOOD_MESSAGES, f"flood sent only {said}")
    time.sleep(0.5)
    stop(server)
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    print(f"flood: {said}; server log: {len(lines)} lines; first: {lines[:2]}")
    t.check(len(lines) < MAX_LOG_LINES,
            f"{LOG_FLOOD_MESSAGES} malformed messages made {len(lines)} log lines "
            f"(limit {MAX_LOG_LINES}): {lines[:3]}")


@case("emfile_reason")
def emfile_reason(t, _):
    """A client under slip-run that has used every descriptor but the one its socket takes
    connects to a Slipstream server: the connection must work, byte-exact, and its stats
    must say tcp/fd_limit."""
    server = launch(t, "server", sec("servers.py", "--impl", "sequential", "--port", t.port,
                                     "--count", 1), slip=True, role="server")
    wait_listening(server, t.port)
    client = launch(t, "client", sec("client.py", "--port", t.port, "--fill-fds",
                                     "--seed", random.randrange(1 << 30)),
                    slip=True, prefix=["prlimit", "--nofile=256:256", "--"])
    client_status = finish(client, 20)
    check_client_results(t, client, 1, client_status)
    t.check(finish(server, 10) == 0, f"server: {status_text(server.popen.poll())}")
    conns = connections(t, client, t.port, "remote")
    t.check([(c["transport"], c["reason"]) for c in conns] == [("tcp", "fd_limit")],
            f"client stats: {describe_connections(conns)}, expected tcp/fd_limit")
