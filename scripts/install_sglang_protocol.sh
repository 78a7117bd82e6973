#!/usr/bin/env bash
# Install the pinned SGLang wheel (tests/fixtures/sglang/sglang-pin.txt) WITHOUT its dependencies into
# $VENV/sglang-protocol, where the contract tests (tests/contract/) load its OpenAI protocol models from.
# Never with dependencies: they replace the CPU torch with a multi-GB CUDA build (its wheel pins a CUDA torch). Not in
# site-packages either, so `import sglang` still fails in the venv and `cascade deploy` still says so.
# Idempotent: skipped when the directory already holds the pinned version.
#   usage: scripts/install_sglang_protocol.sh   (CASCADE_VENV picks the venv, default .venv)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${CASCADE_VENV:-.venv}"
pin_file=tests/fixtures/sglang/sglang-pin.txt
pin=$(grep -v '^\s*#' "$pin_file" | grep -m1 'sglang==' | tr -d '[:space:]')
target="$VENV/sglang-protocol"

if [ -f "$target/.pin" ] && [ "$(cat "$target/.pin")" = "$pin" ]; then
    exit 0
fi
echo "bootstrap: installing $pin --no-deps into $target (SGLang's protocol models, for the contract tests)"
rm -rf "$target"
"$VENV/bin/python" -m pip --disable-pip-version-check -q install --no-deps --no-compile --target "$target" "$pin"
echo "$pin" > "$target/.pin"
