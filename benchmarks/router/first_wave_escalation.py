"""A first wave's agreement as the escalation signal of a cascade (issue 63 item 2), beside the learned router's
p_fail and a random escalation of the same share, replayed on recorded branches. Prints JSON.

Why: adaptive consistency already computes it (two sampled branches; all vote when they disagree), and a
disagreement says the model is unsure of *this* answer, which a router reading only the prompt cannot see. Does it
pick the questions worth escalating better than the router does, and better than chance?

Questions: the 100 GSM8K training questions with 8 sampled branches recorded for both the 0.5B
(models/outcomes/gsm8k-train-embedded-branches.jsonl) and the 1.5B (models/outcomes/qwen15-train-bench/sc-t07/
branches.jsonl), and the ladder's greedy answers and served reasoning answers for them (v8). Branches are in launch
order: the first wave is branches 0 and 1.

Cascades, each with a cheap step and one escalation (the same target for every policy of a cascade):
  * `0.5b->1.5b` and `0.5b->1.5b-reason`: the 0.5B answers; escalated questions get the 1.5B's greedy answer, or the
    reasoning tier's served (adaptive) one.
  * `1.5b->vote8`: the 1.5B answers; escalated questions get the vote of its 8 sampled branches (majority of the
    answers; a tie goes to the shortest tied branch, the runner's rule without a scorer).
Policies, for each cascade:
  * `agreement`: the cheap step is the model's first wave (2 sampled branches); it keeps their answer when the two
    agree and escalates when not. For `1.5b->vote8` that is the served adaptive vote itself.
  * `router`: the cheap step is the model's greedy answer; it escalates the questions with the highest out-of-fold
    p_fail for that model, as many as `agreement` escalated (the shipped router's features and estimator, fitted
    5-fold over the 384 v8 rows: each question predicted by a model that never saw it).
  * `random`: the greedy answer; the same number of questions escalated at random (`--draws` draws: mean, 95 % band,
    and the share of draws at least as accurate as `agreement`).
  * `at_agreements_tokens`: `router` and `random` again, escalating as many questions as fit in agreement's mean
    decode tokens per question (its first wave costs two answers where greedy costs one): the same cost, not the same
    share.
Nothing is tuned: the agreement rule has no threshold and the router's share is agreement's. Intervals: paired
bootstrap over questions (`--resamples`, seeded). Cost: decode tokens per question, by model (on an H200 the 0.5B's
request costs about 0.65x the 1.5B's: docs/measured.md).

Usage: .venv/bin/python -m benchmarks.router.first_wave_escalation [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.metrics import roc_auc_score

from benchmarks.router.null_card import options_from_card
from cascade.router.artifact import read_card
from cascade.router.outcomes import load_outcomes
from cascade.router.train.pipeline import out_of_fold_p_fail
from cascade.testing.scripts import print_result

V8 = Path("models/outcomes/gsm8k-train-embedded-v8.jsonl")
BRANCHES_05 = Path("models/outcomes/gsm8k-train-embedded-branches.jsonl")
BRANCHES_15 = Path("models/outcomes/qwen15-train-bench/sc-t07/branches.jsonl")
ROUTER = Path("models/routers/embedded-gsm8k")
SMALL, DIRECT, REASON = "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-reason"
FIRST_WAVE = 2


@dataclass(frozen=True)
class Branch:
    answer: str | None
    correct: bool
    tokens: int


@dataclass(frozen=True)
class Cascade:
    """Per question: the first wave's answer (correct, tokens, whether it agreed), the greedy cheap answer, and the
    escalation target's answer (correct, tokens), all arrays over the same questions."""

    name: str
    model: str  # the cheap model, whose p_fail the router ranks by
    wave_correct: np.ndarray
    wave_tokens: np.ndarray
    agreed: np.ndarray
    greedy_correct: np.ndarray
    greedy_tokens: np.ndarray
    target_correct: np.ndarray
    target_tokens: np.ndarray


def read_branches(path: Path, tier: str) -> dict[str, list[Branch]]:
    out = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        branches = row["tiers"][tier]["branches"]
        out[row["id"]] = [Branch(b.get("answer") or None, bool(b["correct"]), int(b["output_tokens"]))
                          for b in branches]
    return out


def first_wave(branches: list[Branch]) -> tuple[bool, int, bool]:
    """(correct, tokens, agreed) of the first wave: the first branch's answer when the wave agrees."""
    wave = branches[:FIRST_WAVE]
    agreed = wave[0].answer is not None and all(b.answer == wave[0].answer for b in wave)
    return wave[0].correct, sum(b.tokens for b in wave), agreed


