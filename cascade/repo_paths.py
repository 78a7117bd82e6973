"""Paths as results, router cards and profiles record them: relative to the repo, never one machine's.

A committed artifact that names `/work/runs31/b.jsonl` or `/root/.cache/...` tells another checkout nothing it can
open (issue 51 item 6). So whatever writes a path into a result, a card or a profile records it with
`recorded_path`:

* a file inside the repo: relative to the repo root, `models/outcomes/qwen15-train-bench/sc-t07/branches.jsonl`
  (what `benchmarks/` and `cascade` commands run from the root read back as is);
* a file under the shared data folder (`cascade.data.datasets.shared_data_dir`, which sits beside the repo):
  `../shared/data/gsm8k/train.jsonl`;
* anything else: its file name and `OUTSIDE`, which says that the file is not in the repo (a scratch output, a
  local cache, branch texts kept off the repo), so no reader takes it for a path it can open.

`recorded_value` does the same to a value that may be a path or a name (a `--dataset`, a served model id, an
argparse namespace's values): paths are recorded, names pass unchanged; `recorded_values` to every leaf of a tree.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

from cascade.data.datasets import shared_data_dir

T = TypeVar("T")

# The repo root: the folder above this package, when it is a checkout (an installed package has no repo).
_ROOT = Path(__file__).resolve().parents[1]
REPO_ROOT: Path | None = _ROOT if (_ROOT / "pyproject.toml").is_file() else None
SHARED_DATA = "../shared/data"  # how the shared data folder is named from the repo root
OUTSIDE = " (not in the repo)"


def recorded_path(path: str | os.PathLike[str]) -> str:
    """`path` as an artifact records it: repo-relative, `../shared/data/...`, or its file name + `OUTSIDE`.
    A relative `path` is taken from the working directory; separators are always `/`."""
    given = Path(os.path.abspath(path))  # links not followed first: a link inside the repo is recorded there
    bases = [(root, "") for root in _both(REPO_ROOT)]
    bases += [(root, SHARED_DATA) for root in _both(shared_data_dir())]
    for candidate in dict.fromkeys((given, given.resolve())):
        for root, prefix in bases:
            if candidate.is_relative_to(root):
                inner = candidate.relative_to(root).as_posix()  # "." for the root itself
                return str(PurePosixPath(prefix, inner)) if prefix else inner
    return given.name + OUTSIDE


def recorded_value(value: T) -> T | str:
    """`recorded_path(value)` for a path: a `PathLike`, or a string that is absolute or names an existing file
    through a folder (`runs/x.json`); any other value (a name such as `gsm8k`, a URL, a number) unchanged."""
    if isinstance(value, os.PathLike):
        return recorded_path(value)
    if isinstance(value, str) and value and "://" not in value and (
            os.path.isabs(value) or ("/" in value and os.path.exists(value))):
        return recorded_path(value)
    return value


def recorded_values(tree: Any) -> Any:
    """`recorded_value` of every leaf of a JSON-like tree (dicts, lists, tuples; a tuple becomes a list): for a
    result's `config` built from `vars(args)`, or a worker's command line."""
    if isinstance(tree, dict):
        return {key: recorded_values(value) for key, value in tree.items()}
    if isinstance(tree, list | tuple):
        return [recorded_values(value) for value in tree]
    return recorded_value(tree)


def _both(root: Path | None) -> list[Path]:
    """The folder as written and with its links resolved (either may be how a path under it is spelt)."""
    if root is None:
        return []
    absolute = Path(os.path.abspath(root))
    return list(dict.fromkeys((absolute, absolute.resolve())))
