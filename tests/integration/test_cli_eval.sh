#!/usr/bin/env bash
# glm53 eval contract and its error handling: dump size, prefill vs
# prefill+decode vs chunked prefill byte-identical, and one clear error line
# (non-zero exit, no crash) for a truncated checkpoint, a config missing a
# field, a bad token id and bad options.
set -u
BIN=${1:?usage: test_cli_eval.sh path/to/glm53}
M=tests/data/oracle/m5_kpool4_release
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL: $*" >&2; }

TOKS=$(seq -s, 3 45)   # 43 tokens: beyond index_topk 16 (sparse regime)
export GLM53_LOG=error
"$BIN" eval --model $M --tokens "$TOKS" --dump-logits "$T/a.f32" && ok || bad "eval prefill"
"$BIN" eval --model $M --tokens "$TOKS" --decode-from 7 --dump-logits "$T/b.f32" && ok || bad "eval decode"
"$BIN" eval --model $M --tokens "$TOKS" --chunk 5 --dump-logits "$T/c.f32" && ok || bad "eval chunked"
[ "$(stat -c %s "$T/a.f32")" = $((43 * 320 * 4)) ] && ok || bad "dump size"
cmp -s "$T/a.f32" "$T/b.f32" && ok || bad "prefill vs decode not byte-identical"
cmp -s "$T/a.f32" "$T/c.f32" && ok || bad "prefill vs chunked prefill not byte-identical"

# expect_error NAME CMD...: non-zero exit, exactly one line on stderr, starting "glm53"
expect_error() {
  local name=$1; shift
  "$@" >"$T/out" 2>"$T/err"; local rc=$?
  local lines; lines=$(wc -l <"$T/err")
  if [ $rc -ne 0 ] && [ $rc -lt 128 ] && [ "$lines" -eq 1 ] && grep -q '^glm53' "$T/err"; then ok
  else bad "$name: rc=$rc, stderr: $(head -c 400 "$T/err")"; fi
}
cp -r $M "$T/trunc"; truncate -s 4000 "$T/trunc/model.safetensors"
expect_error truncated "$BIN" eval --model "$T/trunc" --tokens 1,2
cp -r $M "$T/nofield"
python3 - "$T/nofield/config.json" <<'PY'
import json, sys
p = sys.argv[1]; c = json.load(open(p)); del c["text_config"]["num_hidden_layers"]; json.dump(c, open(p, "w"))
PY
expect_error missing_field "$BIN" eval --model "$T/nofield" --tokens 1,2
printf 'not json' > "$T/nofield/config.json"
expect_error bad_json "$BIN" eval --model "$T/nofield" --tokens 1,2
expect_error no_model "$BIN" eval --model "$T/does-not-exist" --tokens 1,2
expect_error bad_token "$BIN" eval --model $M --tokens 1,2,100000
expect_error bad_list "$BIN" eval --model $M --tokens 1,,x
expect_error bad_option "$BIN" eval --model $M --tokens 1 --frobnicate 3
expect_error bad_decode_from "$BIN" eval --model $M --tokens 1,2 --decode-from 9
expect_error ctx_too_small "$BIN" eval --model $M --tokens 1,2,3 --ctx 2
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
