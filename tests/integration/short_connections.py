"""Short connections: a client that makes one connection per request and closes first, so
that its own ports fill with TIME_WAIT, must stay accelerated (and as fast as plain TCP
gets there), not collapse: a client that bound a port before each SYN would find its
ports in TIME_WAIT and bind()'s port search crawling (40-80x slower than connect()'s) or
failing. Run in a network namespace of its own whose ephemeral range is 256
ports, so that a few hundred connections reuse every port: bind() would fail there, while
connect() takes a TIME_WAIT 4-tuple again as plain TCP does (tcp_tw_reuse, loopback).

Needs root (ip netns); the harness runs as root in CI and in `make test`.
"""

import collections
import contextlib
import signal
import subprocess
import time
import uuid

from cases import case, connection_stats
from harness import TestFailure, py

CONNECTIONS = 600
PORT_RANGE = "40000 40255"


@contextlib.contextmanager
def small_port_range():
    """A network namespace with its loopback up and 256 ephemeral ports, removed after."""
    ns = f"slipsc-{uuid.uuid4().hex[:6]}"
    try:
        subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True, text=True)
        for cmd in (["ip", "link", "set", "lo", "up"],
                    ["sysctl", "-q", "-w", f"net.ipv4.ip_local_port_range={PORT_RANGE}"]):
            subprocess.run(["ip", "netns", "exec", ns, *cmd], check=True, capture_output=True,
                           text=True)
        yield ns
    except subprocess.CalledProcessError as e:
        raise TestFailure(f"cannot make a network namespace (root needed): {e.stderr.strip()}")
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@case("short_connections", variants=("both", "adaptive"))
def short_connections(t, variant):
    """both: 600 connections one after another through 256 ports, each closed first by the
    client (TIME_WAIT at the client), every byte of both directions checked
    (progs/churn.py): every connection is shm at both ends. adaptive: the default policy
    for connections too short to pay for their setup (short_connections_adaptive)."""
    if variant == "adaptive":
        return short_connections_adaptive(t)
    with small_port_range() as ns:
        server = t.serve("server", py("churn.py", "server", "--port", t.port), slip=True,
                         netns=ns)
        client = t.start("client", py("churn.py", "client", "--port", t.port, "--count",
                                      CONNECTIONS), slip=True, netns=ns)
        client.expect_exit(0, timeout=90)
        server.signal(signal.SIGTERM)
        server.expect_exit(0)
        report = client.json_output()
        print(f"client: {report}")
        t.check(server.json_output()["connections"] == CONNECTIONS,
                "the server served every connection")
        if t.settings.plain:
            return
        for proc, key in ((client, "remote"), (server, "local")):
            said = [s for _, s in connection_stats(t, proc, key)]
            plain = [s for s in said if s != ("shm", "")]
            t.check(len(said) == CONNECTIONS and not plain,
                    f"{proc.name}: {len(said) - len(plain)} of {CONNECTIONS} connections on "
                    f"shm (others: {sorted(set(plain))[:4]})")


ADAPTIVE_CONNECTIONS = 400
DEFAULT_POLICY = {"SLIP_SHORT_CONNS": "adaptive"}


def short_connections_adaptive(t):
    """The default policy for connections too short to pay for their setup
    (core/short_conns.h), both ends under slip-run with SLIP_SHORT_CONNS=adaptive: 400
    connections one after another, each a few bytes, every byte checked
    (progs/churn.py). The first 16 are shm at both ends; then the client keeps them plain
    (reason short_lived at the client, peer_not_slipstream at the server: nothing of ours
    in band), but for every 128th, a probe, shm at both ends; no connection is shm at one
    end only. (Without the policy every one is shm: short_connections.both, and every other
    test, which the harness runs with SLIP_SHORT_CONNS=accelerate.) After a pause of more than a second the next connection is shm again."""
    server = t.serve("server", py("churn.py", "server", "--port", t.port, "--max-payload", 64),
                     slip=True, env=DEFAULT_POLICY)
    client = t.start("client", py("churn.py", "client", "--port", t.port, "--count",
                                  ADAPTIVE_CONNECTIONS, "--max-payload", 64), slip=True,
                     env=DEFAULT_POLICY)
    client.expect_exit(0, timeout=90)
    time.sleep(1.2)  # a pause: the next connection is judged afresh
    again = t.start("again", py("churn.py", "client", "--port", t.port, "--count", 1,
                                "--max-payload", 64), slip=True, env=DEFAULT_POLICY)
    again.expect_exit(0, timeout=30)
    server.signal(signal.SIGTERM)
    server.expect_exit(0)
    t.check(server.json_output()["connections"] == ADAPTIVE_CONNECTIONS + 1,
            "the server served every connection")
    if t.settings.plain:
        return
    at_client = collections.Counter(s for _, s in connection_stats(t, client, "remote"))
    at_server = collections.Counter(s for _, s in connection_stats(t, server, "local"))
    print(f"client ends: {dict(at_client)}; server ends: {dict(at_server)}")
    shm = ("shm", "")
    t.check(sum(at_client.values()) == ADAPTIVE_CONNECTIONS,
            f"the client's stats list {sum(at_client.values())} connections")
    t.check(set(at_client) <= {shm, ("tcp", "short_lived")}, f"client ends: {dict(at_client)}")
    # 16 before the run was complete, then one probe in 128 of the rest. (A connection that
    # a loaded host made last longer than 20 ms starts the run again: a few more.)
    least = 16 + (ADAPTIVE_CONNECTIONS - 16) // 128
    t.check(least <= at_client[shm] <= least + 48,
            f"{at_client[shm]} connections on shm at the client, expected {least} (a few more "
            "on a loaded host)")
    t.check(at_server[shm] == at_client[shm] + 1 and
            at_server[("tcp", "peer_not_slipstream")] == at_client[("tcp", "short_lived")],
            "the server's ends must match the client's (and the connection after the pause "
            "is shm)")
    after_pause = [s for _, s in connection_stats(t, again, "remote")]
    t.check(after_pause == [shm], f"after the pause: {after_pause}")
