#!/usr/bin/env bash
# Builds the CUDA configuration here (the device machine has nvcc but not the
# engine's Debian dependencies) and packs the GPU test/bench binaries plus the
# non-CUDA shared libraries they need into .devcarry/ (git-ignored through
# .git/info/exclude), for `run` with carry [".devcarry"] and
# tools/gpu/run_device.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${BUILD:-build-gpu}
cmake -S . -B "$B" -DGLM53_CUDA=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$B" -j2 --target test_gpu_kernels test_gpu_forward test_backend_select gpu_decode
grep -qx '/.devcarry/' .git/info/exclude 2>/dev/null || echo '/.devcarry/' >> .git/info/exclude
rm -rf .devcarry && mkdir -p .devcarry/lib
cp "$B"/test_gpu_kernels "$B"/test_gpu_forward "$B"/test_backend_select "$B"/gpu_decode .devcarry/
for l in $(ldd "$B"/test_gpu_forward | awk '/=>/{print $3}' | grep -E 'cjson|xxhash|gomp|pcre2|utf8proc'); do cp -L "$l" .devcarry/lib/; done
du -sh .devcarry
