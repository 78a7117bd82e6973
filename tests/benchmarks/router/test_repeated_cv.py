"""benchmarks/router/repeated_cv.py and the repeated signals run: repeats of one router pool to its own interval, the
spread between splits widens the pooled interval, a router that knows the difficulty beats a random one and the
random-route null in every repeat, a fixed-view family's probe sees only its view, and each limit is refused."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from benchmarks.router.hidden_states import view_columns
from benchmarks.router.repeated_cv import (
    MAX_REPEATS,
    check_repeats,
    pooled,
    repeated_apgr,
    repeated_difference,
    repeated_versus_null,
    spread,
)
from benchmarks.router.signals import family_views
from benchmarks.router.signals_repeated import family_summary, view_counts
from cascade.router import evaluate as ev

TOKENS = np.array([100.0, 1000.0])


def two_tiers(n: int = 200, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A difficulty in [0, 1) per row: the weak tier answers the easy rows, the strong one nearly all."""
    rng = np.random.default_rng(seed)
    difficulty = rng.random(n)
    return difficulty, np.c_[rng.random(n) > difficulty, rng.random(n) > 0.1 * difficulty]


def knowing(difficulty: np.ndarray, noise: float, seed: int) -> np.ndarray:
    """p_fail of a router that reads the difficulty through some noise (one 'repeat' per seed)."""
    d = np.clip(difficulty + noise * np.random.default_rng(seed).standard_normal(len(difficulty)), 0, 1)
    return np.c_[d, 0.1 * d]


def random_router(n: int, seed: int) -> np.ndarray:
    u = np.random.default_rng(100 + seed).random(n)
    return np.c_[u, 0.1 * u]


def test_repeats_of_one_router_pool_to_its_single_bootstrap_interval() -> None:
    difficulty, correct = two_tiers()
    router, baseline = knowing(difficulty, 0.2, 0), random_router(len(difficulty), 0)
    single = repeated_difference([router], [baseline], correct)
    point, samples = ev.apgr_difference(router, baseline, correct, seed=0)
    assert single["mean"] == round(point, 4) and single["min"] == single["max"] == single["mean"]
    assert single["ci95"] == [round(float(v), 4) for v in np.percentile(samples, [2.5, 97.5])]


def test_identical_routers_differ_by_zero_in_every_repeat() -> None:
    difficulty, correct = two_tiers()
    routers = [knowing(difficulty, 0.2, s) for s in range(3)]
    report = repeated_difference(routers, routers, correct)
    assert report["mean"] == 0 and report["ci95"] == [0, 0] and report["repeats_whose_interval_excludes_0"] == 0


def test_a_knowing_router_beats_a_random_one_in_every_repeat() -> None:
    difficulty, correct = two_tiers()
    first = [knowing(difficulty, 0.2, s) for s in range(3)]
    second = [random_router(len(difficulty), s) for s in range(3)]
    report = repeated_difference(first, second, correct)
    assert report["ci95"][0] > 0 and report["repeats_whose_interval_excludes_0"] == 3
    assert report["min"] <= report["mean"] <= report["max"] and len(report["per_repeat"]) == 3
    apgr = repeated_apgr(first, correct, None)
    assert apgr["per_repeat"] == [round(ev.apgr(ev.routing_curve(p, correct)), 4) for p in first]


def test_the_spread_between_splits_widens_the_pooled_interval() -> None:
    rng = np.random.default_rng(0)
    samples = [rng.normal(centre, 0.01, 1000) for centre in (-0.05, 0.0, 0.05)]
    report = pooled([-0.05, 0.0, 0.05], samples)
    each = [np.percentile(s, 97.5) - np.percentile(s, 2.5) for s in samples]
    assert report["ci95"][1] - report["ci95"][0] > 2 * max(each)
    assert report["ci95"][0] < -0.05 and report["ci95"][1] > 0.05 and report["mean"] == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(arrays(np.float64, st.integers(1, 40), elements=st.floats(-1e300, 1e300)), min_size=1, max_size=6))
def test_pooled_intervals_are_ordered_whatever_the_samples(samples: list[np.ndarray]) -> None:
    points = [float(np.clip(s.mean() if np.isfinite(s.mean()) else 0.0, -1e300, 1e300)) for s in samples]
    report = pooled(points, samples)
    assert report["ci95"][0] <= report["ci95"][1] and report["min"] <= report["max"]


