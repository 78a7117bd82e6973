"""Choosing a branch setting out of sample: nested cross-validation over questions.

A grid of settings replayed on the same questions it is then credited with reports its winner's luck as skill
(the winner's curse: the best of 84 settings at 0.77 on 100 training questions replayed at 0.54 on test). Here
the questions are split into K folds (seeded); on each fold the setting is chosen on the other K - 1 folds by
the same criterion as in sample, and scored on the held-out fold, so every question is answered by a setting
chosen without it. The out-of-fold accuracy is the estimate of what choosing this way serves; the settings
chosen per fold show how stable the choice is.

Criterion (benchmarks/reasoning/sart_replay.py's `best_within_2pts`): the fewest decode tokens among settings whose
accuracy is within `points` of the reference (self-consistency with all N branches) on the choosing questions;
ties to the more accurate, then to the earlier listed. When none is within `points`, the most accurate.

Plain numpy over per-question arrays; the replay that produces them is the caller's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Candidate:
    """One setting's per-question results, in one question order shared by every candidate."""

    setting: dict[str, Any]  # what it is (family, N, M, ...), as the JSON reports it
    correct: np.ndarray  # 0/1 per question
    tokens: np.ndarray  # decode tokens per question (every branch)
    latency: np.ndarray  # lockstep latency per question (tokens until the request ends)


@dataclass(frozen=True)
class OutOfFold:
    chosen: list[int]  # per fold, the candidate chosen on the other folds
    fold: np.ndarray  # each question's fold
    correct: np.ndarray  # each question answered by its fold's chosen candidate
    tokens: np.ndarray
    latency: np.ndarray


def folds(n_questions: int, k: int, seed: int) -> np.ndarray:
    """Each question's fold, 0..k-1: a seeded permutation dealt round-robin (fold sizes differ by one at most)."""
    if not 2 <= k <= n_questions:
        raise ValueError(f"folds: need 2 <= k <= questions ({n_questions}), got k={k}")
    fold = np.empty(n_questions, dtype=int)
    fold[np.random.default_rng(seed).permutation(n_questions)] = np.arange(n_questions) % k
    return fold


def choose(candidates: Sequence[Candidate], reference: np.ndarray, rows: np.ndarray, points: float) -> int:
    """The criterion on the questions where `rows` is true: fewest tokens within `points` of the reference."""
    acc = np.array([c.correct[rows].mean() for c in candidates])
    tok = np.array([c.tokens[rows].mean() for c in candidates])
    # Accuracies are multiples of 1/len(rows): compare with a hair of slack so 0.73 >= 0.75 - 0.02 holds.
    eligible = np.flatnonzero(acc >= reference[rows].mean() - points - 1e-9)
    if eligible.size == 0:
        return int(min(range(len(candidates)), key=lambda i: (-acc[i], tok[i], i)))
    return int(min(eligible, key=lambda i: (tok[i], -acc[i], i)))


def nested(candidates: Sequence[Candidate], reference: np.ndarray, k: int, seed: int, points: float) -> OutOfFold:
    """Choose on K - 1 folds, score on the held-out one, for each of the K folds."""
    if not candidates:
        raise ValueError("nested: no candidate settings")
    fold = folds(len(reference), k, seed)
    correct = np.zeros(len(reference))
    tokens = np.zeros(len(reference))
    latency = np.zeros(len(reference))
    chosen = []
    for f in range(k):
        held = fold == f
        index = choose(candidates, reference, ~held, points)
        pick = candidates[index]
        chosen.append(index)
        correct[held], tokens[held], latency[held] = pick.correct[held], pick.tokens[held], pick.latency[held]
    return OutOfFold(chosen=chosen, fold=fold, correct=correct, tokens=tokens, latency=latency)


def paired_difference(a: np.ndarray, b: np.ndarray, resamples: int, seed: int) -> dict[str, Any]:
    """mean(a) - mean(b) with a paired bootstrap 95% interval over questions, and the discordant counts."""
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(a), size=(resamples, len(a)))
    diff = a[draws].mean(axis=1) - b[draws].mean(axis=1)
    return {"difference": round(float(a.mean() - b.mean()), 4),
            "ci95": [round(float(np.percentile(diff, 2.5)), 4), round(float(np.percentile(diff, 97.5)), 4)],
            # For 0/1 outcomes the discordant pairs; for per-question means (several samples) the questions
            # where one side scored higher.
            "wins": int((a > b).sum()), "losses": int((a < b).sum())}


