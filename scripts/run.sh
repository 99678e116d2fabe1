#!/usr/bin/env bash
# The main job: installs dependencies, builds glm53, and generates text with
# the embedded default model (models/tiny). Extra arguments go to `glm53 run`.
#   ./scripts/run.sh                      # default prompt
#   ./scripts/run.sh -p "Once upon a time" --max-tokens 64
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target glm53 >/dev/null
if [ $# -eq 0 ]; then set -- -p "The Python interpreter is" --max-tokens 64; fi
exec ./build/glm53 run "$@"
