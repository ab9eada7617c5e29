"""Pods: two network namespaces of one host joined by a veth pair, as a pod network joins
pods, both seeing one rendezvous directory (SLIP_RENDEZVOUS_DIR, a hostPath volume in
Kubernetes). The server runs in one namespace, the client in the other, connecting to the
server's address on the veth. Every case checks every byte (progs/bulk.py: SHA-256 of 32 MiB
each way; progs/reuseport.py: SHA-256 of each connection's payload and a seeded reply).

Needs root (ip netns); the harness runs as root in CI and in `make test`.
"""

import collections
import signal
import tempfile
from pathlib import Path

from cases import case, connection_stats, listener_count, run_bulk
from harness import PYTHON, py
from netns import SERVER_ADDRESS, SERVER_ADDRESS6, two_pods

STORM_CONNECTIONS = 60
# A name in the directory held by another uid than the client's or the directory owner's.
SQUATTER = """
import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.bind(sys.argv[1])
s.listen(16)
print("bound", flush=True)
time.sleep(120)
"""


def rendezvous_dir():
    """A fresh directory, trusted: root's, mode 0755, under /tmp (root's and sticky)."""
    path = Path(tempfile.mkdtemp(prefix="slip-rdv-", dir="/tmp"))
    path.chmod(0o755)
    return path


def pod_env(directory, transports="shm,tcp"):
    env = {"SLIP_TRANSPORTS": transports}
    if directory:
        env["SLIP_RENDEZVOUS_DIR"] = str(directory)
    return env


def names_in(directory):
    return sorted(p.name for p in directory.iterdir())


PODS_VARIANTS = ("both", "ipv6", "plain_server", "plain_client", "no_dir", "untrusted",
                 "group", "shared")


@case("pods", variants=PODS_VARIANTS)
def pods(t, variant):
    """both: shm between the namespaces at both ends, the server's name gone from the
    directory after it exits. ipv6: the same to the server's IPv6 address, the server on a
    dual-stack wildcard (a name for each of its addresses, link-local ones excepted). plain_server / plain_client: one end plain: plain TCP, the
    client finding no name (not_same_host). no_dir: both under Slipstream, no directory:
    plain (not_same_host). untrusted: the name is held by a process of another uid than the
    client's and the directory owner's: the client never registers there (plain,
    untrusted_rendezvous) and the squatter received nothing. group: two SO_REUSEPORT
    members, one name: the kernel's pick among the members is asked in the server's
    namespace, so each connection is shm at both ends (the member holding the name) or
    plain at both (declined), 60 connections, none waiting. shared: one listener, two forked
    workers: the name is withdrawn once they share it, every connection plain and exact."""
    directory = rendezvous_dir()
    with two_pods() as (server_ns, client_ns):
        if variant in ("group", "shared"):
            return storm(t, variant, directory, server_ns, client_ns)
        server_dir = None if variant == "no_dir" else directory
        server_slip = variant not in ("plain_server", "untrusted")
        client_slip = variant != "plain_client"
        squatter = None
        name = f"slip3-{SERVER_ADDRESS}-{t.port}"
        if variant == "untrusted":
            directory.chmod(0o1777)  # anybody may create names; the owner (root) is trusted
            squatter = t.start("squatter", ["runuser", "-u", "nobody", "--", PYTHON, "-c",
                                            SQUATTER, str(directory / name)])
            squatter.wait_output("bound")

        expected = [name]
        bind, host = "0.0.0.0", SERVER_ADDRESS
        if variant == "ipv6":
            bind, host = "::", SERVER_ADDRESS6
            expected = sorted([name, f"slip3-{SERVER_ADDRESS6}-{t.port}"])

        def published():
            if server_slip and server_dir:
                t.check(names_in(directory) == expected,
                        f"the directory holds {names_in(directory)}, expected {expected}")

        server, client, traffic = run_bulk(
            t, server_slip, client_slip, server_env=pod_env(server_dir),
            client_env=pod_env(server_dir), server_args=("--bind", bind),
            client_args=("--host", host), before_client=published,
            server_netns=server_ns, client_netns=client_ns)
        if variant in ("both", "ipv6"):
            t.expect_stats(server, "shm", "", traffic=traffic[server])
            t.expect_stats(client, "shm", "", traffic=traffic[client])
        elif variant == "untrusted":
            t.expect_stats(client, "tcp", "untrusted_rendezvous", traffic=traffic[client])
        elif client_slip:
            t.expect_stats(client, "tcp", "not_same_host", traffic=traffic[client])
        if server_slip:
            accelerated = variant in ("both", "ipv6")
            t.expect_stats(server, "shm" if accelerated else "tcp",
                           "" if accelerated else "peer_not_slipstream", traffic=traffic[server])
        if squatter:
            squatter.signal(signal.SIGTERM)
            squatter.wait()
            (directory / name).unlink()
        t.check(not names_in(directory),
                f"names left in the directory after the server exited: {names_in(directory)}")