@dataclass(frozen=True)
class Plan:
    """How to cross-validate: K folds of a seeded split, the criterion's slack, the bootstrap's draws."""

    k: int = 5
    seed: int = 0
    points: float = 0.02
    resamples: int = 10_000


def measures(correct: np.ndarray, tokens: np.ndarray, latency: np.ndarray, reference: Candidate,
             greedy: Candidate | None, plan: Plan) -> dict[str, Any]:
    """Accuracy and cost of per-question results, against self-consistency and (paired) greedy."""
    out: dict[str, Any] = {
        "accuracy": round(float(correct.mean()), 4), "tokens_mean": round(float(tokens.mean()), 1),
        "tokens_vs_sc": round(float(tokens.mean() / reference.tokens.mean()), 3),
        "latency_vs_sc": round(float(latency.mean() / reference.latency.mean()), 3),
        "minus_sc": paired_difference(correct, reference.correct, plan.resamples, plan.seed)}
    if greedy is not None:
        out["minus_greedy"] = paired_difference(correct, greedy.correct, plan.resamples, plan.seed)
    return out


def compare(candidates: Sequence[Candidate], reference: Candidate, greedy: Candidate | None,
            plan: Plan) -> dict[str, Any]:
    """The in-sample best beside the out-of-fold estimate of choosing among `candidates`."""
    everywhere = np.ones(len(reference.correct), dtype=bool)
    best = candidates[choose(candidates, reference.correct, everywhere, plan.points)]
    oof = nested(candidates, reference.correct, plan.k, plan.seed, plan.points)
    return {"candidates": len(candidates),
            "in_sample_best": {"setting": best.setting,
                               **measures(best.correct, best.tokens, best.latency, reference, greedy, plan)},
            "out_of_fold": measures(oof.correct, oof.tokens, oof.latency, reference, greedy, plan),
            "chosen_per_fold": [candidates[i].setting for i in oof.chosen],
            "distinct_choices": len(set(oof.chosen))}


def report(candidates: Sequence[Candidate], reference: Candidate, greedy: Candidate | None,
           plan: Plan) -> dict[str, Any]:
    """Choosing among every candidate, then within each family (`setting["family"]`) alone."""
    families: dict[str, list[Candidate]] = {}
    for c in candidates:
        families.setdefault(str(c.setting["family"]), []).append(c)
    by_family: dict[str, Any] = {name: compare(members, reference, greedy, plan) for name, members in families.items()}
    if greedy is not None:
        by_family["greedy"] = {"candidates": 1, "out_of_fold": measures(
            greedy.correct, greedy.tokens, greedy.latency, reference, None, plan)}
    return {"folds": plan.k, "seed": plan.seed, "resamples": plan.resamples, "questions": len(reference.correct),
            "criterion": f"fewest decode tokens within {plan.points:g} accuracy of self-consistency "
                         "(else the most accurate), chosen on the other folds",
            "all": compare(candidates, reference, greedy, plan), "families": by_family}


def headline(result: dict[str, Any]) -> str:
    """One line: the in-sample best beside what choosing that way scores out of fold."""
    best, oof = result["all"]["in_sample_best"], result["all"]["out_of_fold"]
    line = (f"in-sample best of {result['all']['candidates']} settings {best['setting']}: accuracy {best['accuracy']} "
            f"at {best['tokens_vs_sc']}x self-consistency's tokens; out of fold ({result['folds']} folds, "
            f"{result['all']['distinct_choices']} distinct choices): {oof['accuracy']} at {oof['tokens_vs_sc']}x")
    if "minus_greedy" in oof:
        d = oof["minus_greedy"]
        line += f", {d['difference']:+} vs greedy ({d['ci95'][0]:+}..{d['ci95'][1]:+})"
    return line
