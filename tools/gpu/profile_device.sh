#!/usr/bin/env bash
# On the GPU machine (repo root, .devcarry carried; tools/gpu/pack.sh): where
# decode time goes. Into $OUT: the per-kernel timeline of Q4 decode on the
# full-dimension synthetic model (nsys, graph nodes traced; kernel summary
# CSV + the xz'd trace CSV) and Nsight Compute sections of the first v3 GEMV
# launches of the GEMV microbenchmark (Q4, then bf16). Tools that are not
# installed are reported and skipped.
set -u
. tools/gpu/device_env.sh || exit 1
OUT=${OUT:-/tmp/prof}
mkdir -p "$OUT"
NSYS=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems*/bin/nsys /usr/local/cuda*/nsight-systems*/bin/nsys 2>/dev/null | head -1)
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute*/ncu /usr/local/cuda*/nsight-compute*/ncu 2>/dev/null | head -1)
echo "nsys: ${NSYS:-none}; ncu: ${NCU:-none}"
if [ -n "$NSYS" ]; then
  timeout 200 "$NSYS" profile -t cuda --cuda-graph-trace=node -f true -o /tmp/dec "$D/gpu_decode" 64 12 q4 45 >"$OUT/dec_run.txt" 2>&1
  echo "nsys profile rc=$?"
  timeout 150 "$NSYS" stats -r cuda_gpu_kern_sum,cuda_gpu_trace -f csv -o /tmp/dec /tmp/dec.nsys-rep >"$OUT/nsys_stats.txt" 2>&1
  echo "nsys stats rc=$?"; ls -la /tmp/dec*
  cp /tmp/dec_cuda_gpu_kern_sum.csv "$OUT/" 2>/dev/null
  xz -c /tmp/dec_cuda_gpu_trace.csv >"$OUT/dec_trace.csv.xz" 2>/dev/null
fi
if [ -n "$NCU" ]; then
  S="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis"
  timeout 150 "$NCU" --kernel-name-base demangled -k "regex:gv_k<4, 1," -c 12 $S "$D/gpu_gemv" >"$OUT/ncu_q4.txt" 2>&1
  echo "ncu q4 rc=$?"
  timeout 100 "$NCU" --kernel-name-base demangled -k "regex:gv_k<2, 1," -c 4 $S "$D/gpu_gemv" >"$OUT/ncu_bf16.txt" 2>&1
  echo "ncu bf16 rc=$?"
fi
