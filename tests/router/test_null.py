"""The random-route null and nested operating points (cascade/router/train/null.py): the null's calibration hits its
target, a router that knows the answer beats it with an interval above 0 and a random one does not, nested thresholds
never see their held-out fold, limits, seeds."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from cascade.router.operating import chosen_tiers
from cascade.router.train.calibration import HINT_GAP_RECOVERED, named_thresholds
from cascade.router.train.null import (
    MAX_DRAWS,
    MAX_FOLDS,
    MIN_DRAWS,
    MIN_FOLDS,
    NullReport,
    fold_of_rows,
    named_picks,
    nested_thresholds,
    null_samples,
    random_null,
)

TOKENS = np.array([100.0, 1000.0])  # the strong tier decodes ten times the weak one's tokens


def two_tiers(n: int = 300, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of a true difficulty in [0, 1): the weak tier answers the easy ones, the strong one nearly all."""
    rng = np.random.default_rng(seed)
    difficulty = rng.random(n)
    correct = np.c_[rng.random(n) > difficulty, rng.random(n) > 0.1 * difficulty]
    return difficulty, correct, np.tile(TOKENS, (n, 1))


def test_the_null_calibrated_on_its_rows_reaches_each_hints_target_there() -> None:
    _, correct, _ = two_tiers()
    q_low, q_best = correct.mean(axis=0)
    for seed in range(5):
        scores = np.random.default_rng(seed).random(len(correct))
        for hint, tiers in named_picks(scores, correct, None, None).items():
            target = q_low + HINT_GAP_RECOVERED[hint] * (q_best - q_low)
            assert correct[np.arange(len(tiers)), tiers].mean() >= target - 1e-9, (seed, hint)


def test_a_router_that_knows_the_difficulty_beats_the_null_out_of_fold() -> None:
    difficulty, correct, tokens = two_tiers()
    report = random_null(difficulty, correct, tokens=tokens, tiers=["weak", "strong"], seed=1)
    best = next(p for p in report.points if p.name == "best")
    for versus in (best.in_sample, best.out_of_fold):
        assert versus.router_minus_null.token_share.ci95[1] < 0, versus  # the same accuracy for fewer of the strong tier's tokens
        assert versus.router.token_share < versus.null.token_share.ci95[0]
    assert report.token_reference == "strong"


def test_a_random_router_is_not_told_apart_from_the_null() -> None:
    _, correct, tokens = two_tiers()
    scores = np.random.default_rng(99).random(len(correct))
    report = random_null(scores, correct, tokens=tokens, seed=2)
    for point in report.points:
        for versus in (point.in_sample, point.out_of_fold):
            for interval in (versus.router_minus_null.accuracy, versus.router_minus_null.token_share):
                low, high = interval.ci95
                assert low <= 0 <= high, (point.name, interval)


def test_nested_thresholds_never_see_their_held_out_fold() -> None:
    scores, correct, _ = two_tiers(n=120)
    fold = fold_of_rows(len(scores), 4, seed=0)
    before = nested_thresholds(scores, correct, None, fold)
    rng = np.random.default_rng(5)
    for k in range(4):
        held_out = fold == k
        changed_scores, changed_correct = scores.copy(), correct.copy()
        changed_scores[held_out] = rng.random(held_out.sum())
        changed_correct[held_out] = ~changed_correct[held_out]
        after = nested_thresholds(changed_scores, changed_correct, None, fold)
        assert after[k] == before[k]  # fold k's thresholds: unchanged whatever its own rows hold
        assert any(after[j] != before[j] for j in range(4) if j != k)  # the others did read those rows
    # Each fold's thresholds are the calibration of the other folds' rows alone.
    assert before[2] == named_thresholds(scores[fold != 2], correct[fold != 2])


