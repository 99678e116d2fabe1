#!/usr/bin/env bash
# Tokenizer conformance against Hugging Face's JS tokenizer: node writes the
# reference ids for the corpus in tests/data/tokenizer/ (4 real tokenizer.json
# files), then the C checker built next to glm53 compares every id.
# Usage: bash tests/integration/test_tokenizer_conformance.sh /path/to/glm53
set -euo pipefail
BIN=${1:?usage: $0 /path/to/glm53}
CHECK="$(dirname "$BIN")/test_tokenizer_conformance"
if ! command -v node >/dev/null || [ ! -d tests/node/node_modules/@huggingface/tokenizers ]; then
  echo "SKIP: node or tests/node/node_modules missing (npm install in tests/node)"
  exit 0
fi
[ -x "$CHECK" ] || { echo "FAIL: checker $CHECK not built"; exit 1; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
node tests/node/tok_reference.mjs tests/data/tokenizer "$TMP/ref.json"
[ -s "$TMP/ref.json" ] || { echo "FAIL: no reference file"; exit 1; }
GLM53_TOK_REF="$TMP/ref.json" "$CHECK"
