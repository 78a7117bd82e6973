"""Routing-curve metrics against closed forms (RouteLLM's APGR/CPT, ECE, AUC) and the 3+ tier curve."""

from __future__ import annotations

import numpy as np
import pytest

from cascade.router import evaluate as ev


def _outcomes(n_gain: int, n_loss: int, n_same: int, seed: int = 0) -> np.ndarray:
    rows = [[0, 1]] * n_gain + [[1, 0]] * n_loss + [[1, 1]] * (n_same // 2) + [[0, 0]] * (n_same - n_same // 2)
    return np.random.default_rng(seed).permutation(np.array(rows, dtype=bool))


def _closed_form(a: float, b: float, anti: bool = False) -> float:
    """Area under the oracle's PGR curve (gains first, losses last) with shares a (gain) and b (loss)."""
    g = a - b
    if anti:
        return -b * (b / g) / 2 - (1 - a - b) * (b / g) + a * (1 - b / g) / 2
    return a * (a / g) / 2 + (1 - a - b) * (a / g) + b * (a / g + 1) / 2


def test_oracle_apgr_equals_closed_form() -> None:
    c = _outcomes(300, 80, 620)
    curve = ev.routing_curve(ev.oracle_scores(c), c)
    assert ev.apgr(curve) == pytest.approx(_closed_form(0.3, 0.08), abs=1e-9)


def test_anti_oracle_apgr_equals_closed_form() -> None:
    c = _outcomes(300, 80, 620)
    gain = c[:, 1].astype(float) - c[:, 0]
    assert ev.apgr(ev.routing_curve(-gain, c)) == pytest.approx(_closed_form(0.3, 0.08, anti=True), abs=1e-9)


def test_constant_score_is_the_random_diagonal() -> None:
    c = _outcomes(300, 80, 620)
    curve = ev.routing_curve(np.zeros(len(c)), c)
    assert ev.apgr(curve) == pytest.approx(0.5, abs=1e-12)
    assert ev.cpt(curve, 0.8) == pytest.approx(0.8, abs=1e-9)


def test_random_scores_give_apgr_near_one_half() -> None:
    c = _outcomes(3000, 800, 6200)
    apgrs = [ev.apgr(ev.routing_curve(np.random.default_rng(s).random(len(c)), c)) for s in range(5)]
    assert np.mean(apgrs) == pytest.approx(0.5, abs=0.02)


def test_two_tier_curve_ranks_by_expected_gain() -> None:
    rng = np.random.default_rng(1)
    c = rng.random((500, 2)) < [0.6, 0.8]
    p_fail = rng.random((500, 2))
    gain = p_fail[:, 0] - p_fail[:, 1]
    assert ev.apgr(ev.routing_curve(p_fail, c)) == pytest.approx(ev.apgr(ev.routing_curve(gain, c)), abs=1e-12)


def test_cpt_is_monotone_in_the_level() -> None:
    rng = np.random.default_rng(2)
    c = rng.random((800, 2)) < [0.6, 0.85]
    curve = ev.routing_curve(rng.random(800) + 0.5 * ~c[:, 0], c)
    levels = np.linspace(0.05, 0.99, 40)
    values = [ev.cpt(curve, level) for level in levels]
    assert all(np.diff(values) >= 0)
    assert values[0] >= 0.0 and values[-1] <= 1.0


def test_ece_of_a_calibrated_predictor_is_near_zero() -> None:
    rng = np.random.default_rng(3)
    p = rng.random(200_000)
    failed = rng.random(200_000) < p
    assert ev.ece(p, failed) < 0.01
    assert ev.ece(np.clip(p * 2, 0, 1), failed) > 0.15


def test_reliability_bins_are_the_ones_ece_averages() -> None:
    p = np.array([0.05, 0.05, 0.15, 0.55, 0.95, 1.0])
    failed = np.array([0, 1, 0, 1, 1, 1], dtype=bool)
    predicted, observed, counts = ev.reliability(p, failed)
    assert counts.tolist() == [2, 1, 1, 2]  # empty bins are left out; 1.0 falls in the last bin
    assert predicted.tolist() == pytest.approx([0.05, 0.15, 0.55, 0.975])
    assert observed.tolist() == [0.5, 0.0, 1.0, 1.0]
    assert ev.ece(p, failed) == pytest.approx((2 * 0.45 + 0.15 + 0.45 + 2 * 0.025) / 6)


def test_auc_orders_failures_above_successes() -> None:
    failed = np.array([0, 0, 1, 1], dtype=bool)
    assert ev.roc_auc(np.array([0.1, 0.2, 0.8, 0.9]), failed) == 1.0
    assert ev.roc_auc(np.array([0.9, 0.8, 0.2, 0.1]), failed) == 0.0
    assert ev.roc_auc(np.full(4, 0.5), failed) == 0.5


def _tier_at_price(p_fail: np.ndarray, costs: np.ndarray, price: float) -> int:
    """The module docstring's rule, one prompt at a time: argmin p_fail[t] + price * cost[t], ties to the cheaper."""
    objective = p_fail + price * costs
    return int(np.flatnonzero(objective <= objective.min() + 1e-12)[0])


def test_three_tier_curve_runs_from_cheapest_to_top_and_matches_each_prompts_tier_at_a_price() -> None:
    rng = np.random.default_rng(4)
    c = rng.random((400, 3)) < [0.4, 0.6, 0.8]
    p_fail = np.clip(1 - c + rng.normal(0, 0.4, c.shape), 0, 1)
    costs = np.array([1.0, 3.0, 10.0])
    curve = ev.routing_curve(p_fail, c, costs)
    assert curve.x[0] == 0 and curve.x[-1] == pytest.approx(1.0)
    assert curve.pgr[0] == 0 and curve.pgr[-1] == pytest.approx(1.0)
    assert np.all(np.diff(curve.x) >= 0)
    for price in (0.5, 0.05, 0.01):
        tiers = np.array([_tier_at_price(row, costs, price) for row in p_fail])
        x = (costs[tiers].mean() - costs[0]) / (costs[-1] - costs[0])
        quality = c[np.arange(len(c)), tiers].mean()
        assert np.interp(x, curve.x, curve.quality) == pytest.approx(quality, abs=1e-9)
    oracle = ev.apgr(ev.routing_curve(ev.oracle_scores(c), c, costs))
    assert oracle > ev.apgr(curve) > 0.5


def test_report_has_the_cli_contract_keys() -> None:
    rng = np.random.default_rng(5)
    c = rng.random((300, 2)) < [0.6, 0.85]
    report = ev.report(rng.random((300, 2)), c)
    assert {"n", "apgr", "auc", "ece", "cpt"} <= set(report)
    assert set(report["cpt"]) == {"50", "80", "95"}


def test_equal_tiers_give_null_apgr_not_nan() -> None:
    c = np.ones((10, 2), dtype=bool)
    report = ev.report(np.full((10, 2), 0.5), c)
    assert report["apgr"] is None and report["auc"] is None


def test_plot_writes_a_png(tmp_path) -> None:
    rng = np.random.default_rng(6)
    c = rng.random((200, 2)) < [0.6, 0.85]
    out = ev.plot_curves(tmp_path / "curve.png", rng.random((200, 2)), c, ["weak", "strong"])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tier_prior_is_the_diagonal_for_two_tiers_and_the_tier_hull_for_three() -> None:
    rng = np.random.default_rng(7)
    two = rng.random((400, 2)) < [0.6, 0.85]
    assert ev.report(rng.random((400, 2)), two)["prior_apgr"] == pytest.approx(0.5)
    # A middle tier as accurate as the top at half the cost: the prior's curve reaches PGR 1 at cost 0.5 and
    # stays there, area 0.25 + 0.5; a router that reads nothing in the prompt cannot do better.
    n = 400
    three = np.zeros((n, 3), dtype=bool)
    three[: n // 4, 1:] = True  # a quarter answered by both Qwen-like tiers, none by the cheapest
    report = ev.report(rng.random((n, 3)), rng.permutation(three))
    assert report["prior_apgr"] == pytest.approx(0.75)
    assert report["oracle_apgr"] > report["prior_apgr"]


def test_plot_of_three_tiers_draws_the_tier_prior(tmp_path) -> None:
    rng = np.random.default_rng(8)
    c = rng.random((120, 3)) < [0.1, 0.3, 0.4]
    p_fail = rng.random((120, 3))
    out = ev.plot_curves(tmp_path / "curve3.png", p_fail, c, ["a", "b", "c"])
    assert out.stat().st_size > 1000
    marked = ev.plot_curves(tmp_path / "marked.png", p_fail, c, ["a", "b", "c"],
                            points=[("fast", 0.4, 0.15), ("balanced", 0.8, 0.3), ("best", 0.8, 0.3)])
    from matplotlib.image import imread

    before, after = imread(out), imread(marked)
    changed = np.flatnonzero(np.abs(after - before).sum(axis=(0, 2)) > 0)
    assert before.shape == after.shape and changed.size and changed.max() < before.shape[1] * 0.6  # left panel only


@pytest.mark.parametrize("n_tiers", [2, 3])
def test_a_prompt_weighted_k_times_counts_like_k_copies_of_it(n_tiers: int) -> None:
    # The bootstrap reweights prompts instead of copying them; copies must give the same curve.
    rng = np.random.default_rng(7)
    c = rng.random((40, n_tiers)) < np.linspace(0.4, 0.9, n_tiers)
    p = rng.random((40, n_tiers))
    counts = rng.integers(0, 4, 40)
    copies = np.repeat(np.arange(40), counts)
    weighted = ev.routing_curve(p, c, ev.linear_costs(n_tiers), weights=counts)
    assert ev.apgr(weighted) == pytest.approx(ev.apgr(ev.routing_curve(p[copies], c[copies])), abs=1e-12)


def test_the_apgr_interval_holds_the_estimate_and_narrows_with_more_prompts() -> None:
    rng = np.random.default_rng(3)

    def sample(n: int) -> tuple[np.ndarray, np.ndarray]:
        difficulty = rng.random(n)
        c = np.column_stack([rng.random(n) > difficulty, rng.random(n) > difficulty / 4])
        return difficulty + rng.normal(0, 0.3, n), c

    widths = []
    for n in (200, 3200):
        score, c = sample(n)
        low, high = ev.apgr_interval(score, c)
        assert low < ev.apgr(ev.routing_curve(score, c)) < high
        widths.append(high - low)
    assert widths[1] < widths[0] / 2.5  # ~1/sqrt(n): 16x the prompts, ~4x narrower
    score, c = sample(300)
    assert ev.apgr_interval(score, c, seed=1) != ev.apgr_interval(score, c, seed=2)
    assert ev.apgr_interval(score, c, seed=1) == ev.apgr_interval(score, c, seed=1)


def test_the_interval_of_tiers_that_never_differ_is_undefined() -> None:
    assert all(np.isnan(ev.apgr_interval(np.full((10, 2), 0.5), np.ones((10, 2), dtype=bool))))
