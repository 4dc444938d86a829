# moecomm: `make run` builds and runs the benchmark (mc-bench), `make test`
# builds and runs every test: the suite, the Python package's tests, the
# suite again under ASan+UBSan and TSan, valgrind on a subset, an install
# + link check, and a build with the p2p transport alone where nvcc exists.
# Build trees:
# build/ (release with debug info), build-asan/, build-tsan/.
BUILD ?= build
JOBS ?= 2
ARGS ?=
CMAKE_FLAGS ?=

.PHONY: all build run test test-fast test-asan test-tsan test-valgrind test-install test-python test-p2p-only clean

all: build

build:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS) > /dev/null
	cmake --build $(BUILD) -j$(JOBS)

run: build
	./scripts/run.sh $(BUILD) $(ARGS)

test: test-fast test-python test-asan test-tsan test-valgrind test-install test-p2p-only
	@echo "make test: every suite passed"

test-fast: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS)

test-asan:
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DMC_SANITIZE=address,undefined -DMC_BUILD_TOOLS=OFF -DMC_CUDA=OFF > /dev/null
	cmake --build build-asan -j$(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --output-on-failure -j$(JOBS)

test-tsan:
	cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DMC_SANITIZE=thread -DMC_BUILD_TOOLS=OFF -DMC_CUDA=OFF > /dev/null
	cmake --build build-tsan -j$(JOBS)
	cd build-tsan && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 ctest --output-on-failure -j$(JOBS)

test-valgrind: build
	./tests/valgrind.sh $(BUILD)

# The package's wheel (its own CMake build tree, build/pywheel), installed
# into build/pyenv and tested there; needs no other build.
test-python:
	./tests/test_python.sh

test-install: build
	./tests/check_install.sh $(BUILD)

# The GPU build without NVSHMEM (p2p only, where nvcc exists): it must build,
# pass the suite, and not link NVSHMEM (a single-node user installs only CUDA).
test-p2p-only:
	@if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then \
	  cmake -S . -B build-p2p -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMC_NVSHMEM=OFF -DMC_CUDA_ARCHITECTURES=90 > /dev/null && \
	  cmake --build build-p2p -j$(JOBS) && \
	  ! ldd build-p2p/libmoecomm.so | grep -i nvshmem && \
	  (cd build-p2p && ctest --output-on-failure -j$(JOBS)); \
	else echo "test-p2p-only: no nvcc, skipped"; fi

clean:
	rm -rf build build-asan build-tsan build-p2p
