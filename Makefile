# The two commands a newcomer needs:
#   make run    builds, then runs the main demo on the devices this machine has
#   make test   builds, then runs the whole test suite with ctest
# and a few more: make test-gpu, make install PREFIX=..., make asan, make tsan.
BUILD ?= build
CMAKE_FLAGS ?=
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
PREFIX ?= /usr/local
CTEST_FLAGS ?= --output-on-failure -j$(JOBS)

.PHONY: all build configure run test test-gpu install asan tsan clean

all: build

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

configure: $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j$(JOBS)

run: build
	$(BUILD)/bin/mgpu demo vecadd

test: build
	cd $(BUILD) && ctest $(CTEST_FLAGS)

# The whole suite on real GPUs: every GPU, then GPU 0 split into four logical
# devices, then the CUDA tests under compute-sanitizer memcheck.
test-gpu:
	cmake -S . -B build-gpu -DMGPU_WITH_CUDA=ON $(CMAKE_FLAGS)
	cmake --build build-gpu -j$(JOBS)
	cd build-gpu && MGPU_DEVICES=cuda ctest $(CTEST_FLAGS)
	cd build-gpu && MGPU_DEVICES=cuda:0/4 ctest $(CTEST_FLAGS)
	cd build-gpu && MGPU_DEVICES=cuda ctest -L cuda --output-on-failure \
	  --test-command-prefix "compute-sanitizer --tool memcheck --error-exitcode 1" 2>/dev/null || \
	  (cd build-gpu && MGPU_DEVICES=cuda MGPU_MEMCHECK=1 ctest -L cuda --output-on-failure)

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

asan:
	cmake -S . -B build-asan -DMGPU_SANITIZE=address -DCMAKE_BUILD_TYPE=Debug $(CMAKE_FLAGS)
	cmake --build build-asan -j$(JOBS)
	cd build-asan && ctest $(CTEST_FLAGS)

tsan:
	cmake -S . -B build-tsan -DMGPU_SANITIZE=thread -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS)
	cmake --build build-tsan -j$(JOBS)
	cd build-tsan && ctest $(CTEST_FLAGS)

clean:
	rm -rf $(BUILD) build-gpu build-asan build-tsan
