# The two commands a newcomer needs:
#   make run    builds, then runs the Mandelbrot demo on every device and writes
#               its pictures and timeline to build/run/
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

# The Mandelbrot set over every device through the work-stealing pool; the
# pictures, the trace and its timeline go to $(BUILD)/run/.
run: build
	$(BUILD)/bin/mgpu demo mandelbrot --out $(BUILD)/run
	@echo "make run: pictures in $(BUILD)/run/: mandelbrot.png, mandelbrot-devices.png, mandelbrot-timeline.png (trace: mandelbrot-trace.json)"

test: build
	cd $(BUILD) && ctest $(CTEST_FLAGS)

# The whole suite on real GPUs: every GPU, then GPU 0 split into four logical
# devices, then the CUDA tests one by one under compute-sanitizer memcheck
# (all but cuda_async_error, whose fault is the point of the test, and
# cuda_nccl_provider: NCCL's own kernels are not ours to check).
# CUDA_ARCH: the GPU architectures to build for (default: the GPUs present).
GPU_BUILD ?= build-gpu
CUDA_ARCH ?= native
SANITIZER ?= $(shell command -v compute-sanitizer 2>/dev/null || \
               ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
test-gpu:
	cmake -S . -B $(GPU_BUILD) -DMGPU_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=$(CUDA_ARCH) $(CMAKE_FLAGS)
	cmake --build $(GPU_BUILD) -j$(JOBS)
	cd $(GPU_BUILD) && MGPU_DEVICES=cuda ctest $(CTEST_FLAGS)
	cd $(GPU_BUILD) && MGPU_DEVICES=cuda:0/4 ctest $(CTEST_FLAGS)
	@if [ -z "$(SANITIZER)" ]; then \
	  echo "test-gpu: compute-sanitizer not found: memcheck pass skipped"; \
	else \
	  cd $(GPU_BUILD) && fail=0 && \
	  for t in $$(ctest -N -L cuda | sed -n 's/.*Test *#[0-9]*: cuda\.//p'); do \
	    case "$$t" in cuda_async_error|cuda_nccl_provider) continue;; esac; \
	    MGPU_DEVICES=cuda $(SANITIZER) --tool memcheck --error-exitcode 1 \
	      --target-processes all bin/test-cuda $$t >memcheck-$$t.log 2>&1; \
	    rc=$$?; \
	    if [ $$rc -eq 0 ] || [ $$rc -eq 77 ]; then echo "memcheck ok   $$t"; \
	    else echo "memcheck FAIL $$t (see $(GPU_BUILD)/memcheck-$$t.log)"; fail=1; fi; \
	  done; exit $$fail; \
	fi

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
