#!/usr/bin/env bash
# Client disconnects free slots (/metrics active back to 0; also one in the
# middle of a batched decode, its neighbours unaffected), a full queue
# gives 429, SIGTERM lets an in-flight stream finish and exits 0, and
# `glm53 serve --stop --pid-file F` stops only a glm53 serve.
# Usage: bash tests/integration/test_server_lifecycle.sh /path/to/glm53
set -euo pipefail
BIN=${1:?usage: $0 /path/to/glm53}
. tests/integration/server_lib.sh
srv_need_node

# 1. disconnects and queue limits
srv_start --ctx 4096 --parallel 1 --queue 1
timeout 120 node tests/node/server_disconnect.mjs
srv_stop_wait
[ "$SRV_RC" = 0 ] || { echo "FAIL: exit status $SRV_RC"; cat "$SRV_LOG"; exit 1; }

# 1b. a disconnect in the middle of a batched decode frees the slot; its
# batch neighbours go on unchanged
srv_start --ctx 1024 --parallel 4
timeout 180 node tests/node/server_batch_disconnect.mjs
srv_stop_wait
[ "$SRV_RC" = 0 ] || { echo "FAIL: exit status $SRV_RC"; cat "$SRV_LOG"; exit 1; }

# 2. graceful SIGTERM: an in-flight stream completes, then exit 0
srv_start --ctx 1024 --grace 60
curl -sN --max-time 120 "$SRV_URL/v1/completions" -H 'Content-Type: application/json' \
  -d '{"prompt":"hello","max_tokens":40,"temperature":0,"ignore_eos":true,"stream":true}' >"$SRV_TMP/stream.txt" &
CURL=$!
for _ in $(seq 1 100); do [ -s "$SRV_TMP/stream.txt" ] && break; sleep 0.05; done
srv_stop_wait
wait "$CURL" || true
[ "$SRV_RC" = 0 ] || { echo "FAIL: SIGTERM exit status $SRV_RC"; cat "$SRV_LOG"; exit 1; }
grep -q '"finish_reason":"length"' "$SRV_TMP/stream.txt" || { echo "FAIL: in-flight stream did not finish"; tail -c 300 "$SRV_TMP/stream.txt"; exit 1; }
tail -c 20 "$SRV_TMP/stream.txt" | grep -q 'data: \[DONE\]' || { echo "FAIL: no [DONE]"; exit 1; }
grep -q "SIGTERM received" "$SRV_LOG" || { echo "FAIL: shutdown not logged"; exit 1; }
if curl -s --max-time 2 "$SRV_URL/health" >/dev/null; then echo "FAIL: still answering after exit"; exit 1; fi

# 2b. SIGTERM with --grace 0: the active stream and a queued one are cancelled
# with an SSE error event + [DONE]; the exit is still 0.
srv_start --ctx 4096 --parallel 1 --grace 0
for k in a b; do
  curl -sN --max-time 120 "$SRV_URL/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt":"hello","max_tokens":4000,"temperature":0,"ignore_eos":true,"stream":true}' >"$SRV_TMP/cancel_$k.txt" &
  eval "CURL_$k=\$!"
  for _ in $(seq 1 100); do [ "$(srv_metric glm53_active_sessions)" = 1 ] && break; sleep 0.05; done
done
for _ in $(seq 1 100); do [ "$(srv_metric glm53_queue_depth)" = 1 ] && break; sleep 0.05; done
srv_stop_wait
wait "$CURL_a" "$CURL_b" || true
[ "$SRV_RC" = 0 ] || { echo "FAIL: SIGTERM (grace 0) exit status $SRV_RC"; cat "$SRV_LOG"; exit 1; }
for k in a b; do
  grep -q '"error"' "$SRV_TMP/cancel_$k.txt" || { echo "FAIL: stream $k got no error event"; tail -c 300 "$SRV_TMP/cancel_$k.txt"; exit 1; }
  tail -c 20 "$SRV_TMP/cancel_$k.txt" | grep -q 'data: \[DONE\]' || { echo "FAIL: stream $k has no [DONE]"; exit 1; }
done

# 3. --stop with a pid file
PIDF="$SRV_TMP/serve.pid"
srv_start --pid-file "$PIDF"
[ "$(cat "$PIDF")" = "$SRV_PID" ] || { echo "FAIL: pid file holds $(cat "$PIDF"), server is $SRV_PID"; exit 1; }
"$BIN" serve --stop --pid-file "$PIDF" || { echo "FAIL: --stop failed"; exit 1; }
for _ in $(seq 1 100); do kill -0 "$SRV_PID" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$SRV_PID" 2>/dev/null; then echo "FAIL: server still running after --stop"; exit 1; fi
RC=0; wait "$SRV_PID" || RC=$?
SRV_PID=
[ "$RC" = 0 ] || { echo "FAIL: server exit status $RC after --stop"; exit 1; }
[ ! -e "$PIDF" ] || { echo "FAIL: pid file left behind"; exit 1; }

# --stop refuses a pid that is not a glm53 serve (and a missing/garbage file)
sleep 30 &
SLEEPER=$!
echo "$SLEEPER" >"$PIDF"
if "$BIN" serve --stop --pid-file "$PIDF" 2>/dev/null; then echo "FAIL: --stop accepted a non-glm53 pid"; kill "$SLEEPER"; exit 1; fi
kill -0 "$SLEEPER" || { echo "FAIL: the other process was signalled"; exit 1; }
kill "$SLEEPER"; wait "$SLEEPER" 2>/dev/null || true
echo garbage >"$PIDF"
if "$BIN" serve --stop --pid-file "$PIDF" 2>/dev/null; then echo "FAIL: --stop accepted a garbage pid file"; exit 1; fi
if "$BIN" serve --stop --pid-file "$SRV_TMP/missing.pid" 2>/dev/null; then echo "FAIL: --stop accepted a missing pid file"; exit 1; fi
echo "PASS: server lifecycle"
