#!/usr/bin/env bash
# Builds the CUDA configuration here (the device machine has nvcc but not the
# engine's Debian dependencies) and packs the CLI, the GPU test/bench
# binaries and the non-CUDA, non-libc shared libraries they need into
# $CARRY/ (default .devcarry; git-ignored through .git/info/exclude) as one xz tarball (the
# whole working tree that travels is limited to 64 MiB), for `run` with
# carry [".devcarry"] and tools/gpu/run_device.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${BUILD:-build-gpu}
C=${CARRY:-.devcarry}
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
cmake -S . -B "$B" -DGLM53_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$NVCC" >/dev/null
T=${TARGETS:-"glm53 test_backend_select $(for f in tests/gpu/test_*.c bench/gpu/*.c; do basename "$f" .c; done)"}
cmake --build "$B" -j2 --target $T
case "$C" in /*) ;; *) # a relative carry folder is git-ignored (worktrees share the common exclude)
  X="$(git rev-parse --git-common-dir)/info/exclude"
  grep -qx "/$C/" "$X" 2>/dev/null || echo "/$C/" >> "$X" ;;
esac
rm -rf "$C" && mkdir -p "$C/stage/lib"
for t in $T; do cp "$B/$t" "$C/stage/"; strip "$C/stage/$t"; done
for t in $T; do ldd "$B/$t"; done | awk '/=>/{print $3}' | sort -u |
  grep -vE '/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so|/usr/local/cuda|libcuda' |
  while read -r l; do cp -L "$l" "$C/stage/lib/"; done
# xz -9: a 64 MiB dictionary spans several binaries, whose kernel images
# are the same bytes (35 MB -> 6 MB)
XZ_OPT=-9 tar -C "$C/stage" -cJf "$C/bin.tar.xz" .
rm -rf "$C/stage"
du -sh "$C"
