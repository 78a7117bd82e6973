"""Does a vote of sampled branches beat one greedy answer of the same model? majority@N and any-correct@N, N = 1..B.

Why: a reasoning tier earns its decode tokens only if voting over its sampled branches is more accurate than the
same model answering once, greedily (issue 31: on the 0.5B it was not). The sampling settings (temperature,
top_p) are chosen on GSM8K train with this, never on test.

Input
  * `--branches FILE`: `cascade bench branches --methods self_consistency --n B --m B --save-branches FILE` (every
    branch run to completion, with its text: local only, never committed); or `--outcomes ROWS --tier T`: the same
    branches as `benchmarks/reasoning/branch_outcomes.py` writes them (answers, correctness, tokens; no text:
    committable).
  * `--greedy DIR_OR_FILE`: the same questions answered greedily: `cascade bench branches --methods vanilla --out
    DIR` (its requests.jsonl), on the tier of the same model whose worker decodes greedily.

Method (exact, no subsampling noise): for each question with B finished branches and N <= B, every N-subset of its
branches votes (majority of the grader's answer keys; a tie goes to the shortest branch, the runner's rule without
a scorer; an unreadable answer agrees with nothing), and majority@N is the mean over all C(B, N) subsets;
any-correct@N = 1 - C(B-k, N) / C(B, N) with k branches right; per-branch accuracy = k / B. Intervals: bootstrap
over questions (--resamples, seeded); differences to greedy are paired (same resampled questions).

Output: one JSON object (and `--plot PNG`). Usage:
  .venv/bin/python -m benchmarks.reasoning.branch_votes --branches runs/sc_branches.jsonl --greedy runs/greedy [--plot
  p.png]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.reasoning.branch_outcomes import read_saved
from cascade.data.datasets import prompts_of
from cascade.data.grading import answer_key, grade
from cascade.data.outcomes import read_rows
from cascade.repo_paths import recorded_path
from cascade.testing.scripts import print_result


def vote_correct(keys: list[str | None], lengths: list[int], correct: list[bool], subset: tuple[int, ...]) -> bool:
    """Whether the majority of `subset`'s answers is right (ties: the shortest branch among the tied answers)."""
    counts = Counter(keys[i] for i in subset if keys[i] is not None)
    if not counts:
        return correct[min(subset, key=lambda i: lengths[i])]
    top = max(counts.values())
    tied = [i for i in subset if keys[i] is not None and counts[keys[i]] == top]
    return correct[min(tied, key=lambda i: lengths[i])]


def question_curves(keys: list[str | None], lengths: list[int], correct: list[bool], n_max: int
                    ) -> tuple[list[float], list[float]]:
    """majority@N and any-correct@N for N = 1..n_max, exact over all N-subsets of the branches."""
    b, k = len(keys), sum(correct)
    majority, any_correct = [], []
    for n in range(1, n_max + 1):
        subsets = list(itertools.combinations(range(b), n))
        majority.append(sum(vote_correct(keys, lengths, correct, s) for s in subsets) / len(subsets))
        any_correct.append(1.0 - math.comb(b - k, n) / math.comb(b, n))
    return majority, any_correct


def read_greedy(path: Path) -> dict[str, bool]:
    file = path / "requests.jsonl" if path.is_dir() else path
    out: dict[str, bool] = {}
    for line in file.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            if row.get("method", "vanilla") == "vanilla" and row.get("error") is None:
                out[row["id"]] = bool(row["correct"])
    return out


def interval(values: np.ndarray) -> list[float]:
    return [round(float(np.percentile(values, 2.5)), 3), round(float(np.percentile(values, 97.5)), 3)]


Branch = tuple[str | None, int, bool]  # a finished branch's answer key, length and correctness


def from_saved(path: Path) -> dict[str, list[Branch]]:
    """Branches with their text (bench --save-branches): keyed and graded here, lengths in words."""
    saved = read_saved(path)
    prompts = prompts_of(set(saved))
    return {q: [(answer_key(b.text), len(b.text.split()), grade(b.text, prompts[q].reference or ""))
                for b in branches]
            for q, branches in saved.items() if q in prompts}


def from_outcomes(path: Path, tier: str) -> dict[str, list[Branch]]:
    """Branches without text (benchmarks/reasoning/branch_outcomes.py rows, committable): the grader's extracted answer
    as the key (for numeric GSM8K answers the same as the vote's key), lengths in the model's tokens."""
    out: dict[str, list[Branch]] = {}
    for _, row in read_rows(str(path)):
        outcome = row.tiers.get(tier)
        if row.id is not None and outcome is not None and outcome.branches:
            out[row.id] = [(b.answer, b.output_tokens, b.correct) for b in outcome.branches]
    return out


