#!/usr/bin/env bash
# Load test: 32 concurrent streaming clients in two waves against a tiny
# model; all complete and well-formed, greedy outputs equal to the same
# requests alone, RSS stable, /metrics consistent afterwards.
# Usage: bash tests/integration/test_server_load.sh /path/to/glm53
set -euo pipefail
BIN=${1:?usage: $0 /path/to/glm53}
. tests/integration/server_lib.sh
srv_need_node
# ASan keeps freed memory in quarantine, so RSS says nothing there.
if ldd "$BIN" 2>/dev/null | grep -q asan; then export LOAD_SKIP_RSS=1; fi
srv_start --ctx 1024 --parallel 8 --queue 64
LOAD_CLIENTS=32 LOAD_MAX_TOKENS=8 SRV_PID=$SRV_PID timeout 300 node tests/node/server_load.mjs
[ "$(srv_metric glm53_active_sessions)" = 0 ] || { echo "FAIL: active sessions not 0 after the load"; exit 1; }
[ "$(srv_metric glm53_cache_tokens)" = 0 ] || { echo "FAIL: cache tokens not 0 after the load"; exit 1; }
[ "$(srv_metric glm53_queue_depth)" = 0 ] || { echo "FAIL: queue not empty after the load"; exit 1; }
code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 "$SRV_URL/health")
[ "$code" = 200 ] || { echo "FAIL: /health $code after load"; exit 1; }
srv_stop_wait
[ "$SRV_RC" = 0 ] || { echo "FAIL: server exit status $SRV_RC"; cat "$SRV_LOG"; exit 1; }
echo "PASS: server load"
