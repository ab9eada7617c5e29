"""Verbs-only test cases, run inside the Soft-RoCE guest by tests/vm/verbs-suite.sh:
`verbs_cases.py --build-dir build CASE VARIANT` (or --list).

They use the integration harness (tests/integration/harness.py) with SLIP_TEST_HOST=10.77.0.1
and SLIP_TEST_TRANSPORTS=verbs,tcp set by the suite, and check what only the verbs transport
has: rdma_cm requests forged or malformed by a hostile peer (tests/vm/progs/forge_cm.c), the
SEND-based notification path (iWARP's), RLIMIT_MEMLOCK too low to pin the rings, and the
negative cache. Every case checks the bytes it moved (SHA-256) and the transport used.
"""

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))

from harness import LOOPBACK, PYTHON, main, pick_port, py  # noqa: E402

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


def bulk_pair(t, server_slip=True, client_slip=True, server_env=None, client_env=None,
              client_args=(), client_wrap=()):
    """progs/bulk.py both ways; returns (server, client, traffic) after checking content."""
    server = t.serve("server", py("bulk.py", "server", "--port", t.port, "--bind", LOOPBACK,
                                  "--seed", 1, "--total", BULK), slip=server_slip, env=server_env)
    argv = py("bulk.py", "client", "--port", t.port, "--host", LOOPBACK, "--seed", 2,
              "--total", BULK, *client_args)
    client = t.start("client", [*client_wrap, *argv], slip=client_slip, env=client_env)
    if client_wrap:
        client.exe = os.path.realpath(PYTHON)  # what the stats record will name
    client.expect_exit(0)
    server.expect_exit(0)
    s, c = server.json_output(), client.json_output()
    t.expect_same_stream("client -> server", c, s)
    t.expect_same_stream("server -> client", s, c)
    return server, client, {server: (s["sent"], s["received"]), client: (c["sent"], c["received"])}


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
    """Requests with garbage, cut-short, wrong-version and wrong-tuple private data are each
    rejected by the listener, which then serves a real connection over verbs unharmed."""
    server = t.serve("server", py("bulk.py", "server", "--port", t.port, "--bind", LOOPBACK,
                                  "--seed", 1, "--total", BULK), slip=True)
    for mode in ("garbage", "short", "version", "tuple"):
        forge = t.start(f"forge_{mode}", [forge_path(t), LOOPBACK, t.port, mode])
        code = forge.wait(timeout=30)
        t.check(code == 0 and "rejected" in forge.stdout(),
                f"forged request ({mode}): exit {code}, said {forge.stdout().strip()!r}")
    client = t.start("client", py("bulk.py", "client", "--port", t.port, "--host", LOOPBACK,
                                  "--seed", 2, "--total", BULK), slip=True)
    client.expect_exit(0)
    server.expect_exit(0)
    s, c = server.json_output(), client.json_output()
    t.expect_same_stream("client -> server", c, s)
    t.expect_same_stream("server -> client", s, c)
    t.expect_stats(server, "verbs", "")
    t.expect_stats(client, "verbs", "")


@case("forged_nonce")
def forged_nonce(t, variant):
    """A well-formed request for a real connection's 4-tuple but with a nonce nobody
    confirms: the listener accepts it at the rdma_cm level (it cannot know yet); the TCP
    connection from that port is a plain client whose first bytes are its own data, so the
    server keeps them for the application, serves it on TCP, and drops the forged request."""
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
    t.expect_stats(server, "tcp", "peer_not_slipstream")
    code = forge.wait(timeout=30)
    t.check(code == 0 and "disconnected" in forge.stdout(),
            f"the forged request was not dropped: exit {code}, said {forge.stdout().strip()!r}")


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
    t.check(report == {"connections": 2, "ok": 2}, f"echo failed: {report}")
    t.expect_stats(client, "tcp", "peer_not_slipstream", count=2)
    text = log.read_text() if log.exists() else ""
    t.check(text.count("negative cache") == 1,
            f"expected one answer from the negative cache, log: {text!r}")


if __name__ == "__main__":
    sys.exit(main(__doc__, CASES))
