"""Outcome files of one dataset's rows, labelled tier by tier in separate runs -> one file with every tier. Prints JSON.

`cascade label --tiers T` runs one tier at a time (each run resumable, at its own concurrency); the router and the
planner read one row per prompt with all tiers. This joins the rows by `id`: `--take FILE:TIER,TIER` takes those
tiers from FILE (all of its tiers without `:...`); a row is written only if every taken tier has an answer for its
id, in the order of the first file's rows. The committed ladders' outcome files (models/outcomes/*.md) name the
command that made them.

Usage: .venv/bin/python -m benchmarks.router.merge_outcomes --take v6.jsonl:smollm2-135m,qwen2.5-coder-0.5b \
           --take qwen15.jsonl --take reason.jsonl --out v7.jsonl
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cascade.data.outcomes import OutcomeRow, TierOutcome, read_rows, write_row
from cascade.errors import CascadeError
from cascade.repo_paths import recorded_path
from cascade.testing.scripts import fail, print_result


def parse_take(spec: str) -> tuple[Path, list[str] | None]:
    path, sep, tiers = spec.partition(":")
    return Path(path), ([t for t in tiers.split(",") if t] if sep else None)


def merge(takes: list[tuple[Path, list[str] | None]]) -> tuple[list[OutcomeRow], list[str]]:
    """Rows with every taken tier (in the first file's order), and the tiers in the order taken."""
    order: list[OutcomeRow] = []
    tiers: list[str] = []
    columns: dict[str, dict[str, TierOutcome]] = {}
    for index, (path, wanted) in enumerate(takes):
        rows = [row for _, row in read_rows(path)]
        if index == 0:
            order = rows
        names = wanted if wanted is not None else sorted({t for r in rows for t in r.tiers})
        for name in names:
            if name in tiers:
                raise ValueError(f"tier {name!r} is taken twice")
            if not any(name in r.tiers for r in rows):
                raise ValueError(f"{path}: no row has tier {name!r}")
            tiers.append(name)
        for row in rows:
            if row.id is None:
                raise ValueError(f"{path}: a row without an id cannot be joined")
            for name in names:
                if name in row.tiers and row.tiers[name].error is None:
                    columns.setdefault(row.id, {})[name] = row.tiers[name]
    merged = [OutcomeRow(id=r.id, dataset=r.dataset, tiers={t: columns[r.id][t] for t in tiers})
              for r in order if r.id is not None and all(t in columns.get(r.id, {}) for t in tiers)]
    return merged, tiers


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--take", action="append", required=True, metavar="FILE[:TIER,...]",
                   help="an outcomes JSONL and the tiers to take from it (default: all of its tiers)")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--json-out", help="also write the JSON here")
    args = p.parse_args()
    try:
        rows, tiers = merge([parse_take(s) for s in args.take])
    except (CascadeError, OSError, ValueError) as exc:
        return fail(str(exc), "merge_outcomes.py")
    with args.out.open("wb") as out:
        for row in rows:
            write_row(out, row)
    accuracy = {t: round(sum(bool(r.tiers[t].correct) for r in rows) / len(rows), 3) if rows else None for t in tiers}
    result = {"rows": len(rows), "tiers": tiers, "accuracy": accuracy, "out": recorded_path(args.out)}
    print_result(result, args.json_out, indent=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