def analyse(by_question: dict[str, list[Branch]], greedy: dict[str, bool], n_branches: int, resamples: int,
            seed: int) -> dict[str, Any]:
    ids = sorted(q for q, b in by_question.items() if len(b) >= n_branches and q in greedy)
    per_branch, majority, any_correct = [], [], []
    for q in ids:
        keys, lengths, correct = (list(column) for column in zip(*by_question[q][:n_branches], strict=True))
        m, a = question_curves(keys, lengths, correct, n_branches)
        per_branch.append(sum(correct) / n_branches)
        majority.append(m)
        any_correct.append(a)
    if not ids:
        raise SystemExit("branch_votes: no question has both its greedy answer and "
                         f"{n_branches} finished branches")
    g = np.array([greedy[q] for q in ids], dtype=float)
    maj, anyc, pb = np.array(majority), np.array(any_correct), np.array(per_branch)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(ids), size=(resamples, len(ids)))
    diff = maj[draws].mean(axis=1) - g[draws].mean(axis=1)[:, None]  # (resamples, N): paired with greedy
    by_n = [{"n": n + 1, "majority": round(float(maj[:, n].mean()), 3),
             "majority_ci": interval(maj[draws, n].mean(axis=1)),
             "any_correct": round(float(anyc[:, n].mean()), 3),
             "any_correct_ci": interval(anyc[draws, n].mean(axis=1)),
             "majority_minus_greedy": round(float(maj[:, n].mean() - g.mean()), 3),
             "majority_minus_greedy_ci": interval(diff[:, n]),
             "p_majority_above_greedy": round(float((diff[:, n] > 0).mean()), 3)}
            for n in range(n_branches)]
    return {"questions": len(ids), "branches_per_question": n_branches, "resamples": resamples, "seed": seed,
            "greedy": round(float(g.mean()), 3), "greedy_ci": interval(g[draws].mean(axis=1)),
            "per_branch": round(float(pb.mean()), 3), "per_branch_ci": interval(pb[draws].mean(axis=1)),
            "by_n": by_n}


def plot(result: dict[str, Any], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = [r["n"] for r in result["by_n"]]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for key, label in (("majority", "majority@N"), ("any_correct", "any-correct@N")):
        ax.plot(ns, [r[key] for r in result["by_n"]], marker="o", label=label)
        ax.fill_between(ns, [r[f"{key}_ci"][0] for r in result["by_n"]], [r[f"{key}_ci"][1] for r in result["by_n"]],
                        alpha=0.15)
    ax.axhline(result["greedy"], color="k", linestyle="--", label=f"greedy {result['greedy']:.2f}")
    ax.axhspan(*result["greedy_ci"], color="k", alpha=0.07)
    ax.axhline(result["per_branch"], color="grey", linestyle=":",
               label=f"one sampled branch {result['per_branch']:.2f}")
    ax.set(xlabel="branches N", ylabel="accuracy", title=title)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--branches", type=Path, help="bench --save-branches JSONL (with text)")
    source.add_argument("--outcomes", type=Path, help="reasoning/branch_outcomes.py rows (no text); with --tier")
    parser.add_argument("--tier", help="with --outcomes: the tier whose branches vote")
    parser.add_argument("--greedy", type=Path, required=True, help="bench --out DIR (or its requests.jsonl), vanilla")
    parser.add_argument("--n", type=int, default=8, help="branches per question B (questions with fewer are skipped)")
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", type=Path, help="write a PNG of the curves")
    parser.add_argument("--title", default="sampled branches vs greedy")
    parser.add_argument("--json-out", help="also write the JSON here")
    args = parser.parse_args()
    try:
        if args.outcomes is not None and not args.tier:
            parser.error("--outcomes needs --tier")
        by_question = from_saved(args.branches) if args.branches else from_outcomes(args.outcomes, args.tier)
        result = analyse(by_question, read_greedy(args.greedy), args.n, args.resamples, args.seed)
        # What it read, as another checkout finds it (branch texts stay outside the repo: a name only).
        result["branches_file" if args.branches else "outcomes_file"] = recorded_path(args.branches or args.outcomes)
        result["greedy_file"] = recorded_path(args.greedy)
    except OSError as exc:
        print(f"branch_votes: {exc}", file=sys.stderr)
        return 2
    if args.plot:
        plot(result, args.plot, args.title)
        result["plot"] = recorded_path(args.plot)
    print_result(result, args.json_out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
