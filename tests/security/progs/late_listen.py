"""The integration suite's bulk server (../../integration/progs/bulk.py, unchanged), whose
listening socket listens only when the test says so: `late_listen.py GO_FILE bulk.py-args`.

A v3 rendezvous is named after the TCP listening socket's inode, and the shim publishes it
at listen(). So that a squatter can bind that very name first (rendezvous_squat), the
listener is created and bound as bulk.py's would be (common.bound: SO_REUSEADDR, dual
stack for IPv6), then "INODE <n>" is printed (fstat of the socket: the inode the kernel
shows for it in /proc/net/tcp, and the one the shim names its rendezvous after), and
listen() is called only once GO_FILE exists (at most 30 s; then it exits with status 2).
Everything else is bulk.py's: its arguments, its transfer and its JSON report.
"""

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "integration" / "progs"))

import bulk  # noqa: E402
import common  # noqa: E402

GO_WAIT_S = 30


def listen_after(go_file):
    def listen(port, address=common.LOOPBACK):
        sock = common.bound(port, address)
        print(f"INODE {os.fstat(sock.fileno()).st_ino}", flush=True)
        deadline = time.monotonic() + GO_WAIT_S
        while not os.path.exists(go_file):
            if time.monotonic() > deadline:
                print(f"late_listen: {go_file} did not appear in {GO_WAIT_S} s", file=sys.stderr)
                sys.exit(2)
            time.sleep(0.01)
        sock.listen(16)
        return sock
    return listen


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    go_file = sys.argv[1]
    common.listen = listen_after(go_file)  # what bulk.py's server calls, via accept_one
    sys.argv = [str(Path(bulk.__file__)), *sys.argv[2:]]
    bulk.main()


if __name__ == "__main__":
    main()
