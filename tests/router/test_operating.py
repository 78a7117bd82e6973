"""Operating points calibrated from out-of-fold p_fail (cascade/router/train/calibration.py) and measured on
outcomes (cascade/router/operating.py)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from cascade.router import evaluate
from cascade.router.operating import NEVER, chosen_tiers, operating_table, reference_points, route_score
from cascade.router.train.calibration import HINT_GAP_RECOVERED, calibrate


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


def test_on_a_ladder_whose_middle_tier_is_the_most_accurate_hints_measure_the_gap_to_it() -> None:
    # The embedded CPU ladder's shape: the middle tier (greedy, direct) beats the top one (sampled branches).
    rng = np.random.default_rng(5)
    n = 400
    hardness = rng.random(n)
    correct = np.c_[rng.random(n) > 0.3 + 0.7 * hardness, rng.random(n) > 0.2 + 0.5 * hardness,
                    rng.random(n) > 0.45 + 0.5 * hardness]
    p_fail = np.clip(np.c_[0.3 + 0.7 * hardness, 0.2 + 0.5 * hardness, 0.45 + 0.5 * hardness], 0, 1)
    assert correct[:, 1].mean() > correct[:, 2].mean() + 0.1
    cal = calibrate(p_fail, correct)
    q_low, q_best = correct[:, 0].mean(), correct.mean(axis=0).max()
    scores = route_score(p_fail)
    for hint, share in HINT_GAP_RECOVERED.items():
        tiers = chosen_tiers(scores, np.array(cal.named[hint]))
        assert correct[np.arange(n), tiers].mean() >= q_low + share * (q_best - q_low) - 1e-9, hint
    assert cal.quality_all_top == pytest.approx(correct[:, 2].mean())  # still reported as measured


def test_operating_table_measures_each_point_tier_alone_and_the_oracle() -> None:
    # Route scores 0.9, 0.55, 0.2, 0.5 (gain of tier 2 over tier 0, mapped to [0, 1]).
    p_fail = np.array([[0.9, 0.5, 0.1], [0.6, 0.5, 0.5], [0.1, 0.3, 0.5], [0.5, 0.5, 0.5]])
    correct = np.array([[0, 0, 1], [0, 1, 1], [1, 1, 0], [0, 0, 0]], dtype=bool)
    tokens = np.array([[10, 20, 80], [10, 20, 80], [10, 20, 80], [10, 20, 80]], dtype=float)
    points = reference_points(None, 3, ["a", "b", "c"]) | {"mid": [0.52, 0.8]}
    rows = {row.name: row for row in operating_table(p_fail, correct, points, tokens=tokens)}
    assert list(rows) == ["all a", "all b", "all c", "mid", "oracle"]
    assert rows["all a"].tier_fractions == [1.0, 0.0, 0.0] and rows["all a"].accuracy == 0.25
    assert rows["all c"].accuracy == 0.5 and rows["all c"].cost == 2.0 and rows["all c"].decode_tokens == 80
    # mid: 0.9 -> c (right), 0.55 -> b (right), 0.2 -> a (right), 0.5 -> a (wrong).
    assert rows["mid"].tier_fractions == [0.5, 0.25, 0.25] and rows["mid"].accuracy == 0.75
    assert rows["mid"].cost == 0.75 and rows["mid"].decode_tokens == 30.0
    # The oracle: c, b, a, and a where no tier is right.
    assert rows["oracle"].tier_fractions == [0.5, 0.25, 0.25] and rows["oracle"].thresholds is None
    assert rows["oracle"].accuracy == 0.75 and rows["mid"].latency_s is None


def test_operating_table_reports_unknown_tokens_as_none_and_named_hints_follow_the_tiers() -> None:
    p_fail, correct = noisy_two_tier(n=100)
    cal = calibrate(p_fail, correct)
    tokens = np.full(correct.shape, 5.0)
    tokens[0, 1] = np.nan
    points = reference_points(cal, 2, ["weak", "strong"])
    assert list(points) == ["all weak", "all strong", *HINT_GAP_RECOVERED]
    rows = {row.name: row for row in operating_table(p_fail, correct, points, tokens=tokens)}
    assert rows["all weak"].decode_tokens == 5.0 and rows["all strong"].decode_tokens is None
    assert rows["best"].accuracy >= rows["fast"].accuracy


def test_each_point_carries_a_paired_interval_against_the_most_accurate_tier() -> None:
    # Tier 1 is the most accurate (0.8); tier 0 is right on a subset of tier 1's prompts (0.5).
    n = 200
    correct = np.zeros((n, 2), dtype=bool)
    correct[:160, 1] = True
    correct[:100, 0] = True
    p_fail = np.c_[np.r_[np.zeros(100), np.ones(100)], np.zeros(n)]  # route score 0.5 on the first 100, 1.0 after
    points = reference_points(None, 2, ["cheap", "strong"]) | {"routed": [0.75]}
    rows = {row.name: row for row in operating_table(p_fail, correct, points)}
    # Alone, the most accurate tier differs from itself by exactly zero on every resample.
    assert rows["all strong"].vs_most_accurate_ci95 == [0.0, 0.0]
    # The cheap tier loses 60 of 200 prompts and never wins one: an interval around -0.3, wholly below zero.
    low, high = rows["all cheap"].vs_most_accurate_ci95
    assert -0.4 < low < -0.3 < high < -0.2
    # Routing the prompts tier 0 answers to tier 0 and the rest up loses nothing: the oracle split, exactly zero.
    assert rows["routed"].accuracy == 0.8 and rows["routed"].vs_most_accurate_ci95 == [0.0, 0.0]
    assert rows["routed"].cost == 0.5


def _calibrate_one_combination_at_a_time(p_fail: np.ndarray, correct: np.ndarray, costs: np.ndarray | None = None,
                                         quantiles: int = 40) -> tuple[list[tuple[float, ...]], dict]:
    """The calibration as first written (a loop over threshold combinations): the vectorised one must match it."""
    correct = np.asarray(correct, dtype=float)
    n, n_tiers = correct.shape
    costs = np.arange(n_tiers, dtype=float) if costs is None else np.asarray(costs, dtype=float)
    scores = route_score(p_fail)
    grid = np.unique(np.round(np.r_[0.0, np.quantile(scores, np.linspace(0, 1, quantiles + 1)) + 1e-6, NEVER], 6))
    rows = []
    for combo in itertools.combinations_with_replacement(grid, n_tiers - 1):
        tiers = chosen_tiers(scores, np.array(combo))
        fractions = np.bincount(tiers, minlength=n_tiers) / n
        # Tier by tier, as the product sums: `fractions @ costs` is a BLAS dot whose rounding hangs on the CPU's
        # kernel (AVX-512's fused multiply-adds reorder points of equal cost), so it is no reference.
        cost = sum(float(f) * float(c) for f, c in zip(fractions, costs, strict=True))
        rows.append((cost, float(correct[np.arange(n), tiers].mean()), [float(h) for h in combo]))
    rows.sort(key=lambda r: (r[0], -r[1]))
    frontier: list[tuple[float, ...]] = []
    for cost, quality, thresholds in rows:
        if frontier and quality <= frontier[-1][1] + 1e-12:
            continue
        frontier.append((round(cost, 6), round(quality, 6), *thresholds))
    q_low, q_best = correct[:, 0].mean(), correct.mean(axis=0).max()
    named = {hint: list(next((p for p in frontier if p[1] >= q_low + share * (q_best - q_low) - 1e-12),
                             frontier[-1])[2:]) for hint, share in HINT_GAP_RECOVERED.items()}
    return frontier, named


@pytest.mark.parametrize("n_tiers, n, seed", [(2, 50, 0), (3, 200, 1), (4, 384, 2), (4, 37, 3)])
def test_vectorised_calibration_matches_the_loop_over_combinations(n_tiers: int, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    p_fail = np.round(rng.random((n, n_tiers)), 2)  # rounded: tied scores, as a coarse classifier gives
    correct = rng.random((n, n_tiers)) < np.linspace(0.1, 0.8, n_tiers)
    costs = np.array([1.0, 2.5, 4.0, 9.0][:n_tiers])
    for c in (None, costs):
        cal = calibrate(p_fail, correct, c)
        frontier, named = _calibrate_one_combination_at_a_time(p_fail, correct, c)
        assert [(p.cost, p.quality, *p.thresholds) for p in cal.frontier] == frontier
        assert cal.named == named
