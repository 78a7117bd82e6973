"""What benchmark scripts share: `fail`, a script's one-line error exit; `print_result` / `write_result`, its JSON on
stdout and in its --json-out file; `word_problems`, synthetic prompts."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np


def fail(message: str, prog: str | None = None) -> int:
    """Print `prog: message` to stderr (default prog: the running module, `benchmarks.router.quality` when run as
    `python -m benchmarks.router.quality`, else the script's name) and return exit status 2."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    print(f"{prog or (spec.name if spec is not None else Path(sys.argv[0]).stem)}: {message}", file=sys.stderr)
    return 2


def write_result(path: str | Path, text: str) -> None:
    """Write a script's JSON result to `path` (its --json-out), creating missing folders: a result that took an
    hour is not lost to a typo'd folder. An unwritable path exits 2 with one line (the result was printed)."""
    out = Path(path)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text.rstrip("\n") + "\n")
    except OSError as e:
        raise SystemExit(fail(f"cannot write --json-out {out}: {e.strerror or e}")) from None


def print_result(result: Any, json_out: str | Path | None, indent: int | None = 1) -> None:
    """Print a script's JSON result, and write it to `json_out` too when one is given (`indent` None: one line)."""
    text = json.dumps(result, indent=indent)
    print(text)
    if json_out:
        write_result(json_out, text)


def word_problems(n: int, seed: int = 0) -> list[str]:
    """`n` short synthetic word problems (1-6 sentences), made from `seed`: prompts the router reads like GSM8K's,
    with no dataset text in the repo."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        k = int(rng.integers(1, 7))
        out.append(". ".join(f"Sam buys {int(rng.integers(2, 99))} apples for ${int(rng.integers(1, 9))} each"
                             for _ in range(k)) + ". How much money does he spend in total?")
    return out
