"""Runs one security test: `run.py [options] CASE VARIANT`, e.g. `run.py rendezvous_squat exact`.

`run.py --list` prints every test as CASE.VARIANT, one a line (CMake registers these);
`run.py --list-serial` prints those that must run alone (they flood the host, or measure
time or CPU). Exit status: 0 passed, 1 failed (the reason and every program's output are
printed). The machinery is the integration tests' (../integration/harness.py): each
program in its own session, killed at the end; SLIP_BUILD_DIR or --build-dir names the
build. These tests need root (they run attackers as uid nobody) and the shim itself:
SLIP_TEST_PLAIN=1 skips them.
"""

import os
import sys

from cases import CASES, SERIAL
from harness import main

import paths  # noqa: F401,E402  (registers its cases)
import preproof  # noqa: F401,E402  (registers its cases)

if __name__ == "__main__":
    if sys.argv[1:] == ["--list-serial"]:
        print("\n".join(sorted(SERIAL)))
        sys.exit(0)
    if os.environ.get("SLIP_TEST_PLAIN") == "1" and "--list" not in sys.argv:
        print("plain mode (SLIP_TEST_PLAIN=1): the security tests attack the shim; skipped")
        sys.exit(0)
    sys.exit(main(__doc__, CASES))
