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

from itertools import combinations_with_replacement

import numpy as np

from cascade.router.operating import NEVER, Calibration, FrontierPoint, chosen_tiers, route_score

HINT_GAP_RECOVERED = {"fast": 0.5, "balanced": 0.8, "best": 0.95}
GRID_QUANTILES = 40


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
