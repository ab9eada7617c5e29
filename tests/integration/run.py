"""Runs one integration test: `run.py [options] CASE VARIANT`, e.g. `run.py bulk both`.

`run.py --list` prints every test as CASE.VARIANT, one a line (CMake registers these).
Exit status: 0 passed, 1 failed (the reason and both programs' outputs are printed).
See harness.py for the environment (SLIP_BUILD_DIR, SLIP_TEST_PLAIN).
"""

import sys

import habits  # noqa: F401  (registers its cases)
import pods  # noqa: F401  (registers its cases)
import short_connections  # noqa: F401  (registers its cases)
from cases import CASES
from harness import main

if __name__ == "__main__":
    sys.exit(main(__doc__, CASES, program_options=("et-client", "semantics")))