def test_nested_picks_route_each_fold_by_its_own_thresholds() -> None:
    scores, correct, _ = two_tiers(n=120)
    fold = fold_of_rows(len(scores), 3, seed=4)
    picks = named_picks(scores, correct, None, fold)
    for k, named in enumerate(nested_thresholds(scores, correct, None, fold)):
        for hint, thresholds in named.items():
            assert np.array_equal(picks[hint][fold == k], chosen_tiers(scores[fold == k], np.array(thresholds)))


def test_folds_are_seeded_and_within_one_row_of_each_other_in_size() -> None:
    fold = fold_of_rows(103, 5, seed=3)
    assert np.array_equal(fold, fold_of_rows(103, 5, seed=3)) and not np.array_equal(fold, fold_of_rows(103, 5, 4))
    sizes = np.bincount(fold)
    assert len(sizes) == 5 and sizes.max() - sizes.min() <= 1


def test_a_seed_reproduces_the_report_and_another_moves_the_null() -> None:
    difficulty, correct, tokens = two_tiers(n=100)
    first = random_null(difficulty, correct, tokens=tokens, seed=7)
    assert msgspec.json.encode(first) == msgspec.json.encode(random_null(difficulty, correct, tokens=tokens, seed=7))
    other = random_null(difficulty, correct, tokens=tokens, seed=8)
    assert other.points[-1].out_of_fold.null != first.points[-1].out_of_fold.null


def test_unknown_tokens_leave_token_shares_out_and_costs_in() -> None:
    difficulty, correct, tokens = two_tiers(n=80)
    tokens[3, 1] = np.nan
    report = random_null(difficulty, correct, tokens=tokens, costs=np.array([1.0, 4.0]))
    assert report.token_reference is None
    versus = report.points[0].out_of_fold
    assert versus.router.token_share is None and versus.null.token_share is None
    assert 1.0 <= versus.router.cost <= 4.0 and versus.router_minus_null.cost.ci95[0] <= versus.router_minus_null.cost.mean


@pytest.mark.parametrize("draws, folds", [(MIN_DRAWS - 1, 5), (MAX_DRAWS + 1, 5), (MIN_DRAWS, MIN_FOLDS - 1),
                                          (MIN_DRAWS, MAX_FOLDS + 1)])
def test_draws_and_folds_outside_their_limits_are_refused(draws: int, folds: int) -> None:
    difficulty, correct, _ = two_tiers(n=60)
    with pytest.raises(ValueError, match=r"draws|folds"):
        random_null(difficulty, correct, draws=draws, folds=folds)


def test_too_few_rows_for_the_folds_are_refused() -> None:
    difficulty, correct, _ = two_tiers(n=9)
    with pytest.raises(ValueError, match="at least 10 rows"):
        random_null(difficulty, correct, folds=5)


def test_the_report_round_trips_through_json_as_cards_carry_it() -> None:
    difficulty, correct, tokens = two_tiers(n=60)
    report = random_null(difficulty, correct, tokens=tokens)
    assert msgspec.convert(msgspec.to_builtins(report), NullReport) == report
    assert [p.name for p in report.points] == list(HINT_GAP_RECOVERED) and report.draws == MIN_DRAWS


def test_the_samples_are_what_the_report_summarises() -> None:
    difficulty, correct, tokens = two_tiers(n=120)
    report = random_null(difficulty, correct, tokens=tokens, seed=4)
    samples = null_samples(difficulty, correct, tokens=tokens, seed=4)
    assert list(samples) == [p.name for p in report.points]
    for point in report.points:
        s = samples[point.name]["out_of_fold"]
        assert s.null.shape == (report.draws, 3) and s.differences.shape == (report.resamples, 3)
        assert point.out_of_fold.router.accuracy == round(float(s.router[0]), 4)
        assert point.out_of_fold.null.token_share is not None
        assert point.out_of_fold.null.token_share.mean == round(float(s.null[:, 2].mean()), 4)
        assert point.out_of_fold.router_minus_null.accuracy.ci95 == [
            round(float(v), 4) for v in np.percentile(s.differences[:, 0], [2.5, 97.5])]
