#!/usr/bin/env bash
# The native GLM-5.3 chat renderer against @huggingface/jinja rendering the
# official template: node renders ~30 varied conversations, the C checker
# built next to glm53 compares byte for byte.
# Usage: bash tests/integration/test_chat_template.sh /path/to/glm53
set -euo pipefail
BIN=${1:?usage: $0 /path/to/glm53}
CHECK="$(dirname "$BIN")/test_chat_conformance"
if ! command -v node >/dev/null || [ ! -d tests/node/node_modules/@huggingface/jinja ]; then
  echo "SKIP: node or tests/node/node_modules missing (npm install in tests/node)"
  exit 0
fi
[ -x "$CHECK" ] || { echo "FAIL: checker $CHECK not built"; exit 1; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
node tests/node/chat_reference.mjs "$TMP/chat_ref.json"
[ -s "$TMP/chat_ref.json" ] || { echo "FAIL: no reference file"; exit 1; }
GLM53_CHAT_REF="$TMP/chat_ref.json" "$CHECK"
