#!/bin/sh
# The sanitizer runs, in a tree built with SLIP_SANITIZE (asan: AddressSanitizer and
# UndefinedBehaviorSanitizer) or SLIP_TSAN (tsan: ThreadSanitizer):
#
#   tests/sanitize/run.sh asan|tsan BUILD_DIR unit|programs|suite
#
#   unit      the unit tests (and, under asan, the NCCL harness over libfabric's tcp)
#   programs  real programs with the whole shim instrumented, one transport at a time
#             (shm, libfabric's tcp and shm providers): the pass make test runs
#   suite     every test labelled integration, security or stress (make test-sanitize-suite)
#
# The programs themselves are not instrumented: slip-run of a sanitizer build preloads the
# sanitizer's runtime after the shim (tools/slip-run.cc); the stress suite, which preloads
# the shim itself, is given the runtime in SLIP_TEST_SANITIZER_RUNTIME. Exit status: 0 when
# everything passed, 77 when BUILD_DIR holds no such build (skipped), 1 otherwise.
set -u
kind=$1 build=$2 what=$3
here=$(cd "$(dirname "$0")" && pwd)
jobs=${SLIP_SANITIZE_JOBS:-$(nproc)}

if [ ! -x "$build/bin/slip_unit_tests" ] || [ ! -e "$build/lib/libslipstream.so" ]; then
  echo "SKIP: no $kind build at $build (make test builds it)"
  exit 77
fi
case $kind in
  asan)
    runtime=$(gcc -print-file-name=libasan.so)
    # Leaks are looked for in the unit tests (our code alone); in real programs the
    # program's own (an interpreter's) would drown them. ASan's wish to come first in the
    # library list is turned off: the shim precedes it, by design.
    export ASAN_OPTIONS=verify_asan_link_order=0:detect_leaks=0:halt_on_error=1
    export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
    unit_options=detect_leaks=1
    ;;
  tsan)
    runtime=$(gcc -print-file-name=libtsan.so)
    # A fork child of a threaded program goes on running (the shim's fork handlers make
    # that safe); reports outside our memory are in tests/tsan.supp, each with its reason.
    export TSAN_OPTIONS="halt_on_error=1:die_after_fork=0:suppressions=$here/../tsan.supp"
    unit_options=halt_on_error=1
    ;;
  *)
    echo "usage: $0 asan|tsan BUILD_DIR unit|programs|suite" >&2
    exit 2
    ;;
esac

# Per transport, the programs that exercise the most of it: bulk (both directions at once,
# checksummed) and semantics (a C program's threads, blocking and non-blocking calls,
# waits, urgent data, shutdown); over shm also exec and a forked subprocess (the fork
# handlers, the hand-back).
programs='^(integration\.(bulk\.both|semantics\.both|exec\.both|vfork_stdin\.fork)'
programs="$programs|integration_fabric_(tcp|shm)\.(bulk|semantics)\.both)\$"

status=0
case $what in
  unit)
    if [ "$kind" = asan ]; then
      ASAN_OPTIONS=$unit_options "$build/bin/slip_unit_tests" --gtest_brief=1 || status=1
      if [ -e "$build/lib/libslipstream-fabric.so" ]; then
        SLIP_NCCL_TEST_TRANSPORT=fabric SLIP_TRANSPORTS=fabric SLIP_FABRIC_PROVIDER=tcp \
          ASAN_OPTIONS=$unit_options "$build/bin/slip_unit_tests" --gtest_brief=1 \
          --gtest_filter='NcclPlugin.*:NcclPluginChild.*' || status=1
      fi
    else
      TSAN_OPTIONS=$unit_options "$build/bin/slip_unit_tests" --gtest_brief=1 || status=1
    fi
    ;;
  programs)
    SLIP_TEST_SANITIZER_RUNTIME=$runtime ctest --test-dir "$build" --output-on-failure \
      -j "$jobs" --timeout 600 -R "$programs" || status=1
    ;;
  suite)
    SLIP_TEST_SANITIZER_RUNTIME=$runtime ctest --test-dir "$build" --output-on-failure \
      -j "$jobs" --timeout 600 -L 'integration|security|stress' || status=1
    ;;
  *)
    echo "usage: $0 asan|tsan BUILD_DIR unit|programs|suite" >&2
    exit 2
    ;;
esac
exit $status
