# Slipstream: the user's entry points. CMake does the building underneath.
#   make          build into build/ (build/lib/libslipstream.so, build/bin/slip-run, ...)
#   make test     install what is missing (the workload stacks too), build, run every test
#                 (unit, sanitizers, fuzz, integration with real programs, stress,
#                 workloads), all but the sanitizer runs in one final ctest
#   make bench    TCP vs Slipstream on this host (docs/PERFORMANCE.md)
#   make demo     install, build, and show the side-by-side comparison
BUILD ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
JOBS ?= $(shell nproc)

.PHONY: all deps build test test-asan test-tsan test-workloads bench bench-rdma demo clean format

all: build

deps:
	@scripts/install-deps.sh

build:
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# Unit tests again under AddressSanitizer + UndefinedBehaviorSanitizer.
test-asan:
	@cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DSLIP_SANITIZE=ON >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS) --target slip_unit_tests
	@ASAN_OPTIONS=detect_leaks=1 $(ASAN_BUILD)/bin/slip_unit_tests --gtest_brief=1

# And under ThreadSanitizer: the rings, proxies and fd table are shared between threads.
test-tsan:
	@cmake -S . -B $(TSAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DSLIP_TSAN=ON >/dev/null
	@cmake --build $(TSAN_BUILD) -j $(JOBS) --target slip_unit_tests
	@TSAN_OPTIONS=halt_on_error=1 $(TSAN_BUILD)/bin/slip_unit_tests --gtest_brief=1

# Every package first, in one apt-get run (`install-deps.sh workloads` is the base set plus
# the workload stacks), then the builds and the sanitizer runs, then ONE ctest over every
# label (unit, fuzz, integration, stress, workloads), so that its summary is the last
# thing printed. The stress and workload tests are RUN_SERIAL: ctest runs them one at a
# time, alone. On 2 CPUs: about 10 minutes from a clean clone plus the package download
# (tests/workloads/README.md, docs/PERFORMANCE.md "Workloads").
test:
	@scripts/install-deps.sh workloads
	@$(MAKE) --no-print-directory build test-asan test-tsan
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 300

# Only the real training stacks under slip-run (gRPC parameter server, PyTorch Gloo, Open
# MPI; make test runs them too): about 200 MB of Debian packages, about a minute on 2 CPUs.
test-workloads:
	@scripts/install-deps.sh workloads
	@$(MAKE) --no-print-directory build
	@cd $(BUILD) && ctest --output-on-failure --timeout 300 -L workloads

bench: deps build
	@tests/bench/bench.sh $(BUILD)

demo: deps build
	@scripts/demo.sh $(BUILD)

format:
	@clang-format -i $$(git ls-files '*.cc' '*.h')

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD)

# The RDMA comparison in the Soft-RoCE guest: kernel TCP, rsocket's preload, Slipstream
# verbs and perftest over one rxe link (tests/vm/bench-rdma.sh; results in build/bench-rdma/).
bench-rdma: build
	@tests/vm/bench-rdma.sh $(BUILD)
