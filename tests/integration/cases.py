"""The integration test cases: real programs moving real bytes over loopback TCP.

Each case takes a Test (harness.py) and a variant; CASES maps a case name to its function
and its variants. Most variants are pairings: which side runs under Slipstream
("both", "server" or "client"; see harness.PAIRINGS). Every case checks the content its
programs moved, then the transport each Slipstream process reports.
"""

import collections
import functools
import hashlib
import json
import os
import random
import re
import signal
import subprocess
import time
from pathlib import Path

from harness import ACCEL, LOOPBACK, PAIRINGS, TestFailure, pick_port, port_of, py

MiB = 1 << 20
BULK_BYTES = 32 * MiB  # each way
SOCAT_BYTES = 20 * MiB
ECHO_CONNECTIONS = 4
ECHO_MESSAGES = 150  # per connection
ET_BYTES = 32 * MiB  # well beyond what the socket buffers hold, so sends meet EAGAIN
KILL_DEADLINE_S = 5  # the survivor must see the peer's death by then

CASES = {}


def case(name, variants=tuple(PAIRINGS)):
    def register(function):
        CASES[name] = (function, tuple(variants))
        return function
    return register


def run_bulk(t, server_slip, client_slip, client_env=None, server_args=(), client_args=(),
             server_env=None, before_client=None, server_netns=None, client_netns=None):
    """progs/bulk.py both ways at once. Checks both streams; returns the server, the client,
    and the (sent, received) bytes of each, by program. `before_client()` runs once the
    server listens, before the client starts. `*_netns`: the network namespace of each."""
    server = t.serve("server", py("bulk.py", "server", "--port", t.port, "--seed", 100,
                                  "--total", BULK_BYTES, *server_args), slip=server_slip,
                     env=server_env, netns=server_netns)
    if before_client:
        before_client()
    client = t.start("client", py("bulk.py", "client", "--port", t.port, "--seed", 200,
                                  "--total", BULK_BYTES, *client_args), slip=client_slip,
                     env=client_env, netns=client_netns)
    client.expect_exit(0)
    server.expect_exit(0)
    server_report, client_report = server.json_output(), client.json_output()
    t.expect_same_stream("client -> server", client_report, server_report)
    t.expect_same_stream("server -> client", server_report, client_report)
    traffic = {proc: (report["sent"], report["received"])
               for proc, report in ((server, server_report), (client, client_report))}
    return server, client, traffic


@case("bulk")
def bulk(t, pairing):
    server, client, traffic = run_bulk(t, *PAIRINGS[pairing])
    t.expect_pairing(server, client, traffic=traffic)


