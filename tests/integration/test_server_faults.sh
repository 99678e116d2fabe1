#!/usr/bin/env bash
# Backend errors during one request (GLM53_FAULT=forward:N) with
# --on-gpu-error=fail (that request fails, others go on) and =cpu (the
# request is rebuilt on the CPU and completes); the server keeps serving.
# Usage: bash tests/integration/test_server_faults.sh /path/to/glm53
set -euo pipefail
BIN=${1:?usage: $0 /path/to/glm53}
. tests/integration/server_lib.sh
srv_need_node

GLM53_FAULT=forward:6 srv_start --ctx 512 --parallel 4 --on-gpu-error fail
timeout 120 node tests/node/server_faults.mjs fail
grep -q "backend error" "$SRV_LOG" || { echo "FAIL: the backend error was not logged"; exit 1; }
srv_stop_wait
[ "$SRV_RC" = 0 ] || { echo "FAIL: exit status $SRV_RC"; cat "$SRV_LOG"; exit 1; }

GLM53_FAULT=forward:2 srv_start --ctx 2048 --on-gpu-error fail
timeout 120 node tests/node/server_faults.mjs fail-nonstream
srv_stop_wait
[ "$SRV_RC" = 0 ] || { echo "FAIL: exit status $SRV_RC"; cat "$SRV_LOG"; exit 1; }

GLM53_FAULT=forward:3 srv_start --ctx 512 --on-gpu-error cpu
timeout 120 node tests/node/server_faults.mjs cpu
grep -q "continuing on the cpu backend" "$SRV_LOG" || { echo "FAIL: the fallback was not logged"; exit 1; }
srv_stop_wait
[ "$SRV_RC" = 0 ] || { echo "FAIL: exit status $SRV_RC"; cat "$SRV_LOG"; exit 1; }
# a fault inside a batched decode round: only the request whose row failed is
# affected, per policy
GLM53_FAULT=forward:40 srv_start --ctx 512 --parallel 4 --on-gpu-error fail
timeout 180 node tests/node/server_faults.mjs batch-fail
srv_stop_wait
[ "$SRV_RC" = 0 ] || { echo "FAIL: exit status $SRV_RC"; cat "$SRV_LOG"; exit 1; }

GLM53_FAULT=forward:40 srv_start --ctx 512 --parallel 4 --on-gpu-error cpu
timeout 180 node tests/node/server_faults.mjs batch-cpu
grep -q "continuing on the cpu backend" "$SRV_LOG" || { echo "FAIL: the fallback was not logged"; exit 1; }
srv_stop_wait
[ "$SRV_RC" = 0 ] || { echo "FAIL: exit status $SRV_RC"; cat "$SRV_LOG"; exit 1; }
# a batched forward failing as a whole (the path of a device error), with the
# cpu backend's batched forward: rows rebuilt from their history, none fails
GLM53_CPU_BATCH=1 GLM53_FAULT=batch:3 srv_start --ctx 512 --parallel 4 --on-gpu-error fail
timeout 180 node tests/node/server_faults.mjs batch-whole
grep -q "decode batch of .* failed" "$SRV_LOG" || { echo "FAIL: the batch failure was not logged"; exit 1; }
srv_stop_wait
[ "$SRV_RC" = 0 ] || { echo "FAIL: exit status $SRV_RC"; cat "$SRV_LOG"; exit 1; }
echo "PASS: server faults"
