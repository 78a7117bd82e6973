"""Does the served vote beat greedy? The paired difference pooled over questions left out of a selection.

Issue 51 item 3: the reasoning tier's method (adaptive self-consistency) against the same model answering greedily,
pooled across sets of questions outside a selection (GSM8K test; training questions outside the ones a setting
was chosen on), until the paired 95% interval excludes zero, or its upper bound is below +0.03 (then a vote does
not pay on this model). Each set pairs a file of the method's outcomes with a file of greedy's on the
same questions; a question in `--exclude` (the questions a setting was chosen on) is left out of every set.

Files: `cascade bench` records (requests.jsonl: id, correct; the last record of an id counts, as a resumed run
appends) or `cascade label` outcome rows (id, tiers.T.correct). Sets are `NAME=METHOD_FILE[:TIER],GREEDY_FILE[:TIER]`.

    T=models/outcomes/qwen15-test-bench R=models/outcomes
    .venv/bin/python -m benchmarks.reasoning.vote_vs_greedy \
      --set test=$T/adaptive/requests.jsonl,$T/vanilla/requests.jsonl \
      --set train=$R/gsm8k-train-embedded-reason-adaptive.jsonl:qwen2.5-coder-1.5b-reason,$R/qwen15-train-label/\
qwen15-greedy.jsonl:qwen2.5-coder-1.5b \
      --set test-s1=$T/sc-s1/adaptive-rows.jsonl:qwen2.5-coder-1.5b-reason,$T/vanilla/requests.jsonl \
      --exclude $R/qwen15-train-bench/sc-t07/branches.jsonl

(benchmarks/results/vote_vs_greedy_qwen15.json.) That leaves out the 100 questions the cross-validation chose on,
not all that a choice saw: the test questions were in view when the tier kept m = 8, and 67 more training questions
were in the replay that first chose adaptive; `--exclude $R/qwen15-train-bench/adaptive-replay-ids.jsonl` (the
first 167 of the seed-0 order, standing for that replay's ids) added leaves the 217 training questions no choice saw
(benchmarks/results/vote_vs_greedy_qwen15_untouched.json; issue 60 item 6).

A question in several sets (the same questions sampled again with another `--sampling-seed`, each run a set)
counts once in the pool, at its mean over those sets for the method and for greedy: the bootstrap resamples
questions, not samples, and the discordant counts are the questions where one side's mean is higher (McNemar's
test becomes the sign test on them).

Prints JSON: per set and pooled, the questions, both accuracies, the paired difference with its bootstrap 95%
interval (seeded), the discordant counts (McNemar's b and c, with the exact two-sided p), and the verdict.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from cascade.bench.out_of_fold import paired_difference
from cascade.repo_paths import recorded_path
from cascade.testing.scripts import print_result

BOUND = 0.03  # below this upper bound, a vote "does not pay" (issue 51)


def rows_with_ids(path: str) -> Iterator[dict[str, Any]]:
    """The JSON objects with an `id` in a JSONL file, in file order (a line cut by an interrupted run skipped)."""
    with Path(path).open() as lines:
        for line in lines:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and "id" in row:
                yield row


def read_correct(spec: str) -> dict[str, bool]:
    """id -> correct from a bench requests.jsonl or (with `:TIER`) a label outcomes file."""
    path, _, tier = spec.partition(":")
    out: dict[str, bool] = {}
    for row in rows_with_ids(path):
        if tier:
            outcome = (row.get("tiers") or {}).get(tier)
            if outcome is not None and not outcome.get("error"):
                out[row["id"]] = bool(outcome["correct"])
        elif "correct" in row:
            out[row["id"]] = bool(row["correct"])
    return out


def excluded_ids(paths: list[str]) -> set[str]:
    return {str(row["id"]) for path in paths for row in rows_with_ids(path)}


def mcnemar_p(b: int, c: int) -> float:
    """Exact two-sided McNemar p (binomial on the discordant pairs)."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired(method: np.ndarray, greedy: np.ndarray, resamples: int, seed: int) -> dict[str, Any]:
    d = paired_difference(method, greedy, resamples, seed)
    (low, high), b, c = d["ci95"], d["wins"], d["losses"]
    verdict = ("the vote beats greedy" if low > 0 else "greedy beats the vote" if high < 0
               else f"a vote does not pay (upper bound below +{BOUND})" if high < BOUND else "not settled")
    return {"questions": len(method), "method_accuracy": round(float(method.mean()), 4),
            "greedy_accuracy": round(float(greedy.mean()), 4),
            "difference": d["difference"], "ci95": d["ci95"],
            "method_only_right": b, "greedy_only_right": c, "mcnemar_p": float(f"{mcnemar_p(b, c):.3g}"),
            "verdict": verdict}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--set", action="append", required=True, metavar="NAME=METHOD[:TIER],GREEDY[:TIER]")
    p.add_argument("--exclude", action="append", default=[], help="files whose ids were used for selection")
    p.add_argument("--resamples", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json-out", type=Path)
    args = p.parse_args()
    excluded = excluded_ids(args.exclude)
    sets: dict[str, Any] = {}
    pooled: dict[str, list[tuple[float, float]]] = {}  # question -> (method, greedy) per set holding it
    for spec in args.set:
        name, _, files = spec.partition("=")
        method_spec, _, greedy_spec = files.partition(",")
        if not (name and method_spec and greedy_spec):
            p.error(f"--set {spec!r}: expected NAME=METHOD_FILE[:TIER],GREEDY_FILE[:TIER]")
        method, greedy = read_correct(method_spec), read_correct(greedy_spec)
        ids = sorted((set(method) & set(greedy)) - excluded)
        if not ids:
            p.error(f"--set {name}: no question in both files outside --exclude")
        m = np.array([float(method[i]) for i in ids])
        g = np.array([float(greedy[i]) for i in ids])
        for i, q in enumerate(ids):
            pooled.setdefault(q, []).append((m[i], g[i]))
        sets[name] = {"method": recorded_path(method_spec.partition(":")[0]),
                      "greedy": recorded_path(greedy_spec.partition(":")[0]),
                      "excluded": len((set(method) & set(greedy)) & excluded),
                      **paired(m, g, args.resamples, args.seed)}
    means = np.array([np.mean(pairs, axis=0) for _, pairs in sorted(pooled.items())])
    result = {"sets": sets, "pooled": {**paired(means[:, 0], means[:, 1], args.resamples, args.seed),
                                       "samples": sum(len(pairs) for pairs in pooled.values()),
                                       "questions_in_several_sets": sum(len(pairs) > 1 for pairs in pooled.values())},
              "bound": BOUND, "exclude": [recorded_path(x) for x in args.exclude]}
    print_result(result, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
