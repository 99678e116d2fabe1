#!/usr/bin/env bash
# 60+ malformed / hostile requests: each answered 4xx with an OpenAI error
# body, the server never crashes and stays healthy.
# Usage: bash tests/integration/test_server_badinput.sh /path/to/glm53
set -euo pipefail
BIN=${1:?usage: $0 /path/to/glm53}
. tests/integration/server_lib.sh
srv_need_node
srv_start --ctx 256 --max-body 65536 --api-key k3y
SRV_KEY=k3y timeout 240 node tests/node/server_badinput.mjs
kill -0 "$SRV_PID" || { echo "FAIL: server died"; cat "$SRV_LOG"; exit 1; }
srv_stop_wait
[ "$SRV_RC" = 0 ] || { echo "FAIL: server exit status $SRV_RC"; cat "$SRV_LOG"; exit 1; }
echo "PASS: server bad input"
