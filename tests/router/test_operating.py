"""Operating points calibrated from out-of-fold p_fail (cascade/router/operating.py)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from cascade.router import evaluate
from cascade.router.operating import HINT_GAP_RECOVERED, NEVER, calibrate, chosen_tiers, route_score


def noisy_two_tier(n: int = 400, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    hardness = rng.random(n)
    correct = np.c_[rng.random(n) > hardness, rng.random(n) > 0.4 * hardness]
    p_fail = np.clip(np.c_[hardness, 0.4 * hardness] + rng.normal(0, 0.15, (n, 2)), 0, 1)
    return p_fail, correct


def test_route_score_ranks_by_expected_gain_of_the_top_tier() -> None:
    rows = [[0.9, 0.1], [0.9, 0.8], [0.2, 0.1], [0.5, 0.5, 0.1]]
    scores = [float(route_score(np.array(row))) for row in rows]
    assert scores == pytest.approx([0.9, 0.55, 0.55, 0.7])


def test_frontier_is_cheapest_for_its_quality_and_spans_all_cheap_to_all_top() -> None:
    p_fail, correct = noisy_two_tier()
    cal = calibrate(p_fail, correct)
    costs = [p.cost for p in cal.frontier]
    qualities = [p.quality for p in cal.frontier]
    assert costs == sorted(costs) and all(b > a for a, b in itertools.pairwise(qualities))
    assert cal.frontier[0].cost == 0.0 and cal.frontier[0].quality == pytest.approx(correct[:, 0].mean())
    assert max(qualities) >= correct[:, 1].mean() - 1e-9


def test_named_hints_recover_their_share_of_the_gap_at_rising_cost() -> None:
    p_fail, correct = noisy_two_tier()
    cal = calibrate(p_fail, correct)
    scores = route_score(p_fail)
    q_low, q_high = correct[:, 0].mean(), correct[:, 1].mean()
    costs = []
    for hint, share in HINT_GAP_RECOVERED.items():
        tiers = chosen_tiers(scores, np.array(cal.named[hint]))
        quality = correct[np.arange(len(tiers)), tiers].mean()
        assert quality >= q_low + share * (q_high - q_low) - 1e-9, hint
        costs.append(tiers.mean())
    assert costs == sorted(costs) and costs[0] < costs[-1]


def test_two_tier_frontier_matches_the_evaluated_routing_curve() -> None:
    """The served thresholds walk the same curve `cascade router eval` integrates into APGR."""
    p_fail, correct = noisy_two_tier()
    cal = calibrate(p_fail, correct, quantiles=len(p_fail))
    curve = evaluate.routing_curve(p_fail, correct)
    for point in cal.frontier:
        assert point.quality <= np.interp(point.cost, curve.x, curve.quality) + 1e-9


def test_numeric_target_takes_the_cheapest_point_reaching_it_else_the_best() -> None:
    p_fail, correct = noisy_two_tier()
    cal = calibrate(p_fail, correct)
    target = (cal.quality_all_cheapest + cal.quality_all_top) / 2
    chosen = next(p for p in cal.frontier if p.thresholds == cal.thresholds_for_target(target))
    assert chosen.quality >= target and all(p.quality < target for p in cal.frontier if p.cost < chosen.cost)
    best = max(cal.frontier, key=lambda p: p.quality)
    assert cal.thresholds_for_target(1.0) == best.thresholds


def test_three_tiers_get_ascending_thresholds_and_use_the_middle_tier() -> None:
    rng = np.random.default_rng(3)
    n = 300
    hardness = rng.random(n)
    correct = np.c_[rng.random(n) > hardness, rng.random(n) > 0.6 * hardness, rng.random(n) > 0.3 * hardness]
    p_fail = np.c_[hardness, 0.6 * hardness, 0.3 * hardness]
    cal = calibrate(p_fail, correct)
    for thresholds in cal.named.values():
        assert len(thresholds) == 2 and thresholds[0] <= thresholds[1] <= NEVER
    assert any(p.tier_fractions[1] > 0 for p in cal.frontier)
