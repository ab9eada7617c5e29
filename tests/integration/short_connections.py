"""Short connections: a client that makes one connection per request and closes first, so
that its own ports fill with TIME_WAIT, must stay accelerated (and as fast as plain TCP
gets there), not collapse: before issue 16's fix the client bound a port before each SYN,
and once the ports sat in TIME_WAIT bind()'s port search crawled (40-80x slower than
connect()'s) or failed. Run in a network namespace of its own whose ephemeral range is 256
ports, so that a few hundred connections reuse every port: bind() would fail there, while
connect() takes a TIME_WAIT 4-tuple again as plain TCP does (tcp_tw_reuse, loopback).

Needs root (ip netns); the harness runs as root in CI and in `make test`.
"""

import contextlib
import signal
import subprocess
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


@case("short_connections", variants=("both",))
def short_connections(t, variant):
    """600 connections one after another through 256 ports, each closed first by the client
    (TIME_WAIT at the client), every byte of both directions checked (progs/churn.py):
    every connection is shm at both ends."""
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
