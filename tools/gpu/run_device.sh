#!/usr/bin/env bash
# On the GPU machine (repo root, $CARRY carried; see tools/gpu/pack.sh).
# Usage: run_device.sh [tests|bench|all]
#  tests: device facts, every packed GPU test (test_*; test_gpu_forward with
#         decode graphs on and off), compute-sanitizer memcheck of the
#         kernel, forward and batch tests, selection/fallback with a device
#         present, the CLI cross-checks (quality --compare-backends, greedy
#         run on gpu vs cpu vs streamed experts);
#  bench: the GEMV, KDA-recurrence and fused-MLA microbenchmarks (NCU=1:
#         ncu on one launch of the warpgroup MLA kernel, NCU_SECTIONS its
#         sections instead of --set full), the full-dimension model (45 layers bf16
#         and Q4, the 6-layer streamed-expert sweep), each GEMV/Q4 run again
#         without x staging, a per-stage profile (GLM53_GPU_PROFILE=1), a
#         per-operation profile (GLM53_GPU_KPROF=1), the decode step's
#         critical path from an nsys trace (tools/gpu/trace_decode.py),
#         and batch scaling.
# Everything goes to stdout (tee it into $OUT/log.txt). A deadline
# (DEADLINE seconds after start, default 540) bounds every step; ONLY (an
# extended regex) runs just the steps whose names match it.
set -u
DEADLINE=${DEADLINE:-540}
E_BF16=${E_BF16:-32} # routed experts per layer of the bf16 benches (16 fits an 80 GB card fully resident)
PART=${1:-all}
. tools/gpu/device_env.sh || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
date -u
step() { # name timeout cmd... (env assignments via env)
  local name=$1 to=$2; shift 2
  if [ -n "${ONLY:-}" ] && ! [[ $name =~ $ONLY ]]; then return; fi
  local left=$((DEADLINE - SECONDS))
  if [ "$left" -le 5 ]; then echo "== $name: SKIPPED (deadline)"; return; fi
  [ "$to" -gt "$left" ] && to=$left
  echo "== $name (timeout ${to}s, t=${SECONDS}s)"
  local t0=$SECONDS
  timeout "$to" "$@" 2>&1
  echo "== $name: rc=$? in $((SECONDS - t0))s"
}
have() { [ -x "$D/$1" ]; }
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
if [ "$PART" != bench ]; then
  for t in "$D"/test_*; do
    n=$(basename "$t")
    case $n in
    test_gpu_forward) step "$n.graph" 60 env GLM53_GPU_GRAPH=1 "$t"; step "$n.nograph" 60 env GLM53_GPU_GRAPH=0 "$t" ;;
    *) step "$n" 90 env "$t" ;;
    esac
  done
  if [ -n "$SAN" ]; then
    # the forward and batch tests run past two minutes under memcheck:
    # MEMCHECK="test_gpu_kernels test_gpu_forward test_gpu_batch" for all
    for n in ${MEMCHECK:-test_gpu_kernels}; do
      have $n && step "memcheck.$n" 120 "$SAN" --tool memcheck --error-exitcode 9 "$D/$n"
    done
  fi
  step quality_compare 60 env "$D/glm53" quality --model models/tiny --text tests/data/tiny/heldout.txt --compare-backends --max-tokens 2048
  # the chunked KDA prefill form (opt-in) on both backends
  step quality_compare.kda_chunked 60 env GLM53_KDA_PREFILL=chunked "$D/glm53" quality --model models/tiny --text tests/data/tiny/heldout.txt --compare-backends --max-tokens 2048
  P='The Python interpreter is'
  rm -f /tmp/run_gpu.txt /tmp/run_cpu.txt /tmp/run_gpu_s.txt # a step left out by ONLY compares nothing stale
  step run_gpu 20 sh -c "'$D/glm53' run --model models/tiny --backend gpu -p '$P' --max-tokens 64 --temperature 0 >/tmp/run_gpu.txt"
  step run_cpu 20 sh -c "'$D/glm53' run --model models/tiny --backend cpu -p '$P' --max-tokens 64 --temperature 0 >/tmp/run_cpu.txt"
  step run_gpu_streamed 20 sh -c "'$D/glm53' run --model models/tiny --backend gpu --gpu-expert-gb 0 -p '$P' --max-tokens 64 --temperature 0 >/tmp/run_gpu_s.txt"
  echo "--- gpu text:"; cat /tmp/run_gpu.txt 2>/dev/null; echo
  for o in cpu gpu_s; do
    if ! [ -s /tmp/run_gpu.txt ] || ! [ -s /tmp/run_$o.txt ]; then echo "greedy run gpu vs $o: not run"
    elif cmp -s /tmp/run_gpu.txt /tmp/run_$o.txt; then echo "greedy run gpu vs $o: IDENTICAL"; else echo "greedy run gpu vs $o: DIFFERENT"; fi
  done
