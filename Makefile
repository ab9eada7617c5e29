# Slipstream: the user's entry points. CMake does the building underneath.
#   make          build into build/ (build/lib/libslipstream.so, build/bin/slip-run, ...)
#   make test     install what is missing (the workload stacks too), build (and again under
#                 the sanitizers), run every test in one ctest (unit, sanitizers, fuzz,
#                 integration with real programs, stress, workloads, verbs over Soft-RoCE
#                 in a guest); `make test-long` the few it leaves out (label long)
#   make test-sanitize-suite  every real-program suite under ASan+UBSan, then under TSan
#   make bench    TCP vs Slipstream on this host (docs/PERFORMANCE.md)
#   make bench-servers  the same for real servers: redis and nginx under load
#   make bench-pods     shm between two network namespaces (pods) against TCP over veth
#   make bench-short    short connections: churn, pgbench -C, tcp_crr, against TCP
#   make bench-nccl     the NCCL plugin's message path against kernel TCP on loopback
#   make bench-nccl-rdma  the plugin over verbs against perftest, in the Soft-RoCE guest
#   make bench-fabric   the plugin and the shim's streams over libfabric's tcp and shm providers
#   make demo     install, build, and show the side-by-side comparison
#   make install  the tools and libraries under PREFIX (default /usr/local): bin/, lib/
BUILD ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
JOBS ?= $(shell nproc)
PREFIX ?= /usr/local

.PHONY: all deps build sanitize-builds test test-long test-asan test-tsan test-sanitize-suite \
        test-workloads bench \
        bench-servers bench-pods bench-short bench-nccl bench-nccl-rdma bench-fabric bench-rdma demo install clean format

all: build

deps:
	@scripts/install-deps.sh

