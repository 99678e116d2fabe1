#!/usr/bin/env bash
# Load test: 32 concurrent streaming clients in three waves against a tiny
# model; all complete and well-formed, greedy outputs equal to the same
# requests alone, idle RSS not growing from wave to wave, /metrics consistent
# afterwards, and the decode steps really were batched (glm53_decode_batch_*
# metrics).
# Usage: bash tests/integration/test_server_load.sh /path/to/glm53
set -euo pipefail
BIN=${1:?usage: $0 /path/to/glm53}
. tests/integration/server_lib.sh
srv_need_node
# ASan keeps freed memory in quarantine, so RSS says nothing there.
if srv_bin_is_asan; then export LOAD_SKIP_RSS=1; fi
srv_start --ctx 1024 --parallel 8 --queue 64
LOAD_CLIENTS=32 LOAD_MAX_TOKENS=8 SRV_PID=$SRV_PID timeout 300 node tests/node/server_load.mjs
[ "$(srv_metric glm53_active_sessions)" = 0 ] || { echo "FAIL: active sessions not 0 after the load"; exit 1; }
[ "$(srv_metric glm53_cache_tokens)" = 0 ] || { echo "FAIL: cache tokens not 0 after the load"; exit 1; }
[ "$(srv_metric glm53_queue_depth)" = 0 ] || { echo "FAIL: queue not empty after the load"; exit 1; }
# continuous batching: decode steps of several requests happened, none larger
# than --parallel, and every decoded token went through a counted step (each
# request samples its first token from the prefill, the rest from decode steps)
grep -q "parallel 8 = max decode batch" "$SRV_LOG" || { echo "FAIL: max batch not in the startup line"; exit 1; }
curl -s --max-time 5 "$SRV_URL/metrics" >"$SRV_TMP/metrics.txt"
m() { awk -v n="$1" '$1 == n { print $2 }' "$SRV_TMP/metrics.txt"; }
steps=$(m glm53_decode_batch_steps_total); toks=$(m glm53_decode_batch_tokens_total)
single=$(m 'glm53_decode_batch_size_bucket{le="1"}'); peak=$(m glm53_decode_batch_size_peak)
gen=$(m glm53_generated_tokens_total)
reqs=$(awk '$1 ~ /^glm53_requests_total\{endpoint="\/v1\/(chat\/)?completions",status="200"\}$/ { s += $2 } END { print s + 0 }' "$SRV_TMP/metrics.txt")
echo "decode batching: $steps steps, $toks tokens, $single steps of 1, peak $peak, avg $(m glm53_decode_batch_size_avg)"
[ "$steps" -gt "$single" ] || { echo "FAIL: no decode step had more than one request"; exit 1; }
[ "$peak" -ge 2 ] && [ "$peak" -le 8 ] || { echo "FAIL: peak batch $peak outside 2..8"; exit 1; }
[ "$(m glm53_decode_batch_max_size)" = 8 ] || { echo "FAIL: max batch gauge"; exit 1; }
[ "$(m glm53_decode_batch_size_count)" = "$steps" ] && [ "$(m glm53_decode_batch_size_sum)" = "$toks" ] ||
  { echo "FAIL: batch histogram count/sum differ from the counters"; exit 1; }
[ "$toks" = $((gen - reqs)) ] || { echo "FAIL: decode batch tokens $toks != generated $gen - requests $reqs"; exit 1; }
[ "$(m glm53_decode_batch_size_current)" = 0 ] || { echo "FAIL: current batch not 0 when idle"; exit 1; }
[ "$(m glm53_decode_batch_failures_total)" = 0 ] || { echo "FAIL: batch failures without faults"; exit 1; }
code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 "$SRV_URL/health")
[ "$code" = 200 ] || { echo "FAIL: /health $code after load"; exit 1; }
srv_stop_wait
[ "$SRV_RC" = 0 ] || { echo "FAIL: server exit status $SRV_RC"; cat "$SRV_LOG"; exit 1; }
echo "PASS: server load"
