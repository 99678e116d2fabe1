#!/usr/bin/env bash
# GPU builds, so neither backend can rot on CPU-only machines:
#  - CUDA (sm_90a) with the local nvcc: builds the backend, the GPU tests and
#    the benchmark, runs the tests (without a device they report Skipped;
#    test_backend_select runs for real);
#  - HIP with Debian's hipcc: compile and link only (no AMD GPU here).
# Under CI (CI=true) a missing nvcc is an error and hipcc is installed;
# elsewhere a missing toolchain is skipped with a message.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=$(nproc)
GPU_TESTS=$(for f in tests/gpu/test_*.c; do basename "$f" .c; done)
GPU_BENCH=$(for f in bench/gpu/*.c; do basename "$f" .c; done)
NVCC=$(command -v nvcc || true)
[ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc
if [ -n "$NVCC" ]; then
  cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DGLM53_CUDA=ON -DCMAKE_CUDA_COMPILER="$NVCC" >/dev/null
  cmake --build build-cuda -j"$JOBS" --target glm53 test_backend_select $GPU_TESTS $GPU_BENCH
  ctest --test-dir build-cuda --output-on-failure -R '^(test_gpu_|test_backend_select)' --timeout 300
elif [ "${CI:-}" = true ]; then
  echo "cuda build: nvcc not found" >&2; exit 1
else
  echo "cuda build: skipped (nvcc not found)"
fi

if ! command -v hipcc >/dev/null 2>&1 && [ "${CI:-}" = true ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends hipcc libamdhip64-dev >/dev/null
fi
if command -v hipcc >/dev/null 2>&1; then
  cmake -S . -B build-hip -DCMAKE_BUILD_TYPE=Release -DGLM53_HIP=ON >/dev/null
  cmake --build build-hip -j"$JOBS" --target glm53 $GPU_TESTS $GPU_BENCH
  echo "hip build: compiled and linked (not run: no AMD GPU)"
else
  echo "hip build: skipped (hipcc not found; apt-get install hipcc)"
fi