def sha256_of(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@case("socat")
def socat(t, pairing):
    server_slip, client_slip = PAIRINGS[pairing]
    source, target = t.dir / "in.bin", t.dir / "out.bin"
    source.write_bytes(random.Random(300).randbytes(SOCAT_BYTES))
    server = t.serve("server", ["socat", "-u", f"TCP-LISTEN:{t.port},reuseaddr",
                                f"OPEN:{target},creat"], slip=server_slip)
    client = t.start("client", ["socat", "-u", f"OPEN:{source}", f"TCP:{LOOPBACK}:{t.port}"],
                     slip=client_slip)
    client.expect_exit(0)
    server.expect_exit(0)
    t.check(sha256_of(source) == sha256_of(target),
            f"received file ({target.stat().st_size} B) differs from the sent one "
            f"({SOCAT_BYTES} B)")
    t.expect_pairing(server, client, traffic={server: (0, SOCAT_BYTES), client: (SOCAT_BYTES, 0)})


@case("iperf3")
def iperf3(t, pairing):
    server_slip, client_slip = PAIRINGS[pairing]
    server = t.serve("server", ["iperf3", "-s", "-1", "-p", t.port, "-J"], slip=server_slip)
    client = t.start("client", ["iperf3", "-c", LOOPBACK, "-p", t.port, "-t", "2", "-l", "64K",
                                "-J"], slip=client_slip)
    client.expect_exit(0)
    server.expect_exit(0)
    server_report, client_report = server.json_document(), client.json_document()
    for proc, result in ((server, server_report), (client, client_report)):
        t.check("error" not in result, f"{proc.name}: iperf3 error {result.get('error')!r}")
    sent = client_report["end"]["sum_sent"]["bytes"]
    received = server_report["end"]["sum_received"]["bytes"]
    # iperf3 counts what the sender wrote and what the receiver read before the test ended;
    # the receiver stops reading at TEST_END, so bytes still in flight are not counted
    # (esnet/iperf#382): plain TCP on loopback misses up to a few MiB. Exact equality is
    # therefore not an iperf3 invariant; what is: nothing beyond what can be in flight.
    t.check(0 < received <= sent <= received + iperf3_in_flight_max(),
            f"client sent {sent} B, server received {received} B: more missing than can be "
            f"in flight ({iperf3_in_flight_max()} B)")
    relayed = client_report["end"]["sum_received"]["bytes"]
    t.check(relayed == received, f"the server's result relayed over the control connection "
                                 f"says {relayed} B received, the server says {received} B")
    t.expect_pairing(server, client, count=2)  # control and data connections


def iperf3_in_flight_max():
    """Bytes that can sit between iperf3's sender and receiver: the largest TCP send and
    receive buffers, plus an allowance for Slipstream's ring and proxy (default ring 1 MiB)."""
    def max_buffer(name):
        return int(Path(f"/proc/sys/net/ipv4/{name}").read_text().split()[2])
    return max_buffer("tcp_wmem") + max_buffer("tcp_rmem") + 8 * MiB


SOCKPERF_SUMMARY = re.compile(r"# dropped messages = (\d+); # duplicated messages = (\d+); "
                              r"# out-of-order messages = (\d+)")


@case("sockperf")
def sockperf(t, pairing):
    server_slip, client_slip = PAIRINGS[pairing]
    address = ["--tcp", "-i", LOOPBACK, "-p", t.port]
    server = t.serve("server", ["sockperf", "server", *address], slip=server_slip)
    # sockperf sizes its per-message tables for --mps messages a second (about 600K by
    # default) and stops with "ERROR: _seqN > m_maxSequenceNo" beyond it; a fast transport
    # can ping-pong faster, so size them for 5M (about 250 MB).
    client = t.start("client", ["sockperf", "ping-pong", *address, "-t", "2", "-m", "64",
                                "--mps", "5000000"], slip=client_slip)
    client.expect_exit(0)
    # sockperf's server runs until signalled. On SIGINT it leaves its loop and exits with
    # status 0 through exit(), so exit handlers run and Slipstream writes its stats line.
    # (SIGTERM's default action would end it without exit handlers, hence no stats.)
    server.signal(signal.SIGINT)
    server.expect_exit(0)
    output = client.stdout() + client.stderr()
    observations = re.search(r"Total (\d+) observations", output)
    t.check(observations and int(observations.group(1)) > 0, "client reports no observations")
    summary = SOCKPERF_SUMMARY.search(output)
    t.check(summary is not None, "client printed no dropped/duplicated/out-of-order summary")
    t.check(summary.groups() == ("0", "0", "0"),
            f"client reports dropped/duplicated/out-of-order = {'/'.join(summary.groups())}")
    for proc in (server, client):
        t.check("ERROR" not in proc.stdout() + proc.stderr(), f"{proc.name} printed an ERROR")
    t.expect_pairing(server, client)


def echo_server(t, impl, connections, slip):
    return t.serve("server", py("echo_server.py", "--impl", impl, "--port", t.port,
                                "--connections", connections), slip=slip)


def run_echo(t, pairing, impl):
    server_slip, client_slip = PAIRINGS[pairing]
    server = echo_server(t, impl, ECHO_CONNECTIONS, server_slip)
    client = t.start("client", py("echo_client.py", "--impl", impl, "--port", t.port,
                                  "--connections", ECHO_CONNECTIONS, "--messages", ECHO_MESSAGES,
                                  "--seed", 400), slip=client_slip)
    client.expect_exit(0)  # the client checks every echoed byte
    server.expect_exit(0)
    echoed, sent = server.json_output()["echoed"], client.json_output()["bytes"]
    t.check(echoed == sent, f"server echoed {echoed} B, client sent {sent} B")
    t.expect_pairing(server, client, count=ECHO_CONNECTIONS,
                     traffic={server: (sent, sent), client: (sent, sent)})


for _impl in ("asyncio", "poll", "select"):
    case(_impl)(functools.partial(run_echo, impl=_impl))


@case("et")
def et_client(t, pairing):
    server_slip, client_slip = PAIRINGS[pairing]
    et_path = t.settings.et_client
    t.check(et_path is not None and et_path.is_file(),
            f"et_client binary not found ({et_path}): pass --et-client")
    server = echo_server(t, "asyncio", 1, server_slip)
    client = t.start("client", [et_path, LOOPBACK, t.port, ET_BYTES, 500], slip=client_slip)
    client.expect_exit(0)  # the client checks every echoed byte and the epoll edges
    server.expect_exit(0)
    echoed = server.json_output()["echoed"]
    t.check(echoed == ET_BYTES, f"server echoed {echoed} B, client sent {ET_BYTES} B")
    both_ways = (ET_BYTES, ET_BYTES)
    t.expect_pairing(server, client, traffic={server: both_ways, client: both_ways})


@case("semantics")
def semantics(t, pairing):
    """progs/semantics.c: scripted checks that the socket behaves like kernel TCP (MSG_PEEK,
    MSG_WAITALL, nonblocking modes, FIONREAD, timeouts, half-close, EPIPE/SIGPIPE, options
    and names, epoll/poll/select, several threads, dup, EINTR/SA_RESTART, urgent data:
    MSG_OOB, SIOCATMARK, SO_OOBINLINE, POLLPRI, SIGURG), with each side in
    turn as the tester. Each program prints PASS/FAIL per sub-test; both must exit 0."""
    server_slip, client_slip = PAIRINGS[pairing]
    path = t.settings.semantics
    if path is None and t.settings.build_dir is not None:
        path = t.settings.build_dir / "tests" / "integration" / "slip_it_semantics"
    t.check(path is not None and path.is_file(),
            f"semantics binary not found ({path}): build it, or pass --semantics")
    server = t.serve("server", [path, "server", t.port], slip=server_slip)
    client = t.start("client", [path, "client", LOOPBACK, t.port], slip=client_slip)
    statuses = {proc: proc.wait() for proc in (client, server)}
    failures = [line for proc in (client, server) for line in proc.stdout().splitlines()
                if line.startswith("FAIL")]
    t.check(not failures, f"{len(failures)} sub-test(s) failed:\n" + "\n".join(failures))
    for proc, status in statuses.items():
        t.check(status == 0, f"{proc.name} exited with status {status}")
        # The program writes nothing to stderr: anything there is Slipstream's (a warning or
        # an error it hit on the way, e.g. a control thread that could not start).
        t.check(not proc.stderr().strip(), f"{proc.name} wrote to stderr: {proc.stderr()[:500]}")
    reports = {proc: proc.json_output() for proc in (server, client)}
    for proc, report in reports.items():
        t.check(report["failed"] == 0 and report["tested"] == report["subtests"] > 0,
                f"{proc.name}: ran {report['tested']} of {report['subtests']} sub-tests, "
                f"{report['failed']} failed")
    connections = reports[client]["connections"]
    t.check(reports[server]["connections"] == connections,
            f"the server accepted {reports[server]['connections']} connections, "
            f"the client opened {connections}")
    t.expect_pairing(server, client, count=connections)


# variant: (server's --do, client's --do, which side is killed). stream.py prints READY on
# the side that receives (or waits), once data flows (or once it is about to block).
KILL_SCENARIOS = {
    "sender_killed": ("recv", "send", "client"),
    "receiver_killed": ("recv", "send", "server"),
    "recv_blocked_client_killed": ("wait", "idle", "client"),
    "recv_blocked_server_killed": ("idle", "wait", "server"),
}
SURVIVOR_RESULTS = {"send": {"EPIPE", "ECONNRESET"}, "recv": {"eof", "ECONNRESET"},
                    "wait": {"eof", "ECONNRESET"}}


@case("kill", KILL_SCENARIOS)
def kill(t, scenario):
    server_do, client_do, victim_role = KILL_SCENARIOS[scenario]
    server = t.serve("server", py("stream.py", "server", "--port", t.port, "--do", server_do),
                     slip=True)
    client = t.start("client", py("stream.py", "client", "--port", t.port, "--do", client_do),
                     slip=True)
    victim, survivor = (client, server) if victim_role == "client" else (server, client)
    survivor_do = server_do if survivor is server else client_do
    (server if server_do in ("recv", "wait") else client).wait_output("READY")
    if survivor_do == "wait":
        time.sleep(0.3)  # let the survivor get into its blocking recv
    victim.kill()
    killed_at = time.monotonic()
    try:
        survivor.expect_exit(0, timeout=KILL_DEADLINE_S)
    except TestFailure as e:
        raise TestFailure(f"{survivor.name} ({survivor_do}) after its peer was killed: {e}")
    result = survivor.json_output()["result"]
    t.check(result in SURVIVOR_RESULTS[survivor_do],
            f"{survivor.name} ({survivor_do}) ended with {result!r}, expected one of "
            f"{sorted(SURVIVOR_RESULTS[survivor_do])}")
    print(f"{survivor.name} saw {result} {time.monotonic() - killed_at:.2f} s after the kill")
    t.expect_stats(survivor, ACCEL, "")  # the victim, killed, writes no stats


# variant: (variable, bad value)
BAD_ENV = {
    "ring_size": ("SLIP_RING_SIZE", "abc"),
    "spin_us": ("SLIP_SPIN_US", "-1"),
    "transports": ("SLIP_TRANSPORTS", "foo"),
    "log": ("SLIP_LOG", "loud"),
}


@case("badenv", BAD_ENV)
def badenv(t, variant):
    variable, value = BAD_ENV[variant]
    server, client, traffic = run_bulk(t, True, True, client_env={variable: value})
    lines = client.stderr().splitlines()
    if client.slip:
        t.check(len(lines) == 1 and variable in lines[0],
                f"client stderr: expected exactly one line naming {variable}, got {lines}")
    else:
        t.check(not lines, f"client stderr: expected nothing in plain mode, got {lines}")
    t.expect_no_stats(client)  # Slipstream disabled in the client: plain TCP, no stats line
    t.expect_stats(server, "tcp", "peer_not_slipstream", traffic=traffic[server])



# variant: (SLIP_TRANSPORTS of both ends, then the server's and the client's transport and
# reason: on loopback on a host without an RDMA device, or (ACCEL "verbs") on the
# Soft-RoCE guest's rxe address, which is this host's too, so either transport can carry)
TRANSPORT_ORDERS = {
    "verbs_first": ("verbs,shm,tcp", (ACCEL, ""), (ACCEL, "")),
    "shm_first": ("shm,verbs,tcp", ("shm", ""), ("shm", "")),
    "verbs_only": ("verbs,tcp", ("tcp", "no_rdma_device"), ("tcp", "no_rdma_path"))
    if ACCEL == "shm" else ("verbs,tcp", ("verbs", ""), ("verbs", "")),
    "tcp_only": ("tcp", ("tcp", "policy"), ("tcp", "policy")),
}


@case("transports", TRANSPORT_ORDERS)
def transports(t, variant):
    """SLIP_TRANSPORTS chooses the transports and their order (core's registry). On
    loopback verbs has no path, so with verbs first shm carries the connection, and without
    shm both ends stay plain for verbs' reasons (the listener could not stand an rdma_cm
    twin up, the client has no RDMA path to loopback); with none, policy. In the guest both
    can carry, and the first in the order does. Both streams exact."""
    order, server_expected, client_expected = TRANSPORT_ORDERS[variant]
    env = {"SLIP_TRANSPORTS": order}
    server, client, traffic = run_bulk(t, True, True, client_env=env, server_env=env)
    t.expect_stats(server, *server_expected, traffic=traffic[server])
    t.expect_stats(client, *client_expected, traffic=traffic[client])


@case("forged", variants=("slip_client", "plain_client"))
def forged(t, variant):
    """A forged registration (wrong nonce) for the exact 4-tuple of the next connection is
    sent to the Slipstream server's rendezvous first. A Slipstream client's own registration
    still wins (the newest of the connection owner's uid: shm, both streams intact); a
    plain client's bytes reach the server untouched (tcp), whatever the forger registered."""
    source_port = pick_source_port(t)

    def forge():
        forger = t.start("forger", py("forge_register.py", "--port", t.port,
                                      "--source-port", source_port))
        forger.expect_exit(0)
        t.check(forger.json_output().get("registered") or t.settings.plain,
                "forger: found no rendezvous to register with")

    server, client, _ = run_bulk(t, True, variant == "slip_client",
                                 client_args=("--source-port", source_port), before_client=forge)
    t.expect_pairing(server, client)


@case("fabric_forged", variants=("run",))
def fabric_forged(t, _):
    """(SLIP_TEST_TRANSPORT=fabric) Hostile datagrams at a live listener's UDP twin
    (progs/fabric_forge.py): garbage, and a REQ whose client is not its sender, get no
    answer; a forged REQ for the exact 4-tuple of the next connection is answered the same
    way twice (REP, or REFUSE where the provider rejects the forger's address). The client
    then connects from that port (it binds it, so it stays plain: "unsupported"); where
    the listener took the forged REQ, the accepted connection is held for it and, with no
    CONFIRM from its client, goes plain ("peer_not_slipstream"); where it refused it (the
    forger's notes are of another form), the server's stats say so ("declined": a request
    for that connection was refused). The forger gained nothing, no byte of its reached
    either program, and both streams are intact."""
    source_port = pick_source_port(t)
    answered = []

    def forge():
        forger = t.start("forger", py("fabric_forge.py", "--port", t.port,
                                      "--source-port", source_port,
                                      "--endpoints", fabric_endpoints()))
        forger.expect_exit(0)
        r = forger.json_output()
        t.check(r["silent"] == r["hostile"],
                f"forger: {r['hostile'] - r['silent']} of {r['hostile']} hostile datagrams "
                f"were answered")
        t.check(r["answers"][0] in (2, 3) and r["answers"][0] == r["answers"][1],
                f"forger: the forged REQ was answered {r['answers']}, expected the same REP "
                f"(2) or REFUSE (3) twice")
        answered.append(r["answers"][0])

    server, client, traffic = run_bulk(t, True, True, client_args=("--source-port", source_port),
                                       before_client=forge)
    t.expect_stats(client, "tcp", "unsupported", traffic=traffic[client])
    t.expect_stats(server, "tcp", "peer_not_slipstream" if answered[0] == 2 else "declined",
                   traffic=traffic[server])


def fabric_endpoints():
    """The endpoints the programs' fabric streams use ("msg" or "rdm"), as the module
    chooses them (fabric/options.h): SLIP_TEST_FABRIC_ENDPOINT where it says, else
    connected ones over the verbs provider."""
    choice = os.environ.get("SLIP_TEST_FABRIC_ENDPOINT", "auto")
    if choice in ("msg", "rdm"):
        return choice
    provider = os.environ.get("SLIP_TEST_FABRIC_PROVIDER", "tcp")
    return "msg" if provider == "verbs" else "rdm"


def provider_connections(pid, test_port):
    """The TCP connections of process `pid` other than the test's (its anchor and listener):
    under fabric over the tcp provider, its endpoints' own (ofi_rxm's with reliable
    datagram endpoints). As (local, peer) address strings."""
    out = subprocess.run(["ss", "-tnpH", "state", "established"], capture_output=True,
                         text=True, check=False).stdout
    found = []
    for line in out.splitlines():
        fields = line.split()
        if f"pid={pid}," not in line or len(fields) < 4:
            continue
        local, peer = fields[2], fields[3]
        if port_of(local) != test_port and port_of(peer) != test_port:
            found.append((local, peer))
    return found


@case("fabric_failover", variants=("run",))
def fabric_failover(t, _):
    """(SLIP_TEST_TRANSPORT=fabric, tcp provider) The provider's own TCP connections between
    the two processes are killed mid-transfer (ss -K, a real fault: the writes through the
    connection's endpoint, or ofi_rxm's, fail);
    both ends fail over to their anchor and the streams go on over TCP from where both
    stand: 384 MiB each way with content checked, transport tcp, reason failover, on both
    sides. Over ofi_rxm too, which connects again for writes posted after the cut: a note
    goes only once its bytes were delivered, so none claims bytes lost with the old
    connection (before, a receiver read bytes never sent in 18 of 40 such runs, and the
    sender then reset)."""
    t.check(os.geteuid() == 0, "needs root (ss -K)")
    total = 384 * MiB  # a few seconds: the cut must come before the end even under load
    logs = {name: t.dir / f"{name}.log" for name in ("server", "client")}
    env = {name: {"SLIP_LOG": "info", "SLIP_LOG_FILE": str(log)} for name, log in logs.items()}
    server = t.serve("server", py("bulk.py", "server", "--port", t.port, "--seed", 100,
                                  "--total", total), slip=True, env=env["server"])
    client = t.start("client", py("bulk.py", "client", "--port", t.port, "--seed", 200,
                                  "--total", total), slip=True, env=env["client"])
    deadline = time.monotonic() + 10
    links = []
    while not links and time.monotonic() < deadline and client.popen.poll() is None:
        links = provider_connections(client.popen.pid, t.port)
        time.sleep(0.02)
    t.check(links, "no provider connection of the client's appeared (not over tcp;ofi_rxm?)")
    # The provider connects at the first write, and may connect again from the other side:
    # every connection of the client's but the test's goes, a few times over, and again
    # until a side has seen it (under load the stream's bytes may start flowing only after
    # the first cuts, over a connection made again: the cut then broke nothing).
    def seen():
        return any(said in log.read_text(errors="replace")
                   for log in logs.values() if log.exists()
                   for said in ("continues on TCP", "resetting"))

    cut = set()
    rounds = 0
    while (rounds < 5 or not seen()) and rounds < 200 and client.popen.poll() is None:
        rounds += 1
        time.sleep(0.05)
        for local, peer in provider_connections(client.popen.pid, t.port):
            (lhost, lport), (phost, pport) = (a.rsplit(":", 1) for a in (local, peer))
            subprocess.run(["ss", "-K", "src", lhost.strip("[]"), "sport", "=", f":{lport}",
                            "dst", phost.strip("[]"), "dport", "=", f":{pport}"],
                           capture_output=True, check=False)
            cut.add((local, peer))
    print(f"cut the provider's connections {sorted(cut)} in {rounds} rounds")
    t.check(client.popen.poll() != 0 and server.popen.poll() != 0,
            "the transfer ended before the provider's connection was cut (too fast)")
    statuses = (client.wait(), server.wait())
    t.check(statuses == (0, 0), f"a side failed (exit statuses {statuses})")
    server_report, client_report = server.json_output(), client.json_output()
    t.expect_same_stream("client -> server", client_report, server_report)
    t.expect_same_stream("server -> client", server_report, client_report)
    for proc, report in ((server, server_report), (client, client_report)):
        t.expect_stats(proc, "tcp", "failover", traffic=(report["sent"], report["received"]))


@case("fabric_forged_notes", variants=("run",))
def fabric_forged_notes(t, _):
    """(SLIP_TEST_TRANSPORT=fabric, tcp provider) Another host on the fabric forges notes
    for a live connection (progs/note_forger.c): it asks the listener for a connection of
    its own (so that it is a peer of the listener's endpoint, with a registration key of
    the listener's), then writes data notes, in both forms, naming the tags just below its
    own, with a cursor 4 KiB past what the live connection's client sent. With connected
    endpoints it first tries to connect one for the live connection (refused: the nonce
    is not its: refused at once), then writes through its own. The server of the
    live connection, paused mid-stream, must receive exactly what its client sent: notes
    that do not come from a connection's peer are dropped."""
    release = t.dir / "release"
    forger_path = t.settings.build_dir / "tests" / "integration" / "slip_it_note_forger"
    server = t.serve("server", py("pause_pair.py", "server", "--port", t.port,
                                  "--release", release), slip=True)
    client = t.start("client", py("pause_pair.py", "client", "--port", t.port,
                                  "--release", release), slip=True)
    client.wait_output("READY")
    time.sleep(0.2)  # the server has read the head, and waits for more
    provider = os.environ.get("SLIP_TEST_FABRIC_PROVIDER", "tcp")
    endpoints = fabric_endpoints()
    forger = t.start("forger", [forger_path, provider.split(";")[0] if endpoints == "msg"
                                else provider, t.port, pick_source_port(t), 7 + 4096, endpoints])
    forger.expect_exit(0)
    r = forger.json_output()
    t.check(r.get("rep") and r.get("notes", 0) > 0,
            f"forger: could not forge notes at the listener: {r}")
    if endpoints == "msg":
        t.check(r.get("hijack") == "refused",
                f"forger: the listener took an endpoint for another connection: {r}")
        # (Refused, not left unanswered: a request nobody rejects holds the provider's
        # socket, and its client waits out its own timeout, 2 s here.)
        t.check(r.get("hijack_ms", -1) < 1000,
                f"forger: the refusal of its endpoint took {r.get('hijack_ms')} ms")
    time.sleep(0.3)  # (notes that were believed would show as bytes now)
    release.touch()
    client.expect_exit(0)
    server.expect_exit(0)
    sent, received = client.json_output()["sent"], server.json_output()["received"]
    t.check(received == sent, f"the server received {bytes.fromhex(received)[:64]!r} "
                              f"({len(received) // 2} B), its client sent "
                              f"{bytes.fromhex(sent)!r}")
    t.expect_stats(client, ACCEL, "")
    t.expect_stats(server, ACCEL, "")


@case("fabric_bogus_key", variants=("run",))
def fabric_bogus_key(t, _):
    """(SLIP_TEST_TRANSPORT=fabric, reliable datagrams: shm, or tcp with
    SLIP_TEST_FABRIC_ENDPOINT=rdm) A peer on the fabric names a ring key that is none of its
    registrations (progs/note_forger.c hold: its REQ names a made-up key; this test then
    makes the TCP connection with the CONFIRM of its nonce), and the server's application
    sends that connection 64 KiB. 1.17's shm completes a write larger than its inject size
    only once the receiver answered, and never answers one whose key it refuses: one such
    write left every later completion of the writer behind it, for good (after 1024 more,
    its large writes were refused for ever: a hang). The tcp provider's receiver drops its
    connection to the writer instead, so the forger's own stream may fail over (its TCP
    connection then carries a FAILOVER), and only that one. Either way the server's next
    client must then get its 96 MiB (thousands of send()s of random sizes up to 128 KiB)
    intact, on the fabric, within 5 s. (Elsewhere it fails rather than pass untried.)"""
    import socket
    import struct
    import sys
    sys.path.insert(0, str(Path(__file__).parent / "progs"))
    from forge_register import MAGIC
    from orphan_confirm import confirm_message
    provider = os.environ.get("SLIP_TEST_FABRIC_PROVIDER")
    over_shm = provider == "shm"
    t.check(over_shm or (provider == "tcp" and
                         os.environ.get("SLIP_TEST_FABRIC_ENDPOINT") == "rdm"),
            "fabric_bogus_key runs over shm, or tcp with SLIP_TEST_FABRIC_ENDPOINT=rdm")
    total = 96 << 20
    server = t.serve("server", py("greet.py", "server", "--port", t.port,
                                  "--totals", f"{64 << 10},{total}"), slip=True)
    source_port = pick_source_port(t)
    forger_path = t.settings.build_dir / "tests" / "integration" / "slip_it_note_forger"
    forger = t.start("forger", [forger_path, provider, t.port, source_port, 0, "rdm", "hold"])
    forger.wait_until(lambda: '"nonce"' in forger.stdout(), "the forger's REP")
    answer = json.loads(forger.stdout().splitlines()[0])
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((LOOPBACK, source_port))
    sock.connect((LOOPBACK, t.port))
    sock.sendall(confirm_message(answer["nonce"], answer["ring"]))
    time.sleep(1)  # the server writes its 64 KiB into the forger's "ring" meanwhile
    sock.setblocking(False)
    try:
        carried = sock.recv(1 << 16)  # (on the fabric, nothing comes here)
    except BlockingIOError:
        carried = b""
    sock.close()
    forger.expect_exit(0)
    client = t.start("client", py("greet.py", "client", "--port", t.port), slip=True)
    client.expect_exit(0)
    server.expect_exit(0)
    sent = server.json_output()
    got = client.json_output()
    failover = (len(carried) >= 16 and carried[:4] == MAGIC and carried[5] == 6 and
                struct.unpack("<I", carried[8:12])[0] == len(carried))
    t.check(carried == b"" or (failover and not over_shm),
            f"the forger's TCP connection carried {len(carried)} B: the server did not take "
            "its CONFIRM" + ("" if over_shm else ", nor fail it over"))
    t.check(got["received"] == total and got["received_sha256"] == sent["sent_sha256"][1],
            f"the client got {got['received']} B (sha256 {got['received_sha256'][:16]}), the "
            f"server sent {total} B (sha256 {sent['sent_sha256'][1][:16]})")
    t.check(sent["seconds"][1] < 5, f"the client's connection took {sent['seconds'][1]} s")
    said = [line for line in server.stderr().splitlines()
            if line.strip() and not (failover and "the connection continues on TCP" in line)]
    t.check(not said, f"the server said: {said[:5]}")
    t.expect_stats(client, ACCEL, "")
    # (A failover the forger never answered did not move its stream: still the fabric's.)
    t.expect_stats(server, ACCEL, "", count=2)


@case("fabric_refused", variants=("run",))
def fabric_refused(t, _):
    """(SLIP_TEST_TRANSPORT=fabric) The listener refuses the client's request (the client's
    ring is larger than the server's: SLIP_RING_SIZE 256K against 64K): the connection is
    plain TCP, both streams exact, and both ends say why in their stats: "declined" (the
    server said "peer_not_slipstream" before, as if no request had come)."""
    server, client, traffic = run_bulk(t, True, True, client_env={"SLIP_RING_SIZE": "256K"},
                                       server_env={"SLIP_RING_SIZE": "64K"})
    t.expect_stats(client, "tcp", "declined", traffic=traffic[client])
    t.expect_stats(server, "tcp", "declined", traffic=traffic[server])


@case("fabric_hidden_fds", variants=("run",))
def fabric_hidden_fds(t, _):
    """(SLIP_TEST_TRANSPORT=fabric) Four fabric connections, echoed (SHA-256 checked), held
    open by both sides (progs/hidden_fds.py): every descriptor that appeared below the
    hidden-descriptor floor meanwhile is one of the program's own sockets. libfabric's
    (its endpoints' sockets, its completion queues' socket pairs and epoll sets, the
    client's first load of the provider) are the shim's, above the floor (before: four of
    libfabric's below it per connection, at the numbers the application's next accept()
    or open() would get)."""
    server = t.serve("server", py("hidden_fds.py", "server", "--port", t.port, "--count", 4),
                     slip=True)
    client = t.start("client", py("hidden_fds.py", "client", "--port", t.port, "--count", 4,
                                  "--seed", random.randrange(1 << 30)), slip=True)
    client.expect_exit(0)
    server.expect_exit(0)
    for proc in (server, client):
        said = proc.json_output()
        t.check(said["exact"], f"{proc.name}: the echo came back different")
        theirs = {int(fd): link for fd, link in said["new"].items()
                  if int(fd) not in said["own"]}
        t.check(not theirs, f"{proc.name}: descriptors below the floor ({said['floor']}) that "
                            f"are not the program's: {theirs}")
    t.expect_stats(client, ACCEL, "", count=4)
    t.expect_stats(server, ACCEL, "", count=4)


@case("fabric_fork_exec", variants=("run",))
def fabric_fork_exec(t, _):
    """(SLIP_TEST_TRANSPORT=fabric, shm) A client process's child forks and execs a program
    (as a subprocess does) while the client holds a fabric connection (progs/
    fork_exec_client.py). An exec removes the exec'ing image's shm region file (nothing of
    ours runs at its exit), but a fork child's endpoint is its parent's: the client's file
    must still be there after the child's exec (new peers find the client by it), and the
    connection goes on, echoed bytes checked."""
    t.check(os.environ.get("SLIP_TEST_FABRIC_PROVIDER") == "shm",
            "fabric_fork_exec runs over shm (SLIP_TEST_FABRIC_PROVIDER=shm)")
    server = t.serve("server", py("echo_server.py", "--port", t.port, "--connections", 1,
                                  "--impl", "poll"), slip=True)
    client = t.start("client", py("fork_exec_client.py", "--port", t.port), slip=True)
    client.expect_exit(0)
    server.expect_exit(0)
    r = client.json_output()
    t.check(r["before"], f"the client has no shm region file of its own: {r}")
    t.check(r["after"] == r["before"],
            f"the client's region files before its child's exec {r['before']}, after {r['after']}")
    t.expect_stats(client, ACCEL, "")
    t.expect_stats(server, ACCEL, "")


@case("fabric_many_peers", variants=("run",))
def fabric_many_peers(t, _):
    """(SLIP_TEST_TRANSPORT=fabric, shm) A server whose clients are more processes over its
    life than the provider takes peers: 1.17's shm refuses a 257th insert into an address
    vector (entries are never removed while there is room). 256 client processes, one
    echo connection each (content checked), then, once they have been gone for the 10 s
    after which a peer may make room, 8 more: every one of the 264 connections is on the
    fabric (before: the 257th and later were plain)."""
    t.check(os.environ.get("SLIP_TEST_FABRIC_PROVIDER") == "shm",
            "fabric_many_peers runs over shm (SLIP_TEST_FABRIC_PROVIDER=shm)")
    first, later = 256, 8
    server = t.serve("server", py("echo_server.py", "--port", t.port, "--connections",
                                  first + later, "--impl", "poll"), slip=True)

    def clients(start, count, parallel):
        running = []
        for i in range(start, start + count):
            running.append(t.start(f"client{i}", py("echo_client.py", "--port", t.port,
                                                    "--connections", 1, "--messages", 2,
                                                    "--seed", i, "--impl", "poll"), slip=True))
            if len(running) >= parallel:
                running.pop(0).expect_exit(0)
        for client in running:
            client.expect_exit(0)

    clients(0, first, 4)
    time.sleep(10.5)
    clients(first, later, 1)
    server.expect_exit(0)
    t.expect_stats(server, ACCEL, "", count=first + later)


@case("orphan_confirm", variants=("run",))
def orphan_confirm(t, _):
    """A client's first bytes are a valid CONFIRM with nothing registered for it at the
    accepting process: what a Slipstream client sends when another process sharing the
    listener took its registration, or it expired (progs/bulk.py --orphan-confirm plays
    that client, plainly). The Slipstream server takes the CONFIRM off the connection and
    answers DECLINE, and the connection goes on as plain TCP: the client sends its stream
    from byte 0 and the server's application gets it exactly, without the CONFIRM (checked
    both ways, seeded random). Before, such a client was reset. (The server accepts 2 s
    after listening, so that the CONFIRM is there at accept: a CONFIRM that arrives later
    cannot be told from a plain client's bytes without delaying them.)"""
    if t.settings.plain:
        print("plain mode: no Slipstream server to decline the CONFIRM; nothing to run")
        return
    server, client, _ = run_bulk(t, True, False, server_env={"IT_ACCEPT_DELAY_S": "2"},
                                 client_args=("--orphan-confirm",))
    t.check(client.json_output().get("declined"), "the client got no DECLINE for its CONFIRM")
    t.expect_stats(server, "tcp", "declined")


LATE_ACCEPT_S = 3  # past the 2 s a client once waited for its listener's answer


@case("late_accept")
def late_accept(t, pairing):
    """The server accepts 3 s after the client connected and wrote (a full backlog, a busy
    server). A Slipstream client's registration is taken only when its connection is
    accepted: until then its bytes wait in its ring and it keeps waiting (its connection
    is still in the listener's queue, so nobody can have taken it plain); then the server
    claims it and both ends carry it on shm. Both streams exact. (What a client held up
    between its handshake and a CONFIRM once broke, docs/COMPATIBILITY.md, has no window
    left: nothing of ours goes in band.)"""
    server, client, traffic = run_bulk(t, *PAIRINGS[pairing],
                                       server_env={"IT_ACCEPT_DELAY_S": str(LATE_ACCEPT_S)})
    t.expect_pairing(server, client, traffic=traffic)


def pick_source_port(t):
    """A free port for the client to bind, different from the test port."""
    while True:
        port = pick_port()
        if port != t.port:
            return port


IDLE_CONNECTIONS = 1000
IDLE_BYTES_PER_CONNECTION = 64 * 1024  # both processes together; a ring is 1 MiB


@case("idle", variants=("both",))
def idle(t, _):
    """1,000 idle accelerated connections between two processes stay within the documented
    bound (two rings each) and in fact touch only a few pages each; closing them releases
    every region and descriptor."""
    args = ("--port", t.port, "--count", IDLE_CONNECTIONS)
    server = t.serve("server", py("many.py", "server", *args), slip=True)
    client = t.start("client", py("many.py", "client", *args), slip=True)
    client.expect_exit(0)
    server.expect_exit(0)
    reports = [json.loads(line) for line in server.stdout().strip().splitlines()]
    server_idle, server_closed = reports[-2], reports[-1]
    client_idle = client.json_output()
    touched = server_idle["region_bytes"] + client_idle["region_bytes"]
    if not t.settings.plain:
        ring = 1 << 20
        t.check(touched <= IDLE_CONNECTIONS * 2 * ring,
                f"{touched} bytes for {IDLE_CONNECTIONS} connections exceed two rings each")
        t.check(touched <= IDLE_CONNECTIONS * IDLE_BYTES_PER_CONNECTION,
                f"idle connections touched {touched // IDLE_CONNECTIONS} bytes each")
    t.check(server_closed["region_bytes"] == 0,
            f"server still maps {server_closed['region_bytes']} bytes of regions after close")
    t.check(server_closed["fds"] < 32,
            f"server holds {server_closed['fds']} descriptors after every connection closed")
    print(f"idle: {touched // IDLE_CONNECTIONS} bytes per connection (both processes), "
          f"server fds idle {server_idle['fds']}, after close {server_closed['fds']}")
    t.expect_pairing(server, client, count=IDLE_CONNECTIONS)


# --- slip-stat and slip-run (tools/) ----------------------------------------------------------
# Self-contained: everything below is used by these cases only.

import os  # noqa: E402
import subprocess  # noqa: E402

from harness import PYTHON, is_listening, port_of  # noqa: E402

TOOL_TIMEOUT_S = 15  # a tool run that should take milliseconds
# Where the library's variables are listed: core's, then each transport's.
OPTION_TABLES = [Path(__file__).resolve().parents[2] / path
                 for path in ("core/config.cc", "verbs/options.cc", "fabric/options.cc")]

# One end of a connection that stays up until SIGTERM. SIGTERM ends it through a normal exit,
# so Slipstream's exit handlers run: its stats line is written and its /dev/shm file removed.
# Each side sends "hello", reads the peer's, then prints READY.
HOLD_PY = r"""
import signal, socket, sys
role, port = sys.argv[1], int(sys.argv[2])
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
if role == "server":
    with socket.create_server(("127.0.0.1", port)) as listener:
        sock, _ = listener.accept()
else:
    sock = socket.create_connection(("127.0.0.1", port))
sock.sendall(b"hello")
got = b""
while len(got) < 5:
    data = sock.recv(5 - len(got))
    if not data:
        sys.exit("EOF before the peer's hello")
    got += data
print("READY", flush=True)
signal.pause()
"""
HELLO_BYTES = 5


def hold(role, port):
    return [PYTHON, "-c", HOLD_PY, role, str(port)]


def tool_path(t, name):
    t.check(t.settings.build_dir is not None, "no build directory: pass --build-dir")
    path = t.settings.build_dir / "bin" / name
    t.check(path.is_file(), f"{path} not built")
    return path


def tool_env():
    """The environment without SLIP_* variables: a tool gets the ones a test passes."""
    return {k: v for k, v in os.environ.items() if not k.startswith("SLIP_")}


def run_tool(t, name, *args, expect=0):
    """Runs build/bin/NAME ARGS; checks its exit status."""
    argv = [str(tool_path(t, name)), *map(str, args)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S,
                            env=tool_env(), stdin=subprocess.DEVNULL)
    t.check(result.returncode == expect,
            f"{' '.join(argv[1:]) or '(no arguments)'}: {name} exited with status "
            f"{result.returncode}, expected {expect}\nstdout:\n{result.stdout[-2000:]}\n"
            f"stderr:\n{result.stderr[-2000:]}")
    return result


def parse_json(t, text, what):
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise TestFailure(f"{what} is not JSON ({e}): {text[:500]!r}")


def slip_stat_json(t, *args):
    listing = parse_json(t, run_tool(t, "slip-stat", "--json", *args).stdout, "slip-stat --json")
    t.check(isinstance(listing.get("connections"), list),
            f"slip-stat --json: no connections array in {listing}")
    return listing


def expect_usage_error(t, name, *args):
    result = run_tool(t, name, *args, expect=2)
    t.check("usage:" in result.stderr and not result.stdout,
            f"{name} {' '.join(args)}: expected a usage message on stderr only, got "
            f"stdout {result.stdout[:300]!r}, stderr {result.stderr[:300]!r}")


def wait_listening(proc, port):
    proc.wait_until(lambda: is_listening(port), f"a listener on port {port}")


def other_port(t):
    while (port := pick_port()) == t.port:
        pass
    return port


def stop(*procs):
    for proc in procs:
        proc.signal(signal.SIGTERM)
    for proc in procs:
        proc.expect_exit(0)


def slipstat_live(t):
    """While the connections are up, slip-stat --json lists an accelerated pair (both ends
    under slip-run) as "shm" in both processes, and the connection of a Slipstream client to
    a plain server as "tcp"/"peer_not_slipstream", with their bytes; the table, --reasons
    and -p agree. Once the programs exit, their /dev/shm files are gone, and their exit
    records say what slip-stat saw."""
    plain_port = other_port(t)
    server = t.serve("server", hold("server", t.port), slip=True)
    client = t.start("client", hold("client", t.port), slip=True)
    plain_server = t.start("plain_server", hold("server", plain_port), role="server")
    wait_listening(plain_server, plain_port)
    slip_client = t.start("slip_client", hold("client", plain_port), slip=True)
    procs = (server, client, plain_server, slip_client)
    for proc in procs:
        proc.wait_output("READY")
    # Under slip-run without --summary, the program is slip-run's own process (exec).
    pids = {proc: proc.popen.pid for proc in procs}
    by_pid = ",".join(str(pid) for pid in pids.values())
    listed = slip_stat_json(t, "-p", by_pid)["connections"]
    t.check(all(c.get("pid") in pids.values() for c in listed),
            f"slip-stat -p {by_pid} listed other processes: {listed}")
    everything = slip_stat_json(t)["connections"]
    t.check(all(c in everything for c in listed) or t.settings.plain,
            "slip-stat without -p lacks connections that -p shows")
    if t.settings.plain:
        t.check(not listed, f"plain mode: slip-stat lists {listed}")
        stop(*procs)
        return

    def ours(proc, key, port):
        found = [c for c in listed if c["pid"] == pids[proc] and port_of(c[key]) == port]
        t.check(len(found) == 1, f"{proc.name} (pid {pids[proc]}): expected one connection "
                                 f"with {key} port {port}, slip-stat lists {listed}")
        return found[0]

    expected = [(server, "local", t.port, "shm", ""), (client, "remote", t.port, "shm", ""),
                (slip_client, "remote", plain_port, "tcp", "peer_not_slipstream")]
    for proc, key, port, transport, reason in expected:
        c = ours(proc, key, port)
        seen = (c["transport"], c["reason"], c["state"], c["bytes_sent"], c["bytes_received"])
        t.check(seen == (transport, reason, "open", HELLO_BYTES, HELLO_BYTES),
                f"{proc.name}: slip-stat shows transport/reason/state/sent/received {seen}, "
                f"expected {(transport, reason, 'open', HELLO_BYTES, HELLO_BYTES)}")
    t.check(not [c for c in listed if c["pid"] == pids[plain_server]],
            "slip-stat lists the plain server")

    table = run_tool(t, "slip-stat", "-p", by_pid).stdout.splitlines()
    for proc, _, _, transport, reason in expected:
        rows = [row.split() for row in table if row.split()[:1] == [str(pids[proc])]]
        t.check(len(rows) == 1 and transport in rows[0] and "open" in rows[0] and
                rows[0][-1] == (reason or "-"),
                f"{proc.name}: table rows {rows}, expected one {transport} {reason or '-'}")
    reasons = run_tool(t, "slip-stat", "--reasons", "-p", pids[slip_client]).stdout
    t.check(re.search(r"^peer_not_slipstream +1$", reasons, re.M) is not None,
            f"slip-stat --reasons does not count 1 peer_not_slipstream:\n{reasons}")

    stop(slip_client, client, server, plain_server)
    for proc in (server, client, slip_client):
        shm_file = Path(f"/dev/shm/slipstream-stats.{pids[proc]}")
        t.check(not shm_file.exists(), f"{proc.name}: {shm_file} outlives its process")
    t.check(not slip_stat_json(t, "-a", "-p", by_pid)["connections"],
            "slip-stat still lists the programs after they exited")
    hello = (HELLO_BYTES, HELLO_BYTES)
    t.expect_stats(server, "shm", "", traffic=hello)
    t.expect_stats(client, "shm", "", traffic=hello)
    records = slip_client.stats_records()
    t.check(len(records) == 1 and len(records[0]["connections"]) == 1 and
            records[0]["connections"][0]["reason"] == "peer_not_slipstream",
            f"slip_client: exit records {records}")


def slipstat_args(t):
    """Bad arguments give the usage on stderr and status 2; --help gives it on stdout and 0;
    --json and --json -w (one JSON line per refresh, until SIGINT) parse."""
    for args in (["--bogus"], ["-x"], ["extra"], ["-p"], ["-p", "abc"], ["-w", "0"],
                 ["--all=1"], ["--json", "--reasons"]):
        expect_usage_error(t, "slip-stat", *args)
    help_text = run_tool(t, "slip-stat", "--help").stdout
    for word in ("usage:", "--json", "--reasons", "--watch", "--pid", "--all", "--clean",
                 "peer_not_slipstream"):
        t.check(word in help_text, f"slip-stat --help does not mention {word}")
    slip_stat_json(t, "-a")
    run_tool(t, "slip-stat", "--reasons")
    watch = subprocess.Popen([str(tool_path(t, "slip-stat")), "--json", "-w", "0.1"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=tool_env())
    try:
        time.sleep(0.5)
        watch.send_signal(signal.SIGINT)
        out, err = watch.communicate(timeout=TOOL_TIMEOUT_S)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
    t.check(watch.returncode == 0, f"slip-stat -w exited with {watch.returncode} on SIGINT: "
                                   f"{err[-500:]}")
    lines = out.splitlines()
    t.check(len(lines) >= 2, f"slip-stat --json -w 0.1 printed {len(lines)} lines in 0.5 s")
    for n, line in enumerate(lines, 1):
        parse_json(t, line, f"slip-stat --json -w line {n}")


SLIPSTAT_TESTS = {"live": slipstat_live, "args": slipstat_args}


@case("slipstat", SLIPSTAT_TESTS)
def slipstat(t, variant):
    SLIPSTAT_TESTS[variant](t)


def sliprun_args(t):
    """Bad arguments give the usage on stderr and status 2; --help documents every variable
    the library reads (core/config.cc, verbs/options.cc, fabric/options.cc) with its default, and no other;
    options reach CMD as those variables; without --summary slip-run execs CMD (same pid) and
    passes its status."""
    for args in (["--bogus", "--", "true"], [], ["--"], ["--ring-size"], ["--summary=1", "true"],
                 ["-x", "true"]):
        expect_usage_error(t, "slip-run", *args)
    help_text = run_tool(t, "slip-run", "--help").stdout
    known = set()
    for table in OPTION_TABLES:
        found = set(re.findall(r'\{"(SLIP_[A-Z_]+)"', table.read_text()))
        t.check(len(found) >= 2, f"found only {sorted(found)} in {table}")
        known |= found
    mentioned = set(re.findall(r"\bSLIP_[A-Z_]+", help_text))
    t.check(mentioned == known, f"slip-run --help names {sorted(mentioned)}; the library "
                                f"reads {sorted(known)}")
    for name in known:
        t.check(re.search(rf"\b{name}, default \S+", help_text),
                f"slip-run --help gives no default for {name}")
    for word in ("usage:", "--summary", "--help"):
        t.check(word in help_text, f"slip-run --help does not mention {word}")

    env = run_tool(t, "slip-run", "--ring-size", "64K", "--log=info", "--exclude-ports=1-2",
                   "--", "env")
    for line in ("SLIP_RING_SIZE=64K", "SLIP_LOG=info", "SLIP_EXCLUDE_PORTS=1-2"):
        t.check(line in env.stdout.splitlines(), f"CMD's environment lacks {line}")
    t.check("libslipstream.so" in env.stdout, "CMD's LD_PRELOAD lacks libslipstream.so")
    t.check(not env.stderr, f"valid options made the library complain: {env.stderr}")

    # Under exec the shell is the very process that was started.
    shell = subprocess.Popen([str(tool_path(t, "slip-run")), "sh", "-c", "echo $$"],
                             stdout=subprocess.PIPE, text=True, env=tool_env())
    out, _ = shell.communicate(timeout=TOOL_TIMEOUT_S)
    t.check(shell.returncode == 0 and out.strip() == str(shell.pid),
            f"slip-run without --summary: CMD ran as pid {out.strip()}, slip-run was "
            f"{shell.pid} (expected exec)")
    run_tool(t, "slip-run", "sh", "-c", "exit 3", expect=3)
    run_tool(t, "slip-run", "--", "/nonexistent/program", expect=127)


SUMMARY_BYTES = 4 * MiB
# Exits with status 7 on SIGTERM: slip-run --summary must pass SIGTERM on and CMD's status back.
TERM_PY = r"""
import signal, sys
signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))
print("READY", flush=True)
signal.pause()
"""


def sliprun_summary(t):
    """slip-run --summary runs CMD as its child and, once it exits, prints on stderr what its
    processes accelerated: for a bulk pair both under slip-run, one shm connection each with
    the bytes moved. It works with a stats file of its own (removed after) and with the
    user's (--stats, whose record stays), passes SIGTERM on to CMD and CMD's exit status
    back (128+N for a signal), and 127 for a command that cannot run."""
    if t.settings.plain:
        print("plain mode: slip-run --summary is what this test checks; nothing to run")
        return
    slip_run = str(tool_path(t, "slip-run"))
    user_stats = t.dir / "client.jsonl"
    bulk = ("--total", SUMMARY_BYTES, "--port", t.port)
    server = t.serve("server", [slip_run, "--summary", "--",
                                *py("bulk.py", "server", "--seed", 100, *bulk)],
                     env={"TMPDIR": str(t.dir)})
    client = t.start("client", [slip_run, "--summary", f"--stats={user_stats}", "--",
                                *py("bulk.py", "client", "--seed", 200, *bulk)])
    client.expect_exit(0)
    server.expect_exit(0)
    server_report, client_report = server.json_output(), client.json_output()
    t.expect_same_stream("client -> server", client_report, server_report)
    t.expect_same_stream("server -> client", server_report, client_report)
    moved = "4.0 MiB sent, 4.0 MiB received"
    for proc in (server, client):
        stderr = proc.stderr()
        t.check(f"slip-run: summary: 1 process, 1 connection: 1 shm; {moved}" in stderr and
                re.search(rf"slip-run: summary:   pid \d+ python3\S*: 1 connection: 1 shm; "
                          rf"{moved}", stderr),
                f"{proc.name}: no summary of one shm connection moving {moved} on stderr:\n"
                f"{stderr}")
    t.check(not list(t.dir.glob("slip-run-summary.*")),
            "slip-run left its temporary stats file behind")
    records = [parse_json(t, line, "stats line") for line in user_stats.read_text().splitlines()]
    t.check(len(records) == 1 and [c["transport"] for c in records[0]["connections"]] == ["shm"],
            f"--stats with --summary: records {records}")

    run_tool(t, "slip-run", "--summary", "sh", "-c", "exit 3", expect=3)
    killed = run_tool(t, "slip-run", "--summary", "sh", "-c", "kill -TERM $$", expect=143)
    t.check("no process opened a TCP connection" in killed.stderr,
            f"summary without connections: {killed.stderr!r}")
    run_tool(t, "slip-run", "--summary", "/nonexistent/program", expect=127)
    term = t.start("term", [slip_run, "--summary", "--", PYTHON, "-c", TERM_PY])
    term.wait_output("READY")
    os.kill(term.popen.pid, signal.SIGTERM)  # slip-run alone, not its process group
    term.expect_exit(7)


SLIPRUN_TESTS = {"args": sliprun_args, "summary": sliprun_summary}


@case("sliprun", SLIPRUN_TESTS)
def sliprun(t, variant):
    SLIPRUN_TESTS[variant](t)


# (server bind address, client destination): what gRPC and Gloo do is the "mapped" row,
# an AF_INET6 socket connecting to a v4-mapped loopback address.
IPV6_ADDRESSES = {
    "v6": ("::", "::1"),
    "mapped": ("::", "::ffff:127.0.0.1"),
    "v4_to_dual_stack": ("::", "127.0.0.1"),
    "v6_to_v6": ("::1", "::1"),
}


@case("ipv6", variants=tuple(IPV6_ADDRESSES))
def ipv6(t, variant):
    """Bulk transfer over IPv6, v4-mapped and dual-stack listeners, both under Slipstream."""
    bind, host = IPV6_ADDRESSES[variant]
    server, client, traffic = run_bulk(t, True, True, server_args=("--bind", bind),
                                       client_args=("--host", host))
    t.expect_pairing(server, client, traffic=traffic)


# --- slip-perf, the measuring tool: its command line, its output formats, a short compare.

import csv as _csv  # noqa: E402  (this block is self-contained)
import io as _io  # noqa: E402
import subprocess as _subprocess  # noqa: E402
import xml.etree.ElementTree as _xml  # noqa: E402

PERF_RUN = ("--sizes", "64,4K", "--duration", "0.05", "--repeat", "2")
PERF_SOCKET_TESTS = ("tcp_lat", "tcp_bw", "tcp_rr", "tcp_crr")
PERF_NATIVE_TESTS = ("shm_lat", "shm_bw", "shm_rr")
PERF_SIZES = (64, 4096)
# Each bad command line must end with status 2 and the usage on stderr.
PERF_BAD_ARGS = (
    (),
    ("bogus",),
    ("client",),
    ("client", "127.0.0.1"),
    ("client", "127.0.0.1", "tcp_nope"),
    ("client", "127.0.0.1", "tcp_lat", "--bogus"),
    ("client", "127.0.0.1", "tcp_lat", "--size", "0"),
    ("client", "127.0.0.1", "tcp_lat", "--size", "65M"),
    ("client", "127.0.0.1", "tcp_lat", "--sizes", "4M:1"),
    ("client", "127.0.0.1", "tcp_lat", "--duration", "1", "--iters", "5"),
    ("client", "127.0.0.1", "tcp_lat", "--duration", "-1"),
    ("client", "127.0.0.1", "tcp_bw", "--streams", "0"),
    ("client", "127.0.0.1", "tcp_lat", "--format", "xml"),
    ("client", "127.0.0.1", "tcp_lat", "--port"),
    ("server", "--port", "70000"),
    ("server", "--once", "--count", "2"),
    ("server", "extra"),
    ("native",),
    ("native", "shm_crr"),
    ("native", "tcp_lat"),
    ("native", "shm_lat", "--cpus", "1"),
    ("compare", "--tests", "lat,nope"),
    ("compare", "--transports", "tcp,ib"),
    ("compare", "--remote", "example.org", "--transports", "tcp,shm-native"),
    ("compare", "--repeat", "0"),
    ("memcpy", "--size", "x"),
)


def slip_perf_path(t):
    t.check(t.settings.build_dir is not None, "no build directory: pass --build-dir")
    path = t.settings.build_dir / "bin" / "slip-perf"
    t.check(path.is_file(), f"{path} not built")
    return path


def perf_number(t, row, column, where):
    """A numeric cell of a slip-perf CSV row (or JSON result), as a float."""
    value = row.get(column)
    t.check(value not in (None, ""), f"{where}: no {column}")
    try:
        return float(value)
    except ValueError:
        raise TestFailure(f"{where}: {column}={value!r} is not a number") from None


def check_perf_rows(t, rows, tests, where):
    """One row per test and size; every figure is there and consistent; repeats are 2."""
    seen = sorted((row["test"], int(row["size"])) for row in rows)
    expected = sorted((test, size) for test in tests for size in PERF_SIZES)
    t.check(seen == expected, f"{where}: rows for {seen}, expected {expected}")
    for row in rows:
        at = f"{where} {row['test']} {row['size']}"
        kind = row["test"].split("_", 1)[1]
        figure = {"lat": "p50_us", "bw": "gbit_s", "rr": "trans_s", "crr": "trans_s"}[kind]
        t.check(row["metric"] == figure, f"{at}: main figure {row['metric']!r}, expected {figure}")
        low, median, high = (perf_number(t, row, c, at) for c in ("min", "median", "max"))
        t.check(0 < low <= median <= high, f"{at}: min {low}, median {median}, max {high}")
        t.check(perf_number(t, row, "repeats", at) == 2, f"{at}: repeats {row['repeats']}, not 2")
        t.check(perf_number(t, row, "iters", at) > 0, f"{at}: no iterations")
        t.check(perf_number(t, row, figure, at) > 0, f"{at}: {figure} is not positive")
        for side in ("cpu_client", "cpu_server"):
            t.check(perf_number(t, row, side, at) >= 0, f"{at}: negative {side}")
        if kind != "bw":
            for column in ("mean_us", "p50_us", "p99_us", "p999_us"):
                perf_number(t, row, column, at)


def parse_perf_output(t, proc, output_format):
    """The rows of a slip-perf client or native run, from CSV or JSON; both must parse."""
    text = proc.stdout()
    if output_format == "csv":
        rows = list(_csv.DictReader(_io.StringIO(text)))
        t.check(rows, f"{proc.name}: no CSV rows in {text[:300]!r}")
        return rows
    try:
        document = json.loads(text)
    except json.JSONDecodeError as e:
        raise TestFailure(f"{proc.name}: stdout is not one JSON document ({e})")
    return [{k: ("" if v is None else str(v)) for k, v in result.items()}
            for result in document["results"]]


@case("perf_args", variants=("usage",))
def perf_args(t, _):
    """Bad command lines end with status 2 and the usage on stderr; --help with status 0 and
    the usage on stdout."""
    perf = slip_perf_path(t)
    for args in PERF_BAD_ARGS:
        done = _subprocess.run([str(perf), *args], capture_output=True, text=True, timeout=10)
        t.check(done.returncode == 2 and "usage:" in done.stderr and not done.stdout,
                f"slip-perf {' '.join(args)}: status {done.returncode}, expected 2 with the "
                f"usage on stderr; stderr {done.stderr[:200]!r}, stdout {done.stdout[:200]!r}")
    for args in (("--help",), ("client", "--help"), ("compare", "-h")):
        done = _subprocess.run([str(perf), *args], capture_output=True, text=True, timeout=10)
        t.check(done.returncode == 0 and done.stdout.startswith("usage:"),
                f"slip-perf {' '.join(args)}: status {done.returncode}, expected 0 with the "
                f"usage on stdout")


@case("perf_formats", variants=("tcp", "shm", "shm_reuseport"))
def perf_formats(t, variant):
    """Every socket test against a slip-perf server, at two sizes with two repeats, in CSV
    and in JSON: both parse and hold every figure. Under slip-run ("shm") every connection,
    control and data, must have used shm; shm_reuseport: the same against a server whose
    listener has SO_REUSEPORT (`--reuseport`, gRPC's default)."""
    perf = slip_perf_path(t)
    slip = variant != "tcp"
    extra = ["--reuseport"] if variant == "shm_reuseport" else []
    server = t.serve("server", [perf, "server", "--bind", LOOPBACK, "-p", t.port, "--count", 2,
                                *extra], slip=slip)
    clients = []
    for output_format in ("csv", "json"):
        client = t.start(f"client_{output_format}",
                         [perf, "client", LOOPBACK, "-p", t.port, *PERF_SOCKET_TESTS, *PERF_RUN,
                          "--conns", 2, "--streams", 2, "--format", output_format,
                          "--label", variant], slip=slip)
        client.expect_exit(0)
        rows = parse_perf_output(t, client, output_format)
        check_perf_rows(t, rows, PERF_SOCKET_TESTS, client.name)
        clients.append(client)
    server.expect_exit(0)
    for proc in (server, *clients):
        if not proc.slip:
            t.expect_no_stats(proc)
            continue
        records = proc.stats_records()
        t.check(len(records) == 1, f"{proc.name}: {len(records)} stats lines, expected 1")
        connections = records[0].get("connections", [])
        t.check(connections, f"{proc.name}: no connections in its stats")
        t.check(records[0].get("dropped") == 0, f"{proc.name}: stats dropped records")
        others = [c for c in connections if c.get("transport") != "shm"]
        t.check(not others, f"{proc.name}: connections not on shm: {others[:3]}")


@case("perf_native", variants=("csv", "json"))
def perf_native(t, output_format):
    """The native shm tests (a forked pair on the library's rings) in both formats."""
    perf = slip_perf_path(t)
    native = t.start("native", [perf, "native", *PERF_NATIVE_TESTS, *PERF_RUN, "--conns", 2,
                                "--format", output_format])
    native.expect_exit(0)
    check_perf_rows(t, parse_perf_output(t, native, output_format), PERF_NATIVE_TESTS,
                    native.name)


@case("perf_compare", variants=("short",))
def perf_compare(t, _):
    """A short `slip-perf compare`: two sizes, two runs each, plain, under slip-run and
    native. It must exit 0 (every connection under slip-run used shm), and its CSV, JSON
    and SVG must parse, with one row per transport, test and size."""
    perf = slip_perf_path(t)
    out = t.dir / "compare"
    transports = ["tcp", "shm-native"] if t.settings.plain else ["tcp", "shm", "shm-native"]
    started = time.monotonic()
    compare = t.start("compare", [perf, "compare", "--tests", "lat,bw", "--sizes", "64,64K",
                                  "--duration", "0.05", "--repeat", 2, "--out", out,
                                  "--transports", ",".join(transports)])
    compare.expect_exit(0)
    elapsed = time.monotonic() - started
    t.check(elapsed < 60, f"compare took {elapsed:.0f} s")
    with open(out / "compare.csv", newline="") as f:
        rows = list(_csv.DictReader(f))
    keys = sorted((row["transport"], row["test"], int(row["size"])) for row in rows)
    expected = sorted((tr, test, size) for tr in transports for test in ("lat", "bw")
                      for size in (64, 65536))
    t.check(keys == expected, f"compare.csv rows {keys}, expected {expected}")
    for row in rows:
        at = f"compare.csv {row['transport']} {row['test']} {row['size']}"
        low, median, high = (perf_number(t, row, c, at) for c in ("min", "median", "max"))
        t.check(0 < low <= median <= high, f"{at}: min {low}, median {median}, max {high}")
    document = json.loads((out / "compare.json").read_text())
    t.check(len(document["results"]) == len(rows),
            f"compare.json has {len(document['results'])} results, compare.csv {len(rows)} rows")
    t.check(not document["warnings"], f"compare.json warnings: {document['warnings']}")
    svg = _xml.parse(out / "compare.svg").getroot()
    t.check(svg.tag.endswith("svg"), f"compare.svg root is {svg.tag}")
    lines = svg.findall(".//{http://www.w3.org/2000/svg}polyline")
    t.check(len(lines) == 2 * len(transports),
            f"compare.svg has {len(lines)} lines, expected one per transport in each panel")
    table = compare.stdout()
    for title in ("lat: one-way latency", "bw: bandwidth"):
        t.check(title in table, f"the printed comparison has no table {title!r}")
    print(f"compare ran in {elapsed:.1f} s")


FORK_CLIENTS = 3


@case("forking")
def forking(t, pairing):
    """Python's socketserver.ForkingTCPServer: the parent accepts and closes its copy, a
    forked child serves. Content checked per connection; both ends report shm when both run
    Slipstream (the parent's record lists the connections it accepted and handed over)."""
    server_slip, client_slip = PAIRINGS[pairing]
    args = ("--port", t.port, "--count", FORK_CLIENTS)
    server = t.serve("server", py("forking.py", "server", *args), slip=server_slip)
    client = t.start("client", py("forking.py", "client", *args), slip=client_slip)
    client.expect_exit(0)
    server.expect_exit(0)
    t.check(len(client.json_output()["digests"]) == FORK_CLIENTS, "client: missing digests")
    t.expect_pairing(server, client, count=FORK_CLIENTS)


SENDFILE_BYTES = 24 * MiB + 12345  # not a multiple of any chunk size


@case("sendfile")
def sendfile(t, pairing):
    """sendfile(2) from a file into the socket (os.sendfile), checked by SHA-256: with
    offsets, and non-blocking from the file's own position through a full socket (a call
    that sent nothing used to move the position on by its chunk)."""
    server_slip, client_slip = PAIRINGS[pairing]
    path = t.dir / "payload.bin"
    path.write_bytes(random.Random(5).randbytes(SENDFILE_BYTES))
    server = t.serve("server", py("sendfile_pair.py", "server", "--port", t.port, "--path", path),
                     slip=server_slip)
    client = t.start("client", py("sendfile_pair.py", "client", "--port", t.port),
                     slip=client_slip)
    client.expect_exit(0)
    server.expect_exit(0)
    sent, received = server.json_output(), client.json_output()
    t.check(sent["sent"] == SENDFILE_BYTES and received["received"] == SENDFILE_BYTES,
            f"sent {sent['sent']}, received {received['received']}, file {SENDFILE_BYTES}")
    t.check(sent["sha256"] == received["sha256"], "the bytes received differ from the file")
    t.expect_pairing(server, client)


# --- socket corners: progs/corners.py -----------------------------------------


def run_corners(t, pairing, mode, *extra, client_extra=()):
    """progs/corners.py MODE on both sides; returns the server, the client and their
    reports, after checking that both exited 0."""
    server_slip, client_slip = PAIRINGS[pairing]
    args = (mode, "--port", t.port, *extra)
    server = t.serve("server", py("corners.py", "server", *args), slip=server_slip)
    client = t.start("client", py("corners.py", "client", *args, *client_extra),
                     slip=client_slip)
    client.expect_exit(0)
    server.expect_exit(0)
    return server, client, server.json_output(), client.json_output()


@case("fork_own")
def fork_own(t, pairing):
    """fork after the connections exist, on both sides: the parent and the child each keep
    using only the connection they own (the other copy closed at once), every round checked
    by SHA-256, and each connection ends only when its owner closes it."""
    server, client, server_report, client_report = run_corners(t, pairing, "fork_own")
    t.check(server_report["parent_bytes"] == client_report["parent_bytes"] > 0,
            f"the parents moved {server_report['parent_bytes']} and "
            f"{client_report['parent_bytes']} B on their connection")
    t.expect_pairing(server, client, count=2)


@case("fork_writers")
def fork_writers(t, pairing):
    """fork with a connection, and both processes send on it at once (4 MiB each, random
    call sizes): the server gets every byte of each writer, in order (SHA-256 of each
    writer's bytes, told apart by their high bit), as over TCP; the connection ends when
    both have closed it."""
    server, client, server_report, client_report = run_corners(t, pairing, "fork_writers")
    for who in ("child", "parent"):
        t.check(server_report[f"{who}_sha"] == client_report[f"{who}_sha"],
                f"the {who}'s bytes arrived changed ({server_report[f'{who}_bytes']} B)")
    # (Over the rings they did write at once: one after the other would prove nothing.
    # Kernel TCP's larger buffers often take one writer's 4 MiB before the other starts.)
    print(f"the writers took turns {server_report['switches']} times")
    if pairing == "both" and not t.settings.plain:
        t.check(server_report["switches"] > 2,
                f"the writers took turns only {server_report['switches']} times")
    t.expect_pairing(server, client)


FORK_EXEC_SLEEP_S = 1.5
# The peer's EOF and the holder's reaping of its sleeper are read on two clocks of two busy
# processes; without the inheritance the EOF comes about FORK_EXEC_SLEEP_S early.
FORK_EXEC_SLACK_S = 0.3


@case("fork_exec")
def fork_exec(t, pairing):
    """A spawned /bin/sleep inherits one connection (not close-on-exec) and ignores it; the
    parent keeps using both connections, then closes the inherited one: the peer sees EOF
    only once the sleeper, the last holder, has exited (as with TCP), not at the close."""
    server, client, server_report, client_report = run_corners(
        t, pairing, "fork_exec", "--sleep", FORK_EXEC_SLEEP_S)
    for holder, peer in ((client_report, server_report), (server_report, client_report)):
        early = holder["sleeper_exit"] - peer["peer_eof"]
        t.check(early <= FORK_EXEC_SLACK_S,
                f"the {peer['role']} saw EOF {early:.3f} s before the {holder['role']}'s "
                f"sleeper (which still held the connection) exited, "
                f"{peer['peer_eof'] - holder['closed']:.3f} s after the {holder['role']} "
                f"closed its copy")
        late = peer["peer_eof"] - holder["sleeper_exit"]
        t.check(late < 2, f"the {peer['role']} saw EOF {late:.3f} s after the last holder exited")
    t.expect_pairing(server, client, count=2)


@case("exec", variants=("both",))
def exec_handback(t, _):
    """The server execs itself with an accelerated connection inherited (not close-on-exec),
    after a failed exec of a missing program: the connection goes back to TCP at the byte
    the old program had read, and the new program continues both streams (seeded random,
    up to 6 MiB each way, every byte checked on both sides). The client, which never
    noticed, ends up on TCP with reason failover; the server logged the hand-back, and left
    nothing in /dev/shm."""
    env = {"SLIP_LOG": "info"}
    seed = random.randrange(1 << 30)
    print(f"exec: seed {seed}")
    args = ("exec", "--port", t.port, "--seed", seed)
    server = t.serve("server", py("corners.py", "server", *args), slip=True, env=env)
    client = t.start("client", py("corners.py", "client", *args), slip=True, env=env)
    client.expect_exit(0)
    server.expect_exit(0)
    said = server.json_output()
    print(f"exec: handed back at {said['exec_at_received']} B received, "
          f"{said['exec_at_sent']} B sent")
    t.check("handed back to TCP for exec" in server.stderr(),
            "the server's log does not say it handed the connection back")
    t.check("handed the connection back to TCP (exec)" in client.stderr(),
            "the client's log does not say its peer handed the connection back")
    t.expect_stats(client, "tcp", "failover")
    # Nothing of the exec'd image is left in /dev/shm (a fabric shm endpoint's region file
    # outlived every exec before: nothing of ours ran at the old image's exit).
    left = sorted(Path("/dev/shm").glob(f"slip-{server.popen.pid}-*"))
    t.check(not left, f"the server left {[p.name for p in left]} in /dev/shm")


@case("exec_shared", variants=("both",))
def exec_shared(t, _):
    """The server forks and the child execs itself with the connection inherited while the
    parent keeps its copy: the exec'd program's descriptor reports a reset (not the
    stream's bytes, not a hang), and the parent serves the whole connection on shm, both
    streams checked byte for byte."""
    args = ("exec_shared", "--port", t.port, "--seed", random.randrange(1 << 30))
    server = t.serve("server", py("corners.py", "server", *args), slip=True)
    client = t.start("client", py("corners.py", "client", *args), slip=True)
    client.expect_exit(0)
    server.expect_exit(0)
    t.check("another process also holds" in server.stderr(),
            "the exec'd child's log does not say another process holds the connection")
    t.expect_pairing(server, client)


@case("vfork_stdin", variants=("run", "fork"))
def vfork_stdin(t, variant):
    """subprocess.Popen(..., stdin=accelerated socket): Python's vfork child dup2s the
    socket onto its stdin through the shim; the parent's own fd 0 and the socket's bytes
    must stay as they were (the child shares the parent's memory, not its descriptors).
    fork: a forked child execs holding the connection beside its parent, which keeps it
    (its bytes arrive once, both ends stay accelerated)."""
    extra = ("--fork",) if variant == "fork" else ()
    prog = t.start("prog", py("vfork_stdin.py", "--port", t.port, *extra), slip=True)
    prog.expect_exit(0)
    said = prog.json_output()
    t.check(said.get("stdin") == "from-the-pipe", f"the parent's stdin: {said}")
    if prog.slip:  # both ends of the connection are this process's, both accelerated
        records = prog.stats_records()
        conns = records[0]["connections"] if len(records) == 1 else []
        t.check(len(conns) == 2 and all(c["transport"] == ACCEL for c in conns),
                f"expected both ends {ACCEL}: {records}")


BANNER_CONNECTIONS = 20
BANNER_MAX_MEDIAN_MS = 50


@case("banner")
def banner(t, pairing):
    """The server speaks first (a banner right after accept, before reading): the client
    gets it with no added delay (median connect-to-banner under 50 ms over 20 connections;
    plain loopback TCP takes well under 1 ms), whichever side runs Slipstream."""
    server, client, _, report = run_corners(t, pairing, "banner", "--count",
                                            BANNER_CONNECTIONS)
    print(f"banner: median {report['median_ms']:.2f} ms, max {report['max_ms']:.2f} ms")
    t.check(report["median_ms"] < BANNER_MAX_MEDIAN_MS,
            f"connect-to-banner median {report['median_ms']:.1f} ms (max "
            f"{report['max_ms']:.1f} ms), expected under {BANNER_MAX_MEDIAN_MS} ms")
    t.expect_pairing(server, client, count=BANNER_CONNECTIONS)


@case("reuseaddr")
def reuseaddr(t, pairing):
    """The server closes first, so its end of the connection waits in TIME_WAIT, and listens
    again on the same port: bind() fails with EADDRINUSE without SO_REUSEADDR and succeeds
    with it; the second connection is accelerated like the first."""
    server, client, report, _ = run_corners(t, pairing, "reuseaddr")
    t.check(report["refused_without_reuseaddr"] == 98,  # EADDRINUSE
            f"bind without SO_REUSEADDR next to a TIME_WAIT connection: "
            f"{report['refused_without_reuseaddr']!r}, expected errno 98 (EADDRINUSE)")
    t.check(report["second_bytes"] > 0, "nothing moved on the second connection")
    t.expect_pairing(server, client, count=2)


@case("v6only")
def v6only(t, pairing):
    """IPV6_V6ONLY on an [::] listener: it reads back 1 (also on the accepted socket), an IPv4
    connection to the port is refused, and once an IPv4 listener shares the port each family
    reaches its own listener."""
    server, client, server_report, client_report = run_corners(t, pairing, "v6only")
    t.check(server_report["v6only"] == 1 and server_report["accepted_v6only"] == 1,
            f"IPV6_V6ONLY reads {server_report['v6only']} on the listener, "
            f"{server_report['accepted_v6only']} on the accepted socket")
    t.check(client_report["v4_refused_by_v6only"], "an IPv6-only listener accepted IPv4")
    t.check(client_report["served_by"] == ["v6", "v4", "v6"],
            f"connections to ::1, 127.0.0.1, ::1 were served by {client_report['served_by']}")
    t.expect_pairing(server, client, count=3)


# ------------------------------------------------------------------------------ shared ports

REUSEPORT_CONNECTIONS = 160


def listener_count(port, pid=None):
    """Listening sockets on `port` (in the network namespace of process `pid`, if given)."""
    from harness import _tcp_table  # noqa: E402  (the kernel's table, as serve() reads it)
    return sum(1 for p, state in _tcp_table(pid) if p == port and state == "0A")


def connection_stats(t, proc, key):
    """[(peer port, (transport, reason))] of `proc`'s connections on the test port, over all
    its processes' records (forked workers write one each)."""
    found = []
    for record in proc.stats_records():
        t.check(record.get("dropped") == 0, f"{proc.name}: dropped {record.get('dropped')}")
        for c in record.get("connections", []):
            mine, other = (c["local"], c["remote"]) if key == "local" else (c["remote"],
                                                                            c["local"])
            if port_of(mine) == t.port:
                found.append((port_of(other), (c["transport"], c["reason"])))
    return found


@case("reuseport", variants=("group", "mixed", "shared"))
def reuseport(t, variant):
    """Servers sharing a port, under a storm of 160 connections (8 at a time, random sizes
    both ways, every byte checked: progs/reuseport.py). group: four SO_REUSEPORT members,
    all under Slipstream: every connection is shm at both ends (the client registers with
    the member the kernel will hand its SYN to), spread over the members. mixed: three
    members under Slipstream and one plain: every connection is exact; those the plain
    member accepted are plain at the client (no rendezvous for that member: no delay, not
    a byte of ours), the others shm at both ends. shared: one listener without SO_REUSEPORT,
    two forked workers accepting on it (the registration may reach the other worker): every
    connection is exact, and each is shm at both ends or plain at both ends
    (accepted_elsewhere at the client), never a hang; a registration read by the worker
    that did not accept its connection is passed on to the one that did, so all but a
    few are accelerated (147-152 of 160 before they were passed on)."""
    if t.settings.plain:
        print("plain mode: nothing shared to check beyond the streams")
    members = {"group": ["a", "b", "c", "d"], "mixed": ["a", "b", "c", "plain"],
               "shared": ["w"]}[variant]
    servers = []
    for name in members:
        args = ["--port", t.port, "--member", name]
        if variant == "shared":
            args += ["--workers", 2]
        servers.append(t.start(f"server-{name}", py("reuseport.py", "server", *args),
                               role="server", slip=name != "plain"))
        servers[-1].wait_until(lambda n=len(servers): listener_count(t.port) >= n,
                               f"{len(servers)} listener(s) on port {t.port}")
    client = t.start("client", py("reuseport.py", "client", "--port", t.port, "--count",
                                  REUSEPORT_CONNECTIONS, "--parallel", 8), slip=True)
    client.expect_exit(0, timeout=120)
    for server in servers:
        server.signal(signal.SIGTERM)
    for server in servers:
        server.expect_exit(0)
    accepted = [(int(port), member) for port, member in client.json_output()["accepted"]]
    t.check(len(accepted) == REUSEPORT_CONNECTIONS,
            f"{len(accepted)} of {REUSEPORT_CONNECTIONS} connections answered")
    spread = collections.Counter(member for _, member in accepted)
    print(f"connections per member: {dict(spread)}")
    if t.settings.plain:
        return
    at_client = connection_stats(t, client, "remote")
    at_servers = []
    for server in servers:
        if server.slip:
            at_servers += connection_stats(t, server, "local")
    client_ends = collections.Counter(said for _, said in at_client)
    server_ends = collections.Counter(said for _, said in at_servers)
    print(f"client ends: {dict(client_ends)}; server ends: {dict(server_ends)}")
    t.check(len(at_client) == len(accepted),
            f"the client's stats list {len(at_client)} connections, it made {len(accepted)}")
    shm = (ACCEL, "")
    elsewhere = ("tcp", "accepted_elsewhere")
    plain_member = spread.get("plain", 0)
    # A client whose 4-tuple is still in TIME_WAIT from an earlier connection (the server
    # closed first) cannot ask the kernel which member its SYN will reach, and registers
    # with the member found from nowhere: when that is another one, the connection goes
    # plain at both ends (accepted_elsewhere at the client). A few per storm, never a byte.
    mispredicted = client_ends.get(elsewhere, 0)
    server_plain = sum(n for said, n in server_ends.items() if said != shm)
    t.check(server_ends.get(shm, 0) == client_ends.get(shm, 0),
            "the servers' shm ends must be the client's shm ends")
    if variant == "group":
        t.check(set(client_ends) <= {shm, elsewhere} and server_plain == mispredicted,
                "every connection is shm at both ends, or plain at both for a registration "
                "made with another member")
        t.check(mispredicted <= len(accepted) // 20,
                f"{mispredicted} registrations reached another member than the SYN")
    elif variant == "mixed":
        t.check(set(client_ends) <= {shm, elsewhere, ("tcp", "peer_not_slipstream")},
                f"client ends: {dict(client_ends)}")
        # The plain member's connections are plain at the client (no rendezvous for it, or
        # registered with another member); the Slipstream members' are shm, but for those
        # registered elsewhere (plain at both ends).
        t.check(client_ends.get(("tcp", "peer_not_slipstream"), 0) + mispredicted ==
                plain_member + server_plain,
                f"the client must be plain for exactly the plain member's {plain_member} "
                f"connections and those registered with another member")
        t.check(client_ends.get(("tcp", "peer_not_slipstream"), 0) <= plain_member,
                "connections the Slipstream members accepted found no rendezvous")
        t.check(mispredicted <= len(accepted) // 20,
                f"{mispredicted} registrations reached another member than the SYN")
        # Where a client port was used once, the very connections must match too.
        once = {p for p, n in collections.Counter(p for p, _ in accepted).items() if n == 1}
        said_once = {p: said for p, said in at_client if p in once}
        wrong = [(p, m, said_once.get(p)) for p, m in accepted
                 if p in said_once and m == "plain" and said_once[p] == shm]
        t.check(not wrong, f"connections the plain member accepted on shm: {wrong[:6]}")
    else:
        t.check(set(client_ends) <= {shm, elsewhere},
                f"client ends other than shm or tcp/accepted_elsewhere: {dict(client_ends)}")
        t.check(sum(server_ends.values()) == len(accepted) and server_plain == mispredicted,
                "the workers' ends must match the client's, one end per connection")
        # Registrations are read in accept() by the worker that accepts; one that reads its
        # sibling's (both accepting at once) passes it on through their queue. What may
        # still go plain: a search cut short by its bounds under a burst.
        t.check(client_ends.get(shm, 0) >= len(accepted) - len(accepted) // 32,
                f"only {client_ends.get(shm, 0)} of {len(accepted)} connections on shm")
    print(f"{client_ends.get(shm, 0)} of {len(accepted)} connections on shm")
    if variant != "shared":
        t.check(len(spread) == len(members),
                f"the connections reached only {sorted(spread)}: the test is moot")
