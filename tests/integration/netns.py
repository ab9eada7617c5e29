"""Two network namespaces of one host joined by a veth pair, as a pod network joins pods:
the integration suite's pods cases and the security suite's rendezvous directory cases run
their servers in one and their clients in the other. Needs root (ip netns).
"""

import contextlib
import subprocess
import time
import uuid

from harness import TestFailure

SERVER_ADDRESS, CLIENT_ADDRESS = "10.231.7.1", "10.231.7.2"
SERVER_ADDRESS6, CLIENT_ADDRESS6 = "fd00:231::1", "fd00:231::2"


def _ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@contextlib.contextmanager
def two_pods():
    """Namespaces (server's, client's) joined by a veth pair, each with its address and
    its loopback up, removed afterwards. The names are unique: tests run in parallel."""
    tag = uuid.uuid4().hex[:6]
    server_ns, client_ns = f"slipit-{tag}-s", f"slipit-{tag}-c"
    made = []
    try:
        for ns in (server_ns, client_ns):
            # (Two first `ip netns add` at once may race on mounting /run/netns: again.)
            for attempt in range(5):
                try:
                    _ip("netns", "add", ns)
                    break
                except subprocess.CalledProcessError:
                    subprocess.run(["ip", "netns", "del", ns], capture_output=True)
                    if attempt == 4:
                        raise
                    time.sleep(0.2)
            made.append(ns)
        _ip("link", "add", f"sp{tag}s", "type", "veth", "peer", "name", f"sp{tag}c")
        for ns, end, address, address6 in ((server_ns, "s", SERVER_ADDRESS, SERVER_ADDRESS6),
                                           (client_ns, "c", CLIENT_ADDRESS, CLIENT_ADDRESS6)):
            _ip("link", "set", f"sp{tag}{end}", "netns", ns)
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", f"sp{tag}{end}")
            # (nodad: usable at once, not after duplicate address detection)
            _ip("-n", ns, "addr", "add", f"{address6}/64", "dev", f"sp{tag}{end}", "nodad")
            _ip("-n", ns, "link", "set", f"sp{tag}{end}", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield server_ns, client_ns
    except subprocess.CalledProcessError as e:
        raise TestFailure(f"cannot make network namespaces (root needed): {e.stderr.strip()}")
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
