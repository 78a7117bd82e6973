#!/usr/bin/env bash
# Install torch 2.13.0's CPU build into a virtualenv before anything that depends on torch (scripts/bootstrap.sh).
#
# Why: on a Linux x86-64 machine the `torch==2.13.0` wheel of the default package index is the CUDA build, which
# pulls a dozen nvidia-* packages (several GB) that a CPU machine never uses. The CPU build carries the local
# version label `+cpu` and lives on PyTorch's own CPU wheel index (or a mirror or wheel folder of it).
#
# In order:
#   1. torch 2.13.0 already installed: nothing to do (a CUDA build is left alone, with a warning).
#   2. `torch==2.13.0+cpu` from the package indexes pip is configured with, plus CASCADE_TORCH_INDEX_URL if set
#      (PyTorch's CPU wheel index: the URL pytorch.org's install selector gives for "Linux, Pip, CPU").
#   3. Where no `+cpu` build can be had: plain `torch==2.13.0` if pip would install no CUDA package with it
#      (macOS, Linux on ARM: the default index's wheel is the CPU build there), found by a dry run.
#   4. Otherwise one clear message saying how to get the CPU build, and exit 2; CASCADE_ALLOW_CUDA_TORCH=1 takes the
#      CUDA build instead.
#   usage: scripts/install_torch.sh VENV
set -euo pipefail

VENV="${1:?usage: scripts/install_torch.sh VENV}"
VERSION=2.13.0
pip=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
extra=()
[ -n "${CASCADE_TORCH_INDEX_URL:-}" ] && extra=(--extra-index-url "$CASCADE_TORCH_INDEX_URL")

installed=$("$VENV/bin/python" -c 'import torch; print(torch.__version__, torch.version.cuda or "")' 2>/dev/null || true)
if [ "${installed%%+*}" = "$VERSION" ] || [ "${installed%% *}" = "$VERSION" ]; then
    case "$installed" in
        *" "?*) echo "install_torch: torch $installed is a CUDA build (kept; it runs on the CPU too)" >&2 ;;
    esac
    exit 0
fi

echo "install_torch: installing torch==$VERSION (CPU build)"
if "${pip[@]}" install "${extra[@]}" "torch==$VERSION+cpu" 2>/dev/null; then
    exit 0
fi

# No `+cpu` build on the configured indexes: see what plain torch==VERSION would bring.
report=$(mktemp)
trap 'rm -f "$report"' EXIT
if ! "${pip[@]}" install "${extra[@]}" --dry-run --ignore-installed --report "$report" "torch==$VERSION" >/dev/null; then
    echo "install_torch: pip cannot find torch==$VERSION on its package indexes (see pip's error above)" >&2
    exit 2
fi
cuda=$("$VENV/bin/python" - "$report" <<'PY'
import json, sys
with open(sys.argv[1]) as f:
    report = json.load(f)
names = [item["metadata"]["name"] + "==" + item["metadata"]["version"] for item in report.get("install", [])]
cuda = [n for n in names if n.lower().startswith(("nvidia-", "nvidia_", "cuda-", "triton"))
        or (n.lower().startswith("torch==") and "+cu" in n)]
print(" ".join(cuda))
PY
)
if [ -z "$cuda" ]; then
    "${pip[@]}" install "${extra[@]}" "torch==$VERSION"
    exit 0
fi
if [ "${CASCADE_ALLOW_CUDA_TORCH:-0}" = 1 ]; then
    echo "install_torch: CASCADE_ALLOW_CUDA_TORCH=1: installing the CUDA build of torch==$VERSION" >&2
    "${pip[@]}" install "${extra[@]}" "torch==$VERSION"
    exit 0
fi
n=$(wc -w <<< "$cuda")
echo "install_torch: only a CUDA build of torch==$VERSION is on your package indexes (it would add $n CUDA" \
     "packages, several GB, that a CPU never uses). Point CASCADE_TORCH_INDEX_URL at PyTorch's CPU wheel index (the" \
     "URL pytorch.org's install selector gives for Linux, Pip, CPU) and rerun, or set CASCADE_ALLOW_CUDA_TORCH=1 to" \
     "take the CUDA build." >&2
exit 2
