#!/usr/bin/env bash
# On the GPU machine (repo root, .devcarry carried; see tools/gpu/pack.sh):
# device facts, the GPU tests (direct launches, then with decode graph
# replay), the selection/fallback test with a device present, an optional
# compute-sanitizer pass, and the benchmark (direct, graphs, profiled).
# Logs go to $OUT; short results are printed.
set -u
OUT=${OUT:-/tmp/glm53-gpu-out}
mkdir -p "$OUT"
D=.devcarry
libs=""
for f in libcudart.so.13 libcublas.so.13 libcublasLt.so.13; do
  p=$(find /usr/local /usr/lib /opt -name "$f" 2>/dev/null | head -1)
  [ -n "$p" ] && libs="$libs:$(dirname "$p")"
done
export LD_LIBRARY_PATH="$PWD/$D/lib$libs:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
runt() { # name env...
  local t=$1 tag=$2; shift 2
  echo "== $t $tag"
  env "$@" timeout 240 "$D/$t" >"$OUT/$t$tag.log" 2>&1
  echo "rc=$?" | tee -a "$OUT/$t$tag.log"
  grep -vE "^glm53 (info|warn)|^seed [23]" "$OUT/$t$tag.log" | grep -E "FAIL|passed|gpu vs cpu|SKIP|capture" | tail -30
}
runt test_gpu_kernels "" X=1
runt test_gpu_forward "" GLM53_GPU_GRAPH=0
runt test_gpu_forward .graph GLM53_GPU_GRAPH=1
runt test_backend_select "" X=1
if [ "${SANITIZE:-0}" = 1 ] && command -v compute-sanitizer >/dev/null; then
  echo "== compute-sanitizer memcheck test_gpu_forward (graphs)"
  GLM53_GPU_GRAPH=1 timeout 150 compute-sanitizer --tool memcheck --print-limit 5 "$D/test_gpu_forward" >"$OUT/memcheck.log" 2>&1
  echo "rc=$?"; grep -E "ERROR SUMMARY|passed" "$OUT/memcheck.log"
fi
for mode in direct graph profile; do
  echo "== gpu_decode ($mode)"
  case $mode in
    direct) e="GLM53_GPU_GRAPH=0" ;; graph) e="GLM53_GPU_GRAPH=1" ;; profile) e="GLM53_GPU_PROFILE=1 GLM53_GPU_GRAPH=0" ;;
  esac
  env $e timeout 200 "$D/gpu_decode" "${EXPERTS:-32}" "${STEPS:-32}" >"$OUT/gpu_decode.$mode.log" 2>&1
  grep -vE "^glm53 info" "$OUT/gpu_decode.$mode.log" | grep -vE "^(device|ceilings|synthetic|gpu model_init|gemv)" || true
done
grep -E "^(device|ceilings|gemv)" "$OUT/gpu_decode.direct.log"
