#!/usr/bin/env python3
"""A client whose child forks and execs a program (as a subprocess does without vfork)
while it holds a connection: one echo round trip, seeded random bytes checked, then the
fork and exec, then another round trip. Reports the files in /dev/shm named after its pid
(a fabric shm endpoint's region) before the fork and after the child's exec, and the
bytes echoed."""
import glob
import os
import random

from common import argument_parser, connect, report


def round_trip(sock, rng):
    data = rng.randbytes(rng.randrange(1, 1 << 16))
    sock.sendall(data)
    got = bytearray()
    while len(got) < len(data):
        chunk = sock.recv(1 << 16)
        if not chunk:
            raise SystemExit(f"EOF after {len(got)} of {len(data)} B echoed")
        got += chunk
    if got != data:
        raise SystemExit("the echo differs from what was sent")
    return len(data)


def own_files():
    return sorted(os.path.basename(p) for p in glob.glob(f"/dev/shm/slip-{os.getpid()}-*"))


def main():
    parser = argument_parser(__doc__)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    sock = connect(args.port)
    echoed = round_trip(sock, rng)
    before = own_files()
    pid = os.fork()
    if pid == 0:
        try:
            os.execv("/bin/true", ["true"])
        finally:
            os._exit(127)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        raise SystemExit(f"the exec'd child exited with status {status}")
    after = own_files()
    echoed += round_trip(sock, rng)
    sock.close()
    report(before=before, after=after, echoed=echoed)


if __name__ == "__main__":
    main()