def majority(branches: list[Branch]) -> bool:
    """Whether the vote of all branches is right (a tie: the shortest tied branch; no readable answer: the
    shortest branch)."""
    counts = Counter(b.answer for b in branches if b.answer is not None)
    if not counts:
        return min(branches, key=lambda b: b.tokens).correct
    top = max(counts.values())
    tied = [b for b in branches if b.answer is not None and counts[b.answer] == top]
    return min(tied, key=lambda b: b.tokens).correct


def adaptive(branches: list[Branch]) -> tuple[bool, int]:
    """The served reasoning tier: the first wave's answer when it agrees, else the vote of all; decode tokens."""
    correct, tokens, agreed = first_wave(branches)
    return (correct, tokens) if agreed else (majority(branches), sum(b.tokens for b in branches))


def policies(c: Cascade, p_fail: np.ndarray, *, draws: int, resamples: int, seed: int) -> dict[str, Any]:
    escalate = ~c.agreed
    k = int(escalate.sum())
    agreement_correct = np.where(escalate, c.target_correct, c.wave_correct)
    agreement_tokens = c.wave_tokens + np.where(escalate, c.target_tokens, 0)
    by_router = np.zeros(len(p_fail), dtype=bool)
    by_router[np.argsort(-p_fail, kind="stable")[:k]] = True
    router_correct = np.where(by_router, c.target_correct, c.greedy_correct)
    router_tokens = c.greedy_tokens + np.where(by_router, c.target_tokens, 0)
    rng = np.random.default_rng(seed)
    n = len(p_fail)
    random_accuracy = _random_escalations(c, k, draws, rng)
    random_tokens = c.greedy_tokens.mean() + k / n * c.target_tokens.mean()
    boot = rng.integers(0, n, size=(resamples, n))
    diff_accuracy = (agreement_correct[boot].mean(axis=1) - router_correct[boot].mean(axis=1))
    diff_tokens = (agreement_tokens[boot].mean(axis=1) - router_tokens[boot].mean(axis=1))
    # The router and the random split given agreement's tokens instead of its share: as many escalations (highest
    # p_fail first; at random) as fit within agreement's mean tokens per question
    order = np.argsort(-p_fail, kind="stable")
    spent = (c.greedy_tokens.sum() + np.concatenate([[0.0], np.cumsum(c.target_tokens[order])])) / n
    k_router = int(np.searchsorted(spent, agreement_tokens.mean(), side="right")) - 1
    by_tokens = np.zeros(n, dtype=bool)
    by_tokens[order[:k_router]] = True
    router_t_correct = np.where(by_tokens, c.target_correct, c.greedy_correct)
    router_t_tokens = c.greedy_tokens + np.where(by_tokens, c.target_tokens, 0)
    diff_t = agreement_correct[boot].mean(axis=1) - router_t_correct[boot].mean(axis=1)
    k_random = min(n, max(0, int((agreement_tokens.mean() - c.greedy_tokens.mean()) / c.target_tokens.mean() * n)))
    random_t = _random_escalations(c, k_random, draws, rng)
    greedy_wrong = ~c.greedy_correct.astype(bool)
    wave_wrong = ~c.wave_correct.astype(bool)
    return {
        "questions": n, "escalated": k,
        "cheap_alone": {"greedy_accuracy": _r(c.greedy_correct.mean()), "wave_accuracy": _r(c.wave_correct.mean())},
        "target_alone": {"accuracy": _r(c.target_correct.mean()), "tokens": _r(c.target_tokens.mean())},
        "agreement": {"accuracy": _r(agreement_correct.mean()), "tokens": _r(agreement_tokens.mean())},
        "router": {"accuracy": _r(router_correct.mean()), "tokens": _r(router_tokens.mean())},
        "random": {"accuracy": _r(random_accuracy.mean()), "band95": _band(random_accuracy),
                   "tokens": _r(random_tokens),
                   "share_at_least_agreement": _r((random_accuracy >= agreement_correct.mean()).mean())},
        "agreement_minus_router": {"accuracy": _r(diff_accuracy.mean()), "accuracy95": _band(diff_accuracy),
                                   "tokens": _r(diff_tokens.mean()), "tokens95": _band(diff_tokens)},
        "at_agreements_tokens": {
            "router": {"escalated": k_router, "accuracy": _r(router_t_correct.mean()),
                       "tokens": _r(router_t_tokens.mean())},
            "random": {"escalated": k_random, "accuracy": _r(random_t.mean()), "band95": _band(random_t),
                       "share_at_least_agreement": _r((random_t >= agreement_correct.mean()).mean())},
            "agreement_minus_router": {"accuracy": _r(diff_t.mean()), "accuracy95": _band(diff_t)},
        },
        "auc": {  # how well each signal ranks the cheap answers that are wrong (0.5: no better than chance)
            "disagreement_for_wave_wrong": _auc(wave_wrong, escalate.astype(float)),
            "disagreement_for_greedy_wrong": _auc(greedy_wrong, escalate.astype(float)),
            "router_p_fail_for_greedy_wrong": _auc(greedy_wrong, p_fail),
            "router_p_fail_for_wave_wrong": _auc(wave_wrong, p_fail),
        },
    }


