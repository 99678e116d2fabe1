# glm53 convert / info / quality / eval on a converted model, end to end
# through the CLI: exit codes, one-line errors, corruption detection.
# Uses the small transformers-made oracle checkpoint (BF16 release names).
set -euo pipefail
BIN=$1
SRC=tests/data/oracle/m5_kpool4_release
[ -f "$SRC/model.safetensors" ] || { echo "SKIP: $SRC missing"; exit 0; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
export OMP_NUM_THREADS=1 GLM53_LOG=error

"$BIN" convert --in "$SRC" --out "$T/q4" --bits 4 --verify --quiet || fail "convert q4"
[ -f "$T/q4/model.g53" ] || fail "no model.g53"
ls "$T/q4" | grep -q '\.tmp' && fail "temp file left behind"
"$BIN" convert --in "$SRC" --out "$T/q8" --bits 8 --group 64 --keep-bf16 'layers.0.*' --quiet || fail "convert q8"

"$BIN" info "$T/q4" > "$T/info.txt" || fail "info"
grep -q '^tensors: ' "$T/info.txt" || fail "info: no tensor count"
grep -q '^format q4 ' "$T/info.txt" || fail "info: no q4 line"
"$BIN" info "$T/q4" --verify --ctx 1000 > /dev/null 2>&1 || fail "info --verify"
"$BIN" info "$T/q8" >"$T/info8.txt" # to a file: `| grep -q` under pipefail can read as a miss (SIGPIPE)
grep -q '"keep_bf16":"layers.0.\*"' "$T/info8.txt" || fail "keep-bf16 not recorded"

# eval through the converted model: one row of logits per token
"$BIN" eval --model "$T/q4" --tokens 1,2,3,4,5 --dump-logits "$T/l.f32" || fail "eval q4"
V=$(python3 -c "import json;c=json.load(open('$SRC/config.json'));print(c.get('text_config',c)['vocab_size'])")
[ "$(stat -c %s "$T/l.f32")" -eq $((5 * V * 4)) ] || fail "eval: wrong logits size"

# quality with a token file, against the HF checkpoint
echo "1 2 3 4 5 6 7 8 9 10 11 12" > "$T/ids.txt"
"$BIN" quality --model "$T/q8" --ref "$SRC" --tokens-file "$T/ids.txt" --ctx 8 --json > "$T/q.json" || fail "quality"
grep -q '"top1_agreement"' "$T/q.json" || fail "quality json: $(cat "$T/q.json")"

# corruption: truncated file -> clear one-line error, non-zero exit
cp -r "$T/q4" "$T/trunc"
truncate -s -1000 "$T/trunc/model.g53"
if "$BIN" eval --model "$T/trunc" --tokens 1,2 2> "$T/err.txt"; then fail "truncated file loaded"; fi
grep -q 'truncated' "$T/err.txt" || fail "truncated: $(cat "$T/err.txt")"
[ "$(wc -l < "$T/err.txt")" -eq 1 ] || fail "truncated: not one line: $(cat "$T/err.txt")"

# flipped byte inside tensor data -> found by --verify
cp -r "$T/q4" "$T/flip"
printf '\xff' | dd of="$T/flip/model.g53" bs=1 seek=200 conv=notrunc status=none
if "$BIN" info "$T/flip" --verify > /dev/null 2> "$T/err.txt"; then fail "flipped byte not detected"; fi
grep -q 'checksum mismatch' "$T/err.txt" || fail "flip: $(cat "$T/err.txt")"
if GLM53_VERIFY=1 "$BIN" eval --model "$T/flip" --tokens 1 2> "$T/err.txt" > /dev/null; then fail "GLM53_VERIFY load passed"; fi

# bad options
if "$BIN" convert --in "$SRC" --out "$T/bad" --bits 5 2> "$T/err.txt"; then fail "--bits 5 accepted"; fi
grep -q -- '--bits' "$T/err.txt" || fail "bad bits message"
if "$BIN" convert --in "$T/nonexistent" --out "$T/bad2" --quiet 2> "$T/err.txt"; then fail "missing input accepted"; fi
[ ! -e "$T/bad2/model.g53" ] || fail "output written for a bad input"
echo "convert CLI: all checks passed"
