"""Does the CPU scorer predict a branch's final correctness from its first half? (issue 6, target AUC >= 0.70)

Input: finished branches with their graded correctness, as written by
  cascade bench branches --dataset gsm8k-train --methods self_consistency --save-branches FILE
(real branches of the embedded reasoning tier; FILE stays local: model outputs on dataset questions).

Method
  * Each branch is cut at 50% of its length (words), the partial trace split into reasoning steps
    (paragraphs) with the last, possibly unfinished, step dropped: what the runner scores mid-flight.
  * The scorer sees the question too (read in place from the shared GSM8K files by the row's id).
  * `default_auc_all_rows`: AUC of the scorer's default weights over every row: the held-out number
    when the file comes from questions the defaults were not fitted on (e.g. the GSM8K test split).
  * Questions are split in two halves by seeded permutations of question ids (branches of one
    question never straddle a split); over --seeds splits, mean and min AUC on the test half of the
    default weights and of weights refitted on the train half.
  * `fitted_weights_all_rows`: weights fitted on every row, in the scorer's units (how the defaults
    in cascade/branches/cpu_scorer.py were made); single-feature AUCs.
  * Also the AUC at 100% of the length (the finished branch: SART's alpha-prime score).

Output: one JSON object. Usage:
  .venv/bin/python -m benchmarks.reasoning.branch_scorer --branches FILE [--fraction 0.5] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from cascade.branches.cpu_scorer import FEATURE_NAMES, ScorerWeights, features, score_features
from cascade.branches.scoring import split_steps
from cascade.data.datasets import prompts_by_id
from cascade.testing.scripts import print_result


def partial_steps(text: str, fraction: float) -> list[str]:
    words = text.split(" ")
    cut = " ".join(words[: max(1, int(len(words) * fraction))])
    steps = split_steps(cut)
    return steps[:-1] if fraction < 1 and len(steps) > 1 else steps


def auc(y: np.ndarray, s: np.ndarray) -> float | None:
    return None if len(set(y.tolist())) < 2 else round(float(roc_auc_score(y, s)), 4)


def fit(X: np.ndarray, y: np.ndarray) -> LogisticRegression:
    # Strong regularisation: a few hundred branches from a few dozen questions.
    return LogisticRegression(C=0.3, max_iter=1000).fit(X, y)


def main() -> None:
    p = argparse.ArgumentParser(description="AUC of the CPU branch scorer on saved, graded branches")
    p.add_argument("--branches", required=True, help="JSONL from cascade bench branches --save-branches")
    p.add_argument("--fraction", type=float, default=0.5, help="score each branch at this share of its words")
    p.add_argument("--seeds", type=int, default=10, help="question splits (train/test halves) to average over")
    p.add_argument("--json-out")
    args = p.parse_args()
    rows = [json.loads(line) for line in Path(args.branches).read_text().splitlines() if line.strip()]
    ids = sorted({r["id"] for r in rows})
    question = prompts_by_id(set(ids))
    y = np.array([bool(r["correct"]) for r in rows])
    result: dict = {"branches": len(rows), "questions": len(ids), "correct_rate": round(float(y.mean()), 4),
                    "fraction": args.fraction, "features": list(FEATURE_NAMES)}
    for fraction, key in ((args.fraction, "partial"), (1.0, "finished")):
        feats = [features(partial_steps(r["text"], fraction), question.get(r["id"], "")) for r in rows]
        X = np.array([f.vector() for f in feats])
        default = np.array([score_features(f, ScorerWeights()) for f in feats])
        # On a file the default weights were not fitted on, this is the held-out number.
        block: dict = {"default_auc_all_rows": auc(y, default)}
        split_default, split_fitted = [], []
        for seed in range(args.seeds):
            perm = np.random.default_rng(seed).permutation(len(ids))
            test_ids = {ids[i] for i in perm[: len(ids) // 2]}
            test = np.array([r["id"] in test_ids for r in rows])
            if len(set(y[test].tolist())) < 2 or len(set(y[~test].tolist())) < 2:
                continue
            mu, sd = X[~test].mean(0), X[~test].std(0) + 1e-9
            model = fit((X[~test] - mu) / sd, y[~test])
            split_fitted.append(roc_auc_score(y[test], model.decision_function((X[test] - mu) / sd)))
            split_default.append(roc_auc_score(y[test], default[test]))
        block["default_auc_test_halves"] = _spread(split_default)
        block["fitted_auc_test_halves"] = _spread(split_fitted)
        # Weights fitted on every row, in the scorer's own units (what ScorerWeights' defaults come from).
        mu, sd = X.mean(0), X.std(0) + 1e-9
        model = fit((X - mu) / sd, y)
        coef = model.coef_[0] / sd
        block["fitted_weights_all_rows"] = {"bias": round(float(model.intercept_[0] - (coef * mu).sum()), 3),
                                            **{n: round(float(c), 3) for n, c in zip(FEATURE_NAMES, coef, strict=True)}}
        block["single_feature_auc_all_rows"] = {n: auc(y, X[:, j]) for j, n in enumerate(FEATURE_NAMES)}
        result[key] = block
    print_result(result, args.json_out, indent=2)


def _spread(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"splits": 0, "mean": None, "min": None}
    return {"splits": len(values), "mean": round(float(np.mean(values)), 4), "min": round(float(np.min(values)), 4)}


if __name__ == "__main__":
    main()
