"""Calibrating a learned router's operating points (cascade/router/operating.py: the route score and what
`Calibration` holds), at training time, on *out-of-fold* p_fail, so the quality estimates are not in-sample.

Every ascending threshold vector on a grid of score quantiles is scored by the mean measured correctness and
mean cost of the tiers it picks; the cheapest-for-its-quality points form the frontier. Named hints take the
cheapest frontier point recovering a share of the quality gap between "all on tier 0" and "all on the most
accurate tier" (`HINT_GAP_RECOVERED`: fast 50%, balanced 80%, best 95%). The most accurate tier is the top one
on a well-ordered ladder; on the former embedded CPU ladder, whose top tier was Qwen-0.5B reasoning, it was
not (Qwen direct at 512 tokens 0.323 against its branched reasoning tier's 0.310 on 300 GSM8K questions), and a
gap measured to the top tier would send `best` below what one cheaper tier alone reaches. A numeric hint (a
target accuracy) is answered at serving time by `Calibration.thresholds_for_target`.
"""

from __future__ import annotations

import functools
from itertools import combinations_with_replacement

import numpy as np

from cascade.router.operating import NEVER, Calibration, FrontierPoint, route_score

HINT_GAP_RECOVERED = {"fast": 0.5, "balanced": 0.8, "best": 0.95}
GRID_QUANTILES = 40


def calibrate(p_fail: np.ndarray, correct: np.ndarray, costs: np.ndarray | None = None,
              quantiles: int = GRID_QUANTILES) -> Calibration:
    """Operating points from out-of-fold ``p_fail`` and measured ``correct`` (both (n, tiers))."""
    return calibrate_scores(route_score(p_fail), correct, costs, quantiles)


def calibrate_scores(scores: np.ndarray, correct: np.ndarray, costs: np.ndarray | None = None,
                     quantiles: int = GRID_QUANTILES) -> Calibration:
    """`calibrate` on route scores themselves (the random-route null, cascade/router/train/null.py, is calibrated
    by this rule with uniform scores in place of the router's)."""
    frontier = _Frontier(scores, correct, costs, quantiles)
    points = [FrontierPoint(thresholds=frontier.thresholds(i), quality=frontier.quality[i], cost=frontier.cost[i],
                            tier_fractions=[round(float(f), 6) for f in frontier.fractions[i]])
              for i in frontier.kept]
    return Calibration(costs=[float(c) for c in frontier.costs], quality_all_cheapest=round(frontier.q_low, 6),
                       quality_all_top=round(float(frontier.correct[:, -1].mean()), 6), frontier=points,
                       named=frontier.named())


def named_thresholds(scores: np.ndarray, correct: np.ndarray, costs: np.ndarray | None = None,
                     quantiles: int = GRID_QUANTILES) -> dict[str, list[float]]:
    """`calibrate_scores(...).named` without building the frontier's points (the null calibrates hundreds of
    times per report)."""
    return _Frontier(scores, correct, costs, quantiles).named()


class _Frontier:
    """Every ascending threshold vector on the grid, scored at once, and the indices of the frontier's points."""

    def __init__(self, scores: np.ndarray, correct: np.ndarray, costs: np.ndarray | None, quantiles: int) -> None:
        self.correct = correct = np.asarray(correct, dtype=float)
        n, n_tiers = correct.shape
        self.costs = costs = np.arange(n_tiers, dtype=float) if costs is None else np.asarray(costs, dtype=float)
        scores = np.asarray(scores, dtype=float)
        # Candidate thresholds: just above score quantiles (so a quantile's prompts stay below), plus
        # 0 (everything up) and NEVER (nothing up); rounded so that plans and logs stay readable.
        self.grid = np.unique(np.round(
            np.r_[0.0, np.quantile(scores, np.linspace(0, 1, quantiles + 1)) + 1e-6, NEVER], 6))
        self.combos = combos = _combinations(len(self.grid), n_tiers - 1)
        # In score order tier t takes the rows between the (t-1)-th and the t-th threshold's positions, so each
        # combination's correct answers are differences of per-tier running counts.
        order = np.argsort(scores, kind="stable")
        counts = np.vstack([np.zeros(n_tiers), np.cumsum(correct[order], axis=0)])
        below = np.searchsorted(scores[order], self.grid, side="left")  # rows under each grid threshold
        bounds = np.c_[np.zeros(len(combos), int), below[combos], np.full(len(combos), n)]
        tiers = np.arange(n_tiers)
        quality = (counts[bounds[:, 1:], tiers] - counts[bounds[:, :-1], tiers]).sum(axis=1) / n
        self.fractions = np.diff(bounds, axis=1) / n
        # Summed tier by tier, as a 1-d dot product sums: a matrix product rounds differently in the last bit,
        # which reorders points of equal cost and so would change which of them the frontier keeps.
        cost = sum((self.fractions[:, t] * costs[t] for t in range(n_tiers)), np.zeros(len(combos)))
        ranked = np.lexsort((-quality, cost))  # stable: equal points keep the order they were enumerated in
        # A point joins when it beats the last one kept as rounded in the card. Only points within rounding of
        # the best before them can (rounding moves a quality by < 1e-6); the loop runs over those.
        best_before = np.r_[-np.inf, np.maximum.accumulate(quality[ranked])[:-1]]
        self.kept: list[int] = []
        self.quality: dict[int, float] = {}
        self.cost: dict[int, float] = {}
        for i in map(int, ranked[quality[ranked] > best_before - 1e-6]):
            if self.kept and quality[i] <= self.quality[self.kept[-1]] + 1e-12:
                continue
            self.kept.append(int(i))
            self.quality[i], self.cost[i] = round(float(quality[i]), 6), round(float(cost[i]), 6)
        self.q_low = float(correct[:, 0].mean())

    def thresholds(self, i: int) -> list[float]:
        return [float(h) for h in self.grid[self.combos[i]]]

    def named(self) -> dict[str, list[float]]:
        """Each hint's point: the cheapest recovering its share of the gap to the most accurate tier."""
        q_best = float(self.correct.mean(axis=0).max())
        named = {}
        for hint, share in HINT_GAP_RECOVERED.items():
            target = self.q_low + share * (q_best - self.q_low)
            named[hint] = self.thresholds(next((i for i in self.kept if self.quality[i] >= target - 1e-12),
                                               self.kept[-1]))
        return named


@functools.lru_cache(maxsize=16)
def _combinations(grid_size: int, length: int) -> np.ndarray:
    """Every ascending index vector of ``length`` into a grid (combinations with replacement, in their order)."""
    combos = np.array(list(combinations_with_replacement(range(grid_size), length)), dtype=int)
    combos.flags.writeable = False
    return combos.reshape(-1, length)
