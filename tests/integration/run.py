"""Runs one integration test: `run.py [options] CASE VARIANT`, e.g. `run.py bulk both`.

`run.py --list` prints every test as CASE.VARIANT, one a line (CMake registers these).
Exit status: 0 passed, 1 failed (the reason and both programs' outputs are printed).
See harness.py for the environment (SLIP_BUILD_DIR, SLIP_TEST_PLAIN).
"""

import argparse
import sys

from cases import CASES, test_names
from harness import run_test, settings_from


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--list", action="store_true", help="list the tests and exit")
    parser.add_argument("--build-dir", help="CMake build directory (default: $SLIP_BUILD_DIR)")
    parser.add_argument("--et-client", help="path of the built et_client program")
    parser.add_argument("--semantics", help="path of the built semantics program")
    parser.add_argument("case", nargs="?", choices=sorted(CASES))
    parser.add_argument("variant", nargs="?")
    args = parser.parse_args()
    if args.list:
        print("\n".join(test_names()))
        return 0
    if args.case is None:
        parser.error("CASE and VARIANT are required")
    function, variants = CASES[args.case]
    if args.variant not in variants:
        parser.error(f"VARIANT of {args.case} must be one of: {', '.join(variants)}")
    settings = settings_from(args.build_dir, args.et_client, args.semantics)
    return run_test(settings, f"{args.case}.{args.variant}",
                    lambda test: function(test, args.variant))


if __name__ == "__main__":
    sys.exit(main())