build:
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DSLIP_ASAN_BUILD_DIR=$(abspath $(ASAN_BUILD)) -DSLIP_TSAN_BUILD_DIR=$(abspath $(TSAN_BUILD)) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# The whole tree again, under AddressSanitizer+UndefinedBehaviorSanitizer and under
# ThreadSanitizer (Debug), for the sanitizer runs (tests/sanitize/run.sh).
sanitize-builds:
	@cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DSLIP_SANITIZE=ON >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)
	@cmake -S . -B $(TSAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DSLIP_TSAN=ON >/dev/null
	@cmake --build $(TSAN_BUILD) -j $(JOBS)

# The tools in $(PREFIX)/bin and the libraries in $(PREFIX)/lib (ldconfig after, so that
# NCCL finds libnccl-net-slipstream.so by name).
install: build
	@cmake --install $(BUILD) --prefix $(PREFIX)
	@if [ -w /etc/ld.so.cache ] && command -v ldconfig >/dev/null; then ldconfig; fi

# What make test runs under each sanitizer (the tests sanitize.*): the unit tests, and a few
# real programs per transport with the whole shim instrumented (tests/sanitize/run.sh).
test-asan: sanitize-builds
	@rc=0; for what in unit programs; do \
	  tests/sanitize/run.sh asan $(ASAN_BUILD) $$what || rc=1; done; exit $$rc

test-tsan: sanitize-builds
	@rc=0; for what in unit programs; do \
	  tests/sanitize/run.sh tsan $(TSAN_BUILD) $$what || rc=1; done; exit $$rc

# The real programs of the integration, security and stress suites with the whole shim
# instrumented, under AddressSanitizer+UBSan, then under ThreadSanitizer (the second half
# runs whatever the first found: one run shows everything). About 6 and 11 minutes on 2
# CPUs, so make test runs only the pass above. Allocation faults are not injected there
# (the sanitizer's allocator must see every allocation), and RSS bounds are off (it keeps
# freed memory aside).
test-sanitize-suite: sanitize-builds
	@rc=0; \
	tests/sanitize/run.sh asan $(ASAN_BUILD) suite || rc=1; \
	tests/sanitize/run.sh tsan $(TSAN_BUILD) suite || rc=1; \
	exit $$rc

# Every package first, in one apt-get run (`install-deps.sh workloads` is the base set plus
# the workload stacks), then the three builds, then ONE ctest over every label (unit,
# sanitize, fuzz, integration, stress, workloads, docs, vm: the verbs suite in a Soft-RoCE
# qemu guest, 5 to 13 minutes, tests/vm/README.md), so that its summary is the last thing
# printed. The stress, workload and sanitize tests are RUN_SERIAL: ctest runs them one at
# a time, alone. From a clean clone on 2 CPUs: 20 to 35 minutes by the machine, the three
# builds 5 to 10 of them, the sanitize tests about 3, the verbs guest suite 5 to 13; the
# package download and install adds about 2 (tests/workloads/README.md). The label
# "long" (vm.verbs_extra, workloads.gloo.2, workloads.cpython_sockets) is left out to keep
# this within 40 minutes: `make test-long`.
# --repeat until-pass:2: a test must fail twice in a row to fail the run (every failure is
# still printed): a guard against the timing of a loaded 2-CPU machine.
test:
	@scripts/install-deps.sh workloads
	@$(MAKE) --no-print-directory build sanitize-builds
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 300 --repeat until-pass:2 -LE long

# What `make test` leaves out to stay within its time (label "long"): the rest of the verbs
# guest cases (vm.verbs_extra), workloads.gloo.2, and CPython's socket-level test modules
# plain and under slip-run (workloads.cpython_sockets). About 12 minutes on 2 CPUs.
test-long:
	@scripts/install-deps.sh long
	@$(MAKE) --no-print-directory build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 1800 -L long

# Only the real training stacks under slip-run (gRPC parameter server, PyTorch Gloo, Open
# MPI; make test runs them too): about 200 MB of Debian packages, about a minute on 2 CPUs.
test-workloads:
	@scripts/install-deps.sh workloads
	@$(MAKE) --no-print-directory build
	@cd $(BUILD) && ctest --output-on-failure --timeout 300 -L workloads

bench: deps build
	@tests/bench/bench.sh $(BUILD)

# Real servers, kernel TCP against both ends under slip-run: redis-server under
# redis-benchmark (GET at 1 to 1000 clients, pipelined too, and with 1000 idle connections
# held open), nginx under wrk and ab (tests/bench/servers.sh; it installs redis, nginx, wrk
# and ab when missing). Results in build/bench-servers/; a few minutes on 2 CPUs.
bench-servers: deps build
	@tests/bench/servers.sh $(BUILD)

# Two network namespaces (pods) on this host: kernel TCP over veth against shm through a
# shared rendezvous directory (tests/bench/pods.sh, as root; results in build/bench-pods/).
bench-pods: build
	@tests/bench/pods.sh $(BUILD)

# Short connections against kernel TCP, each run in a fresh network namespace: a client
# that closes first for 60 s, PostgreSQL under pgbench -C, slip-perf tcp_crr
# (tests/bench/short_conns.sh, as root; results in build/bench-short/; about 4 minutes).
bench-short: build
	@tests/bench/short_conns.sh $(BUILD)

# The NCCL plugin driven as NCCL's proxy drives it, two processes, against a TCP connection
# on loopback (what NCCL's socket transport rides): latency and bandwidth at 8 B to 4 MiB
# (tests/bench/nccl_bench.cc; about a minute). A GPU run is tests/gpu/run.sh.
bench-nccl: build
	@$(BUILD)/bin/slip-nccl-bench $(BUILD)/lib/libnccl-net-slipstream.so 2

# The plugin over libfabric, in one run: on this host over the tcp provider (RDM through
# ofi_rxm) against kernel TCP, over the shm provider against the plugin over Slipstream's
# own shm (each table has its TCP baseline of the same moment); then in the Soft-RoCE
# guest over the verbs provider against the plugin over verbs and perftest (about 9 min).
bench-fabric: build
	@echo "== the plugin over Slipstream's shm"
	@$(BUILD)/bin/slip-nccl-bench $(BUILD)/lib/libnccl-net-slipstream.so 2
	@echo "== the plugin over libfabric, provider tcp (tcp;ofi_rxm)"
	@SLIP_TRANSPORTS=fabric SLIP_FABRIC_PROVIDER=tcp \
	  $(BUILD)/bin/slip-nccl-bench $(BUILD)/lib/libnccl-net-slipstream.so 2
	@echo "== the plugin over libfabric, provider shm"
	@SLIP_TRANSPORTS=fabric SLIP_FABRIC_PROVIDER=shm \
	  $(BUILD)/bin/slip-nccl-bench $(BUILD)/lib/libnccl-net-slipstream.so 2
	@echo "== the shim's streams: kernel TCP, Slipstream's shm, fabric over tcp and shm"
	@tests/bench/fabric_streams.sh $(BUILD)
	@echo "== in the Soft-RoCE guest: perftest, the plugin over verbs, over libfabric's verbs"
	@SLIP_BENCH_NCCL_FABRIC=1 tests/vm/bench-nccl.sh $(BUILD)

# The plugin over verbs against perftest on one rxe link (tests/vm/bench-nccl.sh).
bench-nccl-rdma: build
	@tests/vm/bench-nccl.sh $(BUILD)

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