def storm(t, variant, directory, server_ns, client_ns):
    members = ["a", "b"] if variant == "group" else ["w"]
    servers = []
    for name in members:
        args = ["--port", t.port, "--member", name, "--bind", "0.0.0.0"]
        if variant == "shared":
            args += ["--workers", 2]
        servers.append(t.start(f"server-{name}", py("reuseport.py", "server", *args),
                               role="server", slip=True, env=pod_env(directory),
                               netns=server_ns))
        pid = servers[-1].popen.pid
        servers[-1].wait_until(lambda n=len(servers): listener_count(t.port, pid) >= n,
                               f"{len(servers)} listener(s) on port {t.port}")
    print(f"names published: {names_in(directory)}")
    if variant == "group":
        t.check(len(names_in(directory)) == 1, "one name for the group's address and port")
    else:  # (withdrawn as soon as a worker accepts on the shared socket: maybe already)
        t.check(len(names_in(directory)) <= 1, "one name at most for the shared listener")
    client = t.start("client", py("reuseport.py", "client", "--port", t.port, "--host",
                                  SERVER_ADDRESS, "--count", STORM_CONNECTIONS, "--parallel", 6),
                     slip=True, env=pod_env(directory), netns=client_ns)
    client.expect_exit(0, timeout=60)
    for server in servers:
        server.signal(signal.SIGTERM)
    for server in servers:
        server.expect_exit(0)
    accepted = client.json_output()["accepted"]
    t.check(len(accepted) == STORM_CONNECTIONS,
            f"{len(accepted)} of {STORM_CONNECTIONS} connections answered")
    if t.settings.plain:
        return
    at_client = collections.Counter(said for _, said in connection_stats(t, client, "remote"))
    at_servers = collections.Counter()
    for server in servers:
        at_servers.update(said for _, said in connection_stats(t, server, "local"))
    print(f"client ends: {dict(at_client)}; server ends: {dict(at_servers)}")
    shm = ("shm", "")
    t.check(at_servers.get(shm, 0) == at_client.get(shm, 0),
            "the servers' shm ends must be the client's shm ends")
    t.check(sum(at_servers.values()) == STORM_CONNECTIONS, "one server end per connection")
    if variant == "group":
        spread = collections.Counter(member for _, member in accepted)
        print(f"connections per member: {dict(spread)}")
        t.check(set(at_client) <= {shm, ("tcp", "declined")}, f"client ends: {dict(at_client)}")
        t.check(at_client.get(shm, 0) > 0, "no connection on shm")
        t.check(len(spread) == 2, f"the connections reached only {sorted(spread)}: moot")
    else:
        t.check(at_client.get(shm, 0) == 0, "a shared listener's connections on shm")
    t.check(not names_in(directory), f"names left: {names_in(directory)}")