def test_best_beats_the_null_out_of_fold_in_every_repeat_and_tokens_are_optional() -> None:
    difficulty, correct = two_tiers(n=160)
    routers = [knowing(difficulty, 0.05, s) for s in range(2)]
    tokens = np.tile(TOKENS, (len(difficulty), 1))
    report = repeated_versus_null(routers, correct, costs=None, tokens=tokens, draws=100, resamples=300)
    saved = report["token_share"]["router_minus_null"]
    assert saved["ci95"][1] < 0 and len(saved["per_repeat"]) == 2  # fewer strong-tier tokens than the null
    assert report["accuracy"]["router"]["min"] > 0 and 0 < report["token_share"]["null_mean"] < 1
    without = repeated_versus_null(routers[:1], correct, costs=None, tokens=None, draws=100, resamples=300)
    assert without["token_share"] is None and without["cost"]["router_minus_null"]["ci95"][1] < 0


def test_a_repeat_is_reproduced_by_its_seed_and_repeats_differ() -> None:
    difficulty, correct = two_tiers(n=80)
    router = knowing(difficulty, 0.1, 0)
    twice = repeated_versus_null([router, router], correct, costs=None, tokens=None, draws=100, resamples=200)
    once = repeated_versus_null([router], correct, costs=None, tokens=None, draws=100, resamples=200)
    assert twice["cost"]["router_minus_null"]["per_repeat"][0] == once["cost"]["router_minus_null"]["mean"]
    per_repeat = twice["cost"]["router_minus_null"]["per_repeat"]
    assert per_repeat[0] != per_repeat[1]  # the same router: repeat r's null draws follow seed r


@pytest.mark.parametrize("repeats", [0, MAX_REPEATS + 1])
def test_repeats_outside_their_limits_are_refused(repeats: int) -> None:
    with pytest.raises(ValueError, match="repeats must be 1 to"):
        check_repeats(repeats)
    difficulty, correct = two_tiers(n=40)
    routers = [knowing(difficulty, 0.1, 0)] * repeats
    with pytest.raises(ValueError, match="repeats must be 1 to"):
        repeated_difference(routers, routers, correct)
    with pytest.raises(ValueError, match="repeats must be 1 to"):
        repeated_versus_null(routers, correct, costs=None, tokens=None, draws=100)


def test_mismatched_repeats_an_unknown_point_and_empty_samples_are_refused() -> None:
    difficulty, correct = two_tiers(n=40)
    router = knowing(difficulty, 0.1, 0)
    with pytest.raises(ValueError, match="2 repeats against 1"):
        repeated_difference([router, router], [router], correct)
    with pytest.raises(ValueError, match="no operating point named 'cheapest'"):
        repeated_versus_null([router], correct, costs=None, tokens=None, draws=100, hint="cheapest")
    with pytest.raises(ValueError, match="no finite bootstrap sample"):
        pooled([0.0], [np.array([np.nan])])
    with pytest.raises(ValueError, match="2 point estimates but 1"):
        pooled([0.0, 1.0], [np.zeros(3)])
    with pytest.raises(ValueError, match="one value per repeat"):
        spread([])


def test_a_fixed_view_family_probes_only_its_view_and_an_unknown_view_is_refused() -> None:
    views = view_columns(4)
    assert list(family_views("hidden last L18", views)) == ["last L18"]
    assert np.array_equal(family_views("hidden mean Lfinal", views)["mean Lfinal"], views["mean Lfinal"])
    assert family_views("hidden", views) is views and family_views("hidden_soft", views) is views
    with pytest.raises(ValueError, match="no view 'last L7'"):
        family_views("hidden last L7", views)


def test_a_family_summary_counts_the_views_chosen_and_scores_against_the_text_router() -> None:
    difficulty, correct = two_tiers(n=120)
    routers = [knowing(difficulty, 0.1, s) for s in range(2)]
    picks = [{"view": [None, "last L18"], "C": [None, 0.01]}, {"view": ["last L18", "mean Lfinal"], "C": [0.1, 0.1]}]
    summary = family_summary(routers, routers, correct, None, None, 0, picks)
    assert summary["views_chosen"] == {"last L18": 2, "mean Lfinal": 1} and "best_out_of_fold" not in summary
    assert summary["apgr_minus_text"]["mean"] == 0
    assert view_counts([{"k": [5], "m": [1.0]}]) == {}