fi
if [ "$PART" != tests ]; then
  have gpu_gemv && step gpu_gemv 90 env "$D/gpu_gemv"
  have gpu_kda && step gpu_kda 60 env "$D/gpu_kda"
  have gpu_mla && step gpu_mla 60 env "$D/gpu_mla"
  # the profiler on one launch of the warpgroup MLA kernel (NCU=1; report
  # and SASS under $NCU_OUT when set)
  NCU_BIN=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
  if [ "${NCU:-0}" = 1 ] && [ -n "$NCU_BIN" ] && have gpu_mla; then
    R=${NCU_OUT:-/tmp}/mla_wg
    step ncu_mla 300 "$NCU_BIN" --clock-control none --kernel-name regex:mla_flash_wg --launch-skip 2 --launch-count 1 \
      ${NCU_SECTIONS:---set full} --import-source no -f -o "$R" "$D/gpu_mla" 4096 0
    step ncu_mla.details 60 "$NCU_BIN" -i "$R.ncu-rep" --page details
    step ncu_mla.source 60 sh -c "'$NCU_BIN' -i '$R.ncu-rep' --page source --csv --print-source sass > '$R.sass.csv'"
    CUOBJ=$(command -v cuobjdump || ls /usr/local/cuda*/bin/cuobjdump 2>/dev/null | head -1)
    [ -n "$CUOBJ" ] && step sass_mla 60 sh -c "'$CUOBJ' -sass '$D/gpu_mla' | awk '/Function :/{p = /mla_flash_wg_kILi256ELi256ELi0E/} p' > '$R.sass.txt'; grep -c GMMA '$R.sass.txt'"
  fi
  step gpu_decode.bf16 240 env "$D/gpu_decode" "$E_BF16" 16 bf16 45
  step gpu_decode.q4 80 env "$D/gpu_decode" 64 16 q4 45
  step gpu_decode.stream 60 env "$D/gpu_decode" 32 12 stream
  have gpu_gemv && step gpu_gemv.noxs 90 env GLM53_GPU_GEMV_XS=0 "$D/gpu_gemv"
  step gpu_decode.q4.noxs 80 env GLM53_GPU_GEMV_XS=0 "$D/gpu_decode" 64 16 q4 45
  step gpu_decode.profile 150 env GLM53_GPU_PROFILE=1 "$D/gpu_decode" 32 8 bf16 45
  step gpu_decode.kprof 120 env GLM53_GPU_GRAPH=0 GLM53_GPU_KPROF=1 "$D/gpu_decode" "$E_BF16" 8 bf16 45
  step gpu_decode.kprof.kda_chunked 120 env GLM53_GPU_GRAPH=0 GLM53_GPU_KPROF=1 GLM53_KDA_PREFILL=chunked "$D/gpu_decode" "$E_BF16" 8 bf16 45
  step gpu_decode.kprof.q4 90 env GLM53_GPU_GRAPH=0 GLM53_GPU_KPROF=1 "$D/gpu_decode" 64 8 q4 45
  # the decode step's timeline with graphs and PDL as they run (Nsight
  # Systems, graph nodes traced): per kernel its share of the critical path
  NSYS=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems*/*/bin/nsys 2>/dev/null | head -1)
  if [ -n "$NSYS" ]; then
    step nsys_decode 200 env GLM53_BENCH_DECODE_ONLY=1 "$NSYS" profile -o /tmp/glm53_decode -t cuda --cuda-graph-trace=node -f true \
      "$D/gpu_decode" "$E_BF16" 8 bf16 45
    step nsys_decode.stats 120 "$NSYS" stats -r cuda_gpu_trace -f csv -o /tmp/glm53_decode /tmp/glm53_decode.nsys-rep
    step nsys_decode.path 30 sh -c 'python3 tools/gpu/trace_decode.py /tmp/glm53_decode_cuda_gpu_trace.csv'
  fi
  have gpu_batch && step gpu_batch 150 env "$D/gpu_batch"
  have gpu_batch && step gpu_batch.gemm_min4 150 env GLM53_GPU_GEMM_MIN=4 "$D/gpu_batch"
fi
echo "== total ${SECONDS}s"
