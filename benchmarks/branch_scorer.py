"""Does the CPU scorer predict a branch's final correctness from its first half? (issue 6, target AUC >= 0.70)

Input: finished branches with their graded correctness, as written by
  cascade bench branches --dataset gsm8k-train --methods self_consistency --save-branches FILE
(real branches of the embedded reasoning tier; FILE stays local: model outputs on dataset questions).

Method
  * Each branch is cut at 50% of its length (words), the partial trace split into reasoning steps
    (paragraphs) with the last, possibly unfinished, step dropped: what the runner scores mid-flight.
  * Questions are split in two halves by a seeded permutation of question ids (branches of one
    question never straddle the split). AUC of the score for "branch ends correct" on the test half:
      - `default`: the scorer's hand-set weights (cascade/branches/cpu_scorer.py);
      - `fitted`: logistic regression on the scorer's features, fitted on the train half;
      - each single feature alone (sign chosen on the train half), and a length-only baseline.
  * Also the AUC at 100% of the length (the finished branch: SART's alpha-prime score).

Output: one JSON object. Usage:
  .venv/bin/python benchmarks/branch_scorer.py --branches FILE [--fraction 0.5] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from cascade.branches.cpu_scorer import Features, ScorerWeights, features, score_features
from cascade.branches.scoring import split_steps

FEATURES = ("wrong_claims", "right_claims", "repeated_steps", "repeated_lines", "log_words")


def partial_steps(text: str, fraction: float) -> list[str]:
    words = text.split(" ")
    cut = " ".join(words[: max(1, int(len(words) * fraction))])
    steps = split_steps(cut)
    return steps[:-1] if fraction < 1 and len(steps) > 1 else steps


def vector(f: Features) -> list[float]:
    return [f.wrong_claims, min(f.right_claims, 4), f.repeated_steps, f.repeated_lines, math.log1p(f.words / 100)]


def auc(y: np.ndarray, s: np.ndarray) -> float | None:
    return None if len(set(y.tolist())) < 2 else round(float(roc_auc_score(y, s)), 4)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--branches", required=True)
    p.add_argument("--fraction", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json-out")
    args = p.parse_args()
    rows = [json.loads(line) for line in Path(args.branches).read_text().splitlines() if line.strip()]
    ids = sorted({r["id"] for r in rows})
    perm = np.random.default_rng(args.seed).permutation(len(ids))
    test_ids = {ids[i] for i in perm[: len(ids) // 2]}
    y = np.array([bool(r["correct"]) for r in rows])
    test = np.array([r["id"] in test_ids for r in rows])
    result: dict = {"branches": len(rows), "questions": len(ids), "correct_rate": round(float(y.mean()), 4),
                    "test_branches": int(test.sum()), "fraction": args.fraction}
    for fraction, key in ((args.fraction, "partial"), (1.0, "finished")):
        feats = [features(partial_steps(r["text"], fraction)) for r in rows]
        X = np.array([vector(f) for f in feats])
        default = np.array([score_features(f, ScorerWeights()) for f in feats])
        block: dict = {"default_auc": auc(y[test], default[test])}
        model = LogisticRegression(C=1.0, max_iter=1000).fit(X[~test], y[~test])
        block["fitted_auc"] = auc(y[test], model.decision_function(X[test]))
        block["fitted_weights"] = dict(zip(("bias", *FEATURES), [float(model.intercept_[0]),
                                                                  *map(float, model.coef_[0])], strict=True))
        singles = {}
        for j, name in enumerate(FEATURES):
            sign = 1.0 if (auc(y[~test], X[~test, j]) or 0.5) >= 0.5 else -1.0
            singles[name] = auc(y[test], sign * X[test, j])
        block["single_feature_auc"] = singles
        result[key] = block
    print(json.dumps(result, indent=2))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
