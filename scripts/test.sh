#!/usr/bin/env bash
# The test command (README, CI): installs dependencies, builds twice
# (optimised, and ASan+UBSan) and runs the whole CTest suite on both, then
# compiles the GPU backends (scripts/test_gpu_builds.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
JOBS=$(nproc)
if [ ! -d tests/node/node_modules ]; then
  (cd tests/node && npm ci --no-audit --no-fund --loglevel=error)
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$JOBS"
ctest --test-dir build --output-on-failure -j"$JOBS" --timeout 900
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DGLM53_SANITIZE=ON >/dev/null
cmake --build build-asan -j"$JOBS"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j"$JOBS" --timeout 1800 -LE no_asan
./scripts/test_gpu_builds.sh
