"""Operating points of a learned router: which thresholds each quality hint gets.

The gateway routes by one number per prompt and ascending thresholds (`policy.tier_for`: tier =
how many thresholds the number reaches). For a learned router that number is the **route score**

    route_score = (1 + p_fail[0] - p_fail[-1]) / 2        in [0, 1]

a monotone map of the expected gain of the top tier over the cheapest (with calibrated p_fail,
``p_fail[0] - p_fail[-1] = E[correct_top - correct_0]``). For two tiers, ranking by it is exactly the
routing curve `cascade router eval` reports APGR for, so the evaluated router is the served one.
(Difficulty, DESIGN.md's p_fail of tier 0, is still reported; routing by it alone spends strong calls
on prompts no tier answers: measured 0.60 vs 0.68 APGR on RouteLLM GSM8K.) With 3+ tiers the middle
tiers get bands of the score.

A router's `Calibration` (its frontier of thresholds and each named hint's point) is fitted at training time
on out-of-fold p_fail by cascade/router/train/calibration.py; this module is what serving and evaluation read:
a numeric hint (a target accuracy) takes the cheapest frontier point whose estimated quality reaches it, or the
best point when none does.
"""

from __future__ import annotations

import msgspec
import numpy as np

# Above any route score: a threshold that is never reached.
NEVER = 1.01


class FrontierPoint(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    thresholds: list[float]
    quality: float  # mean correctness of the answers these thresholds pick (out-of-fold estimate)
    cost: float  # mean tier cost per prompt
    tier_fractions: list[float]


class Calibration(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    signal: str = "gain"  # route_score as defined above
    costs: list[float]
    quality_all_cheapest: float
    quality_all_top: float
    frontier: list[FrontierPoint]  # ascending cost and quality
    named: dict[str, list[float]]  # hint -> thresholds

    def thresholds_for_target(self, target: float) -> list[float]:
        for point in self.frontier:
            if point.quality >= target:
                return list(point.thresholds)
        return list(max(self.frontier, key=lambda p: (p.quality, -p.cost)).thresholds)


def route_score(p_fail: np.ndarray) -> np.ndarray:
    """Route score of each row of an (n, tiers) p_fail matrix; a 1-d row gives a scalar array."""
    p = np.asarray(p_fail, dtype=float)
    return (1.0 + p[..., 0] - p[..., -1]) / 2.0


def chosen_tiers(scores: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    return np.searchsorted(np.asarray(thresholds, dtype=float), scores, side="right")


class OperatingRow(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One operating point measured on outcomes: what routing with ``thresholds`` picks and what it costs."""

    name: str  # a quality hint, "all <tier>", or "oracle" (the cheapest correct tier of each prompt)
    thresholds: list[float] | None  # None for the oracle
    tier_fractions: list[float]
    accuracy: float
    cost: float  # mean tier cost per prompt (the --costs scale)
    decode_tokens: float | None  # mean tokens decoded per prompt by the picked tiers (all branches); None if unknown
    latency_s: float | None  # mean latency of the picked answers as labelled; None if unknown
    # Accuracy minus the most accurate single tier's on the same prompts: paired percentile bootstrap 95% interval
    # (seeded). Whether a hint that spends less reaches the best tier's accuracy is a paired question: the two
    # accuracies' separate intervals overlap long before their difference is in doubt. None in older cards.
    vs_most_accurate_ci95: list[float] | None = None


def reference_points(calibration: Calibration | None, n_tiers: int, tiers: list[str]) -> dict[str, list[float]]:
    """Thresholds of each tier alone (cheapest first), then of each named hint the calibration has."""
    points = {f"all {tier}": [0.0] * t + [NEVER] * (n_tiers - 1 - t) for t, tier in enumerate(tiers)}
    return points | (dict(calibration.named) if calibration is not None else {})


def operating_table(p_fail: np.ndarray, correct: np.ndarray, points: dict[str, list[float]],
                    costs: np.ndarray | None = None, tokens: np.ndarray | None = None,
                    latency: np.ndarray | None = None) -> list[OperatingRow]:
    """Accuracy, cost, decode tokens and latency of each operating point on these outcomes, plus the oracle."""
    correct = np.asarray(correct, dtype=bool)
    n, n_tiers = correct.shape
    costs = np.arange(n_tiers, dtype=float) if costs is None else np.asarray(costs, dtype=float)
    scores = route_score(p_fail)
    picks = {name: chosen_tiers(scores, np.array(thresholds)) for name, thresholds in points.items()}
    # The oracle takes the cheapest tier that answers right, and the cheapest tier when none does.
    picks["oracle"] = np.where(correct.any(axis=1), correct.argmax(axis=1), 0)
    most_accurate = correct[:, int(correct.mean(axis=0).argmax())]
    draws = np.random.default_rng(0).integers(0, n, (BOOTSTRAP_RESAMPLES, n)) if n else None
    rows = []
    for name, tiers in picks.items():
        at = (np.arange(n), tiers)
        rows.append(OperatingRow(
            name=name, thresholds=list(points[name]) if name in points else None,
            tier_fractions=[round(float(f), 4) for f in np.bincount(tiers, minlength=n_tiers) / n],
            accuracy=round(float(correct[at].mean()), 4), cost=round(float(costs[tiers].mean()), 4),
            decode_tokens=_known_mean(tokens, at), latency_s=_known_mean(latency, at),
            vs_most_accurate_ci95=_paired_interval(correct[at].astype(float) - most_accurate, draws)))
    return rows


BOOTSTRAP_RESAMPLES = 1000


def _paired_interval(differences: np.ndarray, draws: np.ndarray | None) -> list[float] | None:
    """95% percentile bootstrap interval of the mean of per-prompt differences, over the same seeded resamples
    for every point (so two points' intervals are comparable)."""
    if draws is None:
        return None
    low, high = np.percentile(differences[draws].mean(axis=1), [2.5, 97.5])
    return [round(float(low), 4), round(float(high), 4)]


def _known_mean(values: np.ndarray | None, at: tuple[np.ndarray, np.ndarray]) -> float | None:
    if values is None:
        return None
    picked = values[at]
    return round(float(picked.mean()), 2) if len(picked) and np.isfinite(picked).all() else None
