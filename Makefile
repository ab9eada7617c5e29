# Slipstream: the user's entry points. CMake does the building underneath.
#   make          build into build/ (build/lib/libslipstream.so, build/bin/slip-run, ...)
#   make test     install what is missing, build, run every test (unit, sanitizers, fuzz,
#                 integration with real programs)
#   make bench    TCP vs Slipstream on this host (docs/PERFORMANCE.md)
#   make demo     install, build, and show the side-by-side comparison
BUILD ?= build
ASAN_BUILD ?= build-asan
JOBS ?= $(shell nproc)

.PHONY: all deps build test test-unit test-asan bench demo clean format

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

test: deps build test-asan
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 300

bench: deps build
	@tests/bench/bench.sh $(BUILD)

demo: deps build
	@scripts/demo.sh $(BUILD)

format:
	@clang-format -i $$(git ls-files '*.cc' '*.h')

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
