# Shared helpers for tests/integration/test_server_*.sh (sourced, not a test).
# srv_model: models/tiny when it has been trained, else the random fixture
# model written by the test_generate binary (tests/model_fixture_save.h). srv_start ARGS...: starts
# `glm53 serve` on a free loopback port in the background and waits for
# /health (one compute thread: OpenMP spinning on a shared 2-core box makes
# timings erratic); sets SRV_PID, SRV_PORT, SRV_URL, SRV_LOG. srv_cleanup kills what
# srv_start started (by pid) and removes the temp dir.
SRV_TMP=$(mktemp -d)
SRV_PID=
srv_cleanup() {
  if [ -n "${SRV_PID:-}" ] && kill -0 "$SRV_PID" 2>/dev/null; then
    kill -TERM "$SRV_PID" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$SRV_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$SRV_PID" 2>/dev/null || true
  fi
  rm -rf "$SRV_TMP"
}
trap srv_cleanup EXIT

srv_need_node() {
  if ! command -v node >/dev/null || [ ! -d tests/node/node_modules/openai ]; then
    echo "SKIP: node or tests/node/node_modules/openai missing (npm ci in tests/node)"
    exit 0
  fi
}

# srv_bin_is_asan: $BIN is an ASan build. (Not `ldd | grep -q`: under
# pipefail, grep -q exiting at its match can kill ldd with SIGPIPE and the
# pipeline then reads as "no match", at random.)
srv_bin_is_asan() {
  case "$(ldd "$BIN" 2>/dev/null)" in *libasan*) return 0 ;; esac
  return 1
}

# The fixture is also used under ASan (the 8-layer models/tiny runs ~5x slower
# there; the server code paths are the same) and when SRV_FIXTURE=1.
srv_model() {
  if [ "${SRV_FIXTURE:-0}" != 1 ] && ! srv_bin_is_asan &&
     [ -f models/tiny/config.json ] && [ -f models/tiny/tokenizer.json ] && [ -f models/tiny/model.safetensors ]; then
    SRV_MODEL=models/tiny
  else
    SRV_MODEL="$SRV_TMP/fixture"
    "$(dirname "$BIN")/test_generate" --write-model-dir "$SRV_MODEL" >/dev/null
  fi
}

# srv_start [extra serve options...]  (env is passed through, e.g. GLM53_FAULT)
srv_start() {
  [ -n "${SRV_MODEL:-}" ] || srv_model
  SRV_LOG="$SRV_TMP/server.$RANDOM.log"
  "$BIN" serve --model "$SRV_MODEL" --host 127.0.0.1 --port 0 --threads 1 "$@" 2>"$SRV_LOG" &
  SRV_PID=$!
  SRV_PORT=
  for _ in $(seq 1 300); do
    SRV_PORT=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$SRV_LOG" 2>/dev/null | sed 's/.*://' || true)
    [ -n "$SRV_PORT" ] && break
    kill -0 "$SRV_PID" 2>/dev/null || { echo "FAIL: server exited at start:"; cat "$SRV_LOG"; exit 1; }
    sleep 0.1
  done
  [ -n "$SRV_PORT" ] || { echo "FAIL: server did not start"; cat "$SRV_LOG"; exit 1; }
  SRV_URL="http://127.0.0.1:$SRV_PORT"
  export SRV_URL
}

# srv_stop_wait: SIGTERM and wait (bounded); sets SRV_RC to the exit status.
srv_stop_wait() {
  kill -TERM "$SRV_PID"
  for _ in $(seq 1 600); do kill -0 "$SRV_PID" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$SRV_PID" 2>/dev/null; then kill -KILL "$SRV_PID"; fi
  SRV_RC=0
  wait "$SRV_PID" || SRV_RC=$?
  SRV_PID=
}

srv_metric() { # srv_metric NAME -> value of an unlabelled metric
  curl -s --max-time 5 "$SRV_URL/metrics" | awk -v n="$1" '$1 == n { print $2 }'
}
