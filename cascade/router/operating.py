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

Calibration (at training time, on *out-of-fold* p_fail, so the quality estimates are not in-sample):
every ascending threshold vector on a grid of score quantiles is scored by the mean measured
correctness and mean cost of the tiers it picks; the cheapest-for-its-quality points form the
frontier. Named hints take the cheapest frontier point recovering a share of the quality gap between
"all on tier 0" and "all on the most accurate tier" (`HINT_GAP_RECOVERED`: fast 50%, balanced 80%, best
95%). The most accurate tier is the top one on a well-ordered ladder; on the embedded CPU ladder it is
not (Qwen direct at 512 tokens 0.323 against its branched reasoning tier's 0.310 on 300 GSM8K questions),
and a gap measured to the top tier would send `best` below what one cheaper tier alone reaches;
a numeric hint (a target accuracy) takes the cheapest point whose estimated quality reaches it, or the
best point when none does.
"""

from __future__ import annotations

from itertools import combinations_with_replacement

import msgspec
import numpy as np

HINT_GAP_RECOVERED = {"fast": 0.5, "balanced": 0.8, "best": 0.95}
# Above any route score: a threshold that is never reached.
NEVER = 1.01
GRID_QUANTILES = 40


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


def calibrate(p_fail: np.ndarray, correct: np.ndarray, costs: np.ndarray | None = None,
              quantiles: int = GRID_QUANTILES) -> Calibration:
    """Operating points from out-of-fold ``p_fail`` and measured ``correct`` (both (n, tiers))."""
    correct = np.asarray(correct, dtype=float)
    n, n_tiers = correct.shape
    costs = np.arange(n_tiers, dtype=float) if costs is None else np.asarray(costs, dtype=float)
    scores = route_score(p_fail)
    # Candidate thresholds: just above score quantiles (so a quantile's prompts stay below), plus
    # 0 (everything up) and NEVER (nothing up); rounded so that plans and logs stay readable.
    grid = np.unique(np.round(np.r_[0.0, np.quantile(scores, np.linspace(0, 1, quantiles + 1)) + 1e-6, NEVER], 6))
    rows = []
    for combo in combinations_with_replacement(grid, n_tiers - 1):
        tiers = chosen_tiers(scores, np.array(combo))
        quality = float(correct[np.arange(n), tiers].mean())
        fractions = np.bincount(tiers, minlength=n_tiers) / n
        rows.append((float(fractions @ costs), quality, [float(h) for h in combo], fractions))
    rows.sort(key=lambda r: (r[0], -r[1]))
    frontier: list[FrontierPoint] = []
    for cost, quality, thresholds, fractions in rows:
        if frontier and quality <= frontier[-1].quality + 1e-12:
            continue
        frontier.append(FrontierPoint(thresholds=thresholds, quality=round(quality, 6), cost=round(cost, 6),
                                      tier_fractions=[round(float(f), 6) for f in fractions]))
    q_low, q_best = float(correct[:, 0].mean()), float(correct.mean(axis=0).max())
    named = {}
    for hint, share in HINT_GAP_RECOVERED.items():
        target = q_low + share * (q_best - q_low)
        point = next((p for p in frontier if p.quality >= target - 1e-12), frontier[-1])
        named[hint] = list(point.thresholds)
    return Calibration(costs=[float(c) for c in costs], quality_all_cheapest=round(q_low, 6),
                       quality_all_top=round(float(correct[:, -1].mean()), 6), frontier=frontier, named=named)


class OperatingRow(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One operating point measured on outcomes: what routing with ``thresholds`` picks and what it costs."""

    name: str  # a quality hint, "all <tier>", or "oracle" (the cheapest correct tier of each prompt)
    thresholds: list[float] | None  # None for the oracle
    tier_fractions: list[float]
    accuracy: float
    cost: float  # mean tier cost per prompt (the --costs scale)
    decode_tokens: float | None  # mean tokens decoded per prompt by the picked tiers (all branches); None if unknown
    latency_s: float | None  # mean latency of the picked answers as labelled; None if unknown


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
    rows = []
    for name, tiers in picks.items():
        at = (np.arange(n), tiers)
        rows.append(OperatingRow(
            name=name, thresholds=list(points[name]) if name in points else None,
            tier_fractions=[round(float(f), 4) for f in np.bincount(tiers, minlength=n_tiers) / n],
            accuracy=round(float(correct[at].mean()), 4), cost=round(float(costs[tiers].mean()), 4),
            decode_tokens=_known_mean(tokens, at), latency_s=_known_mean(latency, at)))
    return rows


def _known_mean(values: np.ndarray | None, at: tuple[np.ndarray, np.ndarray]) -> float | None:
    if values is None:
        return None
    picked = values[at]
    return round(float(picked.mean()), 2) if len(picked) and np.isfinite(picked).all() else None
