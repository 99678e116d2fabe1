#!/usr/bin/env bash
# On the GPU machine (repo root, .devcarry carried; see tools/gpu/pack.sh):
# device facts, the GPU tests (decode graphs on, then off), the expert-cache
# test, selection/fallback with a device present, the CLI cross-checks
# (quality --compare-backends, greedy run on gpu vs cpu) and the benchmark
# (bf16, q4, streamed experts). Everything goes to stdout (tee it into
# $OUT/log.txt); a summary of the key lines comes last. A deadline
# (DEADLINE seconds after start, default 225) bounds every step, so the
# summary is printed even when a step runs long.
set -u
DEADLINE=${DEADLINE:-225}
. tools/gpu/device_env.sh || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
date -u
step() { # name timeout cmd... (env assignments via env)
  local name=$1 to=$2; shift 2
  local left=$((DEADLINE - SECONDS))
  if [ "$left" -le 5 ]; then echo "== $name: SKIPPED (deadline)"; return; fi
  [ "$to" -gt "$left" ] && to=$left
  echo "== $name (timeout ${to}s, t=${SECONDS}s)"
  local t0=$SECONDS
  timeout "$to" "$@" 2>&1
  echo "== $name: rc=$? in $((SECONDS - t0))s"
}
step test_gpu_kernels 40 env "$D/test_gpu_kernels"
step test_gpu_expert_cache 60 env "$D/test_gpu_expert_cache"
step test_gpu_forward.graph 60 env GLM53_GPU_GRAPH=1 "$D/test_gpu_forward"
step test_backend_select 20 env "$D/test_backend_select"
step test_gpu_golden 60 env "$D/test_gpu_golden"
if "$D/glm53" quality --help 2>&1 | grep -q -- --compare-backends; then
  step quality_compare 50 env "$D/glm53" quality --model models/tiny --text tests/data/tiny/heldout.txt --compare-backends --max-tokens 2048
else
  echo "== quality --compare-backends: not in this build"
fi
step run_gpu 20 sh -c "'$D/glm53' run --model models/tiny --backend gpu -p 'The Python interpreter is' --max-tokens 64 --temperature 0 >/tmp/run_gpu.txt"
step run_cpu 20 sh -c "'$D/glm53' run --model models/tiny --backend cpu -p 'The Python interpreter is' --max-tokens 64 --temperature 0 >/tmp/run_cpu.txt"
echo "--- gpu text:"; cat /tmp/run_gpu.txt 2>/dev/null; echo; echo "--- cpu text:"; cat /tmp/run_cpu.txt 2>/dev/null; echo
if cmp -s /tmp/run_gpu.txt /tmp/run_cpu.txt && [ -s /tmp/run_gpu.txt ]; then echo "greedy run gpu vs cpu: IDENTICAL"; else echo "greedy run gpu vs cpu: DIFFERENT"; fi
step run_gpu_streamed 20 sh -c "'$D/glm53' run --model models/tiny --backend gpu --gpu-expert-gb 0 -p 'The Python interpreter is' --max-tokens 64 --temperature 0 >/tmp/run_gpu_s.txt"
if cmp -s /tmp/run_gpu.txt /tmp/run_gpu_s.txt && [ -s /tmp/run_gpu_s.txt ]; then echo "greedy run gpu streamed vs resident: IDENTICAL"; else echo "greedy run gpu streamed vs resident: DIFFERENT"; fi
step gpu_decode.bf16 70 env "$D/gpu_decode" 32 32 bf16
step gpu_decode.stream 50 env "$D/gpu_decode" 32 12 stream
step gpu_decode.q4 40 env "$D/gpu_decode" 128 32 q4
step test_gpu_forward.nograph 40 env GLM53_GPU_GRAPH=0 "$D/test_gpu_forward"
echo "== total ${SECONDS}s"
