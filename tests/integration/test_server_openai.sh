#!/usr/bin/env bash
# `glm53 serve` with the official openai npm client: completions and chat,
# streaming and non-streaming, logprobs, stop, seed, tools; plus --api-key.
# Usage: bash tests/integration/test_server_openai.sh /path/to/glm53
set -euo pipefail
BIN=${1:?usage: $0 /path/to/glm53}
. tests/integration/server_lib.sh
srv_need_node
srv_start --ctx 2048 --parallel 2
node tests/node/server_openai.mjs
srv_stop_wait
[ "$SRV_RC" = 0 ] || { echo "FAIL: server exit status $SRV_RC"; cat "$SRV_LOG"; exit 1; }

# With an API key: the client sends it; a wrong one gets 401.
srv_start --ctx 2048 --api-key s3cret
code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 "$SRV_URL/v1/models")
[ "$code" = 401 ] || { echo "FAIL: no key gave $code"; exit 1; }
code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 -H 'Authorization: Bearer wrong' "$SRV_URL/v1/models")
[ "$code" = 401 ] || { echo "FAIL: wrong key gave $code"; exit 1; }
code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 -H 'Authorization: Bearer s3cret' "$SRV_URL/v1/models")
[ "$code" = 200 ] || { echo "FAIL: right key gave $code"; exit 1; }
SRV_KEY=s3cret SRV_QUICK=1 node tests/node/server_openai.mjs >/dev/null
srv_stop_wait
[ "$SRV_RC" = 0 ] || { echo "FAIL: server exit status $SRV_RC"; exit 1; }
echo "PASS: server openai client"
