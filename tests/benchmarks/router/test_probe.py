"""benchmarks/router/probe.py: the per-tier logistic probe picks the view that carries the signal by the training
rows' CV, a tier with too few failures is a smoothed constant, a soft target weighs each row by its rate, and each
limit is refused."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from benchmarks.router.probe import MAX_VIEWS, MIN_MINORITY, P_MIN, ProbeFailure, fit_logistic

VIEWS = {"noise": np.arange(0, 5), "signal": np.arange(5, 10)}


def rows(n: int = 160, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Columns 0-4 noise, 5-9 carry a difficulty; tier 0 fails on hard rows, tier 1 fails 3 times in all."""
    rng = np.random.default_rng(seed)
    difficulty = rng.standard_normal(n)
    X = np.c_[rng.standard_normal((n, 5)), difficulty[:, None] + 0.5 * rng.standard_normal((n, 5))]
    failed = np.c_[rng.random(n) < 1 / (1 + np.exp(-2 * difficulty)), np.arange(n) < 3]
    return X, failed


def test_the_view_that_carries_the_signal_is_chosen_and_ranks_held_out_rows() -> None:
    X, failed = rows()
    probe = ProbeFailure(VIEWS).fit(X[:120], failed[:120])
    assert probe.view_[0] == "signal"
    p = probe.predict_p_fail(X[120:])[:, 0]
    hard = failed[120:, 0]
    assert p[hard].mean() > p[~hard].mean() + 0.2


def test_a_tier_with_fewer_failures_than_the_minimum_is_its_smoothed_rate() -> None:
    X, failed = rows()
    assert failed[:, 1].sum() < MIN_MINORITY
    probe = ProbeFailure(VIEWS).fit(X, failed)
    assert probe.view_[1] is None
    assert np.allclose(probe.predict_p_fail(X[:4])[:, 1], (3 + 1) / (len(X) + 2))


def test_a_fractional_target_is_the_same_fit_as_weighted_duplicate_rows() -> None:
    X, _ = rows(60)
    rate = np.linspace(0, 1, 60)
    fitted = fit_logistic(X, rate, 0.1)
    from sklearn.linear_model import LogisticRegression

    twice = np.r_[X, X]
    reference = LogisticRegression(C=0.1, max_iter=2000).fit(
        twice, np.r_[np.ones(60, bool), np.zeros(60, bool)], sample_weight=np.r_[rate, 1 - rate])
    assert np.allclose(fitted.coef_, reference.coef_, atol=1e-4)


def test_soft_labels_change_only_the_fit_of_the_tier_that_has_them() -> None:
    X, failed = rows()
    soft = np.full(failed.shape, np.nan)
    soft[:, 0] = np.clip(failed[:, 0] * 0.8 + 0.1, 0, 1)
    hard, softened = ProbeFailure(VIEWS).fit(X, failed), ProbeFailure(VIEWS).fit(X, failed, soft)
    assert not np.allclose(hard.coef_[0], softened.coef_[0])
    assert np.allclose(hard.predict_p_fail(X)[:, 1], softened.predict_p_fail(X)[:, 1])


@settings(max_examples=25, deadline=None)
@given(X=arrays(float, (40, 4), elements=st.one_of(st.floats(-1e12, 1e12), st.just(0.0))),
       queries=arrays(float, (3, 4), elements=st.floats(-1e300, 1e300)))
def test_predictions_are_probabilities_for_huge_and_constant_columns(X: np.ndarray, queries: np.ndarray) -> None:
    failed = np.c_[np.arange(40) % 2 == 0, np.arange(40) < 20]
    p = ProbeFailure({"a": [0, 1], "b": [2, 3]}, Cs=(0.01,)).fit(X, failed).predict_p_fail(queries)
    assert p.shape == (3, 2) and np.all((p >= P_MIN) & (p <= 1 - P_MIN))


@pytest.mark.parametrize("views, Cs, cv", [({}, (1.0,), 5), ({"a": []}, (1.0,), 5), ({"a": [0]}, (), 5),
                                          ({"a": [0]}, (0.0,), 5), ({"a": [0]}, (1.0,), 1),
                                          ({str(i): [0] for i in range(MAX_VIEWS + 1)}, (1.0,), 5)])
def test_bad_settings_are_refused(views: dict, Cs: tuple, cv: int) -> None:
    with pytest.raises(ValueError):
        ProbeFailure(views, Cs=Cs, cv=cv)


def test_soft_rates_outside_zero_one_are_refused() -> None:
    X, failed = rows(40)
    with pytest.raises(ValueError, match="rates in"):
        ProbeFailure(VIEWS).fit(X, failed, np.full(failed.shape, 1.5))