def _random_escalations(c: Cascade, k: int, draws: int, rng: np.random.Generator) -> np.ndarray:
    """Accuracy of `draws` random choices of `k` questions escalated, the rest answered greedily."""
    n = len(c.greedy_correct)
    accuracy = np.empty(draws)
    for d in range(draws):
        chosen = np.zeros(n, dtype=bool)
        chosen[rng.choice(n, size=k, replace=False)] = True
        accuracy[d] = np.where(chosen, c.target_correct, c.greedy_correct).mean()
    return accuracy


def _auc(wrong: np.ndarray, score: np.ndarray) -> float | None:
    return _r(roc_auc_score(wrong, score)) if 0 < wrong.sum() < len(wrong) else None


def _band(values: np.ndarray) -> list[float]:
    return [_r(np.percentile(values, 2.5)), _r(np.percentile(values, 97.5))]


def _r(value: float) -> float:
    return round(float(value), 4)


def build(ids: list[str], v8: dict[str, dict[str, Any]], small: dict[str, list[Branch]],
          large: dict[str, list[Branch]]) -> list[Cascade]:
    def col(values: list[float]) -> np.ndarray:
        return np.asarray(values, dtype=float)

    waves05 = [first_wave(small[q]) for q in ids]
    waves15 = [first_wave(large[q]) for q in ids]
    greedy05 = [v8[q]["tiers"][SMALL] for q in ids]
    greedy15 = [v8[q]["tiers"][DIRECT] for q in ids]
    served = [v8[q]["tiers"][REASON] for q in ids]
    common = {"wave_correct": col([w[0] for w in waves05]), "wave_tokens": col([w[1] for w in waves05]),
              "agreed": np.asarray([w[2] for w in waves05]),
              "greedy_correct": col([g["correct"] for g in greedy05]),
              "greedy_tokens": col([g["output_tokens"] for g in greedy05])}
    votes = [(majority(large[q]), sum(b.tokens for b in large[q])) for q in ids]
    return [
        Cascade("0.5b->1.5b", SMALL, **common, target_correct=col([g["correct"] for g in greedy15]),
                target_tokens=col([g["output_tokens"] for g in greedy15])),
        Cascade("0.5b->1.5b-reason", SMALL, **common, target_correct=col([s["correct"] for s in served]),
                target_tokens=col([s["decode_tokens"] for s in served])),
        Cascade("1.5b->vote8", DIRECT, wave_correct=col([w[0] for w in waves15]),
                wave_tokens=col([w[1] for w in waves15]), agreed=np.asarray([w[2] for w in waves15]),
                greedy_correct=col([g["correct"] for g in greedy15]),
                greedy_tokens=col([g["output_tokens"] for g in greedy15]),
                target_correct=col([v[0] for v in votes]), target_tokens=col([v[1] for v in votes])),
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--draws", type=int, default=2000)
    p.add_argument("--resamples", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out")
    args = p.parse_args(argv)
    v8 = {row["id"]: row for row in map(json.loads, V8.read_text().splitlines())}
    small, large = read_branches(BRANCHES_05, f"{SMALL}-reason"), read_branches(BRANCHES_15, REASON)
    ids = sorted(set(small) & set(large) & set(v8))
    card = read_card(ROUTER)
    outcomes = load_outcomes(V8, card.tiers)
    p_fail_all = out_of_fold_p_fail(outcomes, options_from_card(card, 5).validate())
    row_of = {q: i for i, q in enumerate(outcomes.ids)}
    tier_of = {t: j for j, t in enumerate(card.tiers)}
    # The served reasoning answers of these questions were replayed from the same 1.5B branches: a check that the
    # replay here reads them as the gateway voted.
    replayed = [adaptive(large[q]) for q in ids]
    matches = sum(c == bool(v8[q]["tiers"][REASON]["correct"]) for (c, _), q in zip(replayed, ids, strict=True))
    result: dict[str, Any] = {"questions": len(ids), "router": str(ROUTER), "router_cv_folds": 5,
                              "served_adaptive_reproduced": f"{matches}/{len(ids)}", "cascades": {}}
    for cascade in build(ids, v8, small, large):
        p_fail = np.asarray([p_fail_all[row_of[q], tier_of[cascade.model]] for q in ids])
        result["cascades"][cascade.name] = policies(cascade, p_fail, draws=args.draws, resamples=args.resamples,
                                                    seed=args.seed)
    print_result(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
