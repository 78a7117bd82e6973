"""Saved reasoning branches -> outcome rows with per-branch results (no text), for the planner's widths. Prints JSON.

`cascade bench branches --methods self_consistency --save-branches FILE` writes every finished branch of every
question with its text (local use only). This keeps what `cascade optimize` needs to plan a tier's width
(cascade/optimizer/widths.py) and nothing a dataset owns: per question (`id`) and branch, in sampling order,
the extracted answer, whether it is right (cascade's grader against the dataset's reference, read in place),
and its length in tokens of the tier's own tokenizer (an embedded model card, `--model`). Each row also carries
the tier's single answer as branch 0's, so one row serves widths (1, 1) to (B, M).

`--with LABELLED.jsonl` keeps only the questions labelled there (`cascade label` rows, same ids) and copies their
other tiers' results into each row, so one file holds a whole ladder; `--difficulty-tier T` also writes each row's
`difficulty`: the out-of-fold p_fail of tier T from the router `cascade router train` fits on all of LABELLED
(`--features`, default the adopted router's lexical,steps; each row predicted by a model that never saw it),
which a route-mode problem.toml needs.

Usage: .venv/bin/python -m benchmarks.reasoning.branch_outcomes SAVED.jsonl --tier qwen2.5-coder-0.5b-reason
       [--model qwen2.5-coder-0.5b] [--with LABELLED.jsonl [--difficulty-tier qwen2.5-coder-0.5b]]
       --out outcomes.jsonl
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import msgspec

from cascade.data.datasets import DatasetError, prompts_of
from cascade.data.grading import extract, grade
from cascade.data.outcomes import BranchOutcome, OutcomeRow, TierOutcome, read_rows, write_row
from cascade.errors import ConfigError
from cascade.repo_paths import recorded_path
from cascade.testing.scripts import fail, print_result


class SavedBranch(msgspec.Struct, kw_only=True):
    id: str
    branch: int
    text: str
    state: str = "finished"
    method: str = "self_consistency"  # rows saved before bench saved adaptive branches too were all this


def read_saved(path: Path) -> dict[str, list[SavedBranch]]:
    """Finished branches per question id, in sampling order."""
    decoder = msgspec.json.Decoder(SavedBranch)
    by_id: dict[str, list[SavedBranch]] = defaultdict(list)
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise DatasetError(f"cannot read {path}: {exc.strerror}") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            saved = decoder.decode(line)
        except msgspec.ValidationError as exc:
            raise DatasetError(f"{path}:{number}: not a saved branch ({exc})") from None
        # Adaptive rows stop at the wave that settled: not every branch of the question, so not a width's sample.
        if saved.state == "finished" and saved.method == "self_consistency":
            by_id[saved.id].append(saved)
    return {i: sorted(b, key=lambda s: s.branch) for i, b in by_id.items()}


def to_rows(saved: dict[str, list[SavedBranch]], tier: str, count_tokens: Callable[[str], int]) -> list[OutcomeRow]:
    """One row per graded question: every branch's answer, correctness and length; branch 0 as the tier's answer."""
    prompts = prompts_of(set(saved))
    rows = []
    for prompt_id, branches in saved.items():
        reference = prompts[prompt_id].reference if prompt_id in prompts else None
        if not reference:
            continue  # no reference answer: nothing to grade against
        results = [BranchOutcome(answer=extract(b.text, reference), correct=grade(b.text, reference),
                                 output_tokens=count_tokens(b.text))
                   for b in branches]
        first = results[0]
        rows.append(OutcomeRow(id=prompt_id, dataset=prompt_id.rpartition(":")[0], tiers={tier: TierOutcome(
            correct=first.correct, answer=first.answer, output_tokens=first.output_tokens, finish_reason="stop",
            branches=results)}))
    return rows


def with_labelled(rows: list[OutcomeRow], tier: str, labelled_path: str, difficulty_tier: str | None,
                  features: str, seed: int) -> tuple[list[OutcomeRow], int]:
    """The rows whose question `labelled_path` also labels, each with that file's other tiers (this tier's result
    replaced by the branches) and, with `difficulty_tier`, the out-of-fold p_fail of that tier as `difficulty`.
    Returns the merged rows (in the branch rows' order) and how many branch rows had no labelled row."""
    labelled = {row.id: row for _, row in read_rows(labelled_path) if row.id is not None}
    difficulty: dict[str, float] = {}
    if difficulty_tier is not None:
        from cascade.router.outcomes import load_outcomes
        from cascade.router.train.pipeline import TrainOptions, out_of_fold_p_fail

        outcomes = load_outcomes(labelled_path, [difficulty_tier])
        options = TrainOptions(features=tuple(f for f in features.split(",") if f), seed=seed)
        difficulty = dict(zip(outcomes.ids, out_of_fold_p_fail(outcomes, options)[:, 0].tolist(), strict=True))
    merged = []
    for row in rows:
        other = labelled.get(row.id or "")
        if other is None:
            continue
        merged.append(msgspec.structs.replace(
            row, tiers={**other.tiers, tier: row.tiers[tier]},
            difficulty=round(difficulty[row.id or ""], 4) if difficulty else None))
    return merged, len(rows) - len(merged)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("saved", help="JSONL from cascade bench branches --save-branches")
    parser.add_argument("--tier", required=True, help="the tier name the rows are written under")
    parser.add_argument("--model", default="qwen2.5-coder-0.5b", help="embedded model card whose tokenizer counts")
    parser.add_argument("--with", dest="labelled", help="labelled outcomes (cascade label) of the same questions: "
                        "keep only those questions and copy their other tiers into each row")
    parser.add_argument("--difficulty-tier", help="with --with: write each row's difficulty, the out-of-fold "
                        "p_fail of this tier from a router fitted on the labelled rows")
    parser.add_argument("--features", default="lexical,steps", help="the router's feature blocks (--difficulty-tier)")
    parser.add_argument("--seed", type=int, default=0, help="the router's folds and fit (--difficulty-tier)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--json-out", help="also write the JSON here")
    args = parser.parse_args(argv)
    if args.difficulty_tier and not args.labelled:
        return fail("--difficulty-tier needs --with LABELLED.jsonl (the router is fitted on its rows)")
    try:
        saved = read_saved(Path(args.saved))
        if not saved:
            return fail(f"{args.saved} holds no finished branches")
        from transformers import AutoTokenizer

        from cascade.engines.models import load_card, prepare

        tokenizer = AutoTokenizer.from_pretrained(prepare(load_card(args.model)))
        rows = to_rows(saved, args.tier, lambda text: len(tokenizer(text)["input_ids"]))
        unlabelled = 0
        if args.labelled:
            rows, unlabelled = with_labelled(rows, args.tier, args.labelled, args.difficulty_tier, args.features,
                                             args.seed)
    except (ConfigError, DatasetError) as exc:
        return fail(str(exc))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("wb") as sink:
        for row in rows:
            write_row(sink, row)
    counts = [len(r.tiers[args.tier].branches or []) for r in rows]
    print_result({"rows": len(rows), "branches_min": min(counts, default=0), "branches_max": max(counts, default=0),
                  **({"unlabelled_dropped": unlabelled} if args.labelled else {}), "out": recorded_path(out)},
                 args.json_out, indent=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
