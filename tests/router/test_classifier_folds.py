"""A ladder whose cheapest tier never succeeds (the embedded SmolLM2 on GSM8K) still trains the others."""

from __future__ import annotations

import numpy as np

from cascade.router.classifier import DifficultyClassifier
from cascade.router.train import fit_classifier
from tests.router.conftest import synthetic_outcomes


def test_tiers_above_a_never_correct_tier_are_still_learned() -> None:
    prompts, correct = synthetic_outcomes(n=120, seed=3)
    ladder = np.c_[np.zeros(len(prompts), dtype=bool), correct]  # tier 0 never right
    model = fit_classifier(DifficultyClassifier(), prompts, ladder)
    assert np.isnan(model.C_[0]) and not np.isnan(model.C_[1:]).any()
    assert np.abs(model.coef_[1:]).sum() > 0
    p_fail = model.predict_p_fail(prompts)
    assert p_fail[:, 0].min() > 0.9  # the never-right tier: a smoothed constant near 1
    # The learned tiers rank the synthetic difficulty: longer prompts fail more often.
    lengths = np.array([len(p) for p in prompts])
    assert np.corrcoef(lengths, p_fail[:, 1])[0, 1] > 0.3


def test_cross_validated_p_fail_stratifies_on_a_tier_that_fills_every_fold() -> None:
    """Tier 0 right only twice in 120 (fewer than the 5 folds): the folds stratify on tier 1 instead, so sklearn
    has no class too small to split (pytest turns its warning into a failure) and tier 1's failures spread."""
    import warnings

    from sklearn.model_selection import StratifiedKFold

    from cascade.router.train.estimator import cross_validated_p_fail

    prompts, correct = synthetic_outcomes(n=120, seed=4)
    ladder = np.c_[np.zeros(len(prompts), dtype=bool), correct]
    ladder[[5, 77], 0] = True
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p_fail = cross_validated_p_fail(DifficultyClassifier(C=0.01), prompts, ladder, folds=5, seed=0)
    assert p_fail.shape == ladder.shape and np.isfinite(p_fail).all()
    folds = StratifiedKFold(5, shuffle=True, random_state=0).split(prompts, ladder[:, 1])
    per_fold = [int((~ladder[test, 1]).sum()) for _, test in folds]
    assert max(per_fold) - min(per_fold) <= 1


def test_outer_splits_are_the_folds_cross_validation_scores_on() -> None:
    """Benchmarks score other estimators on `outer_splits`: each row is held out exactly once, grouped folds keep a
    group on one side, and the stratified ones follow the seed."""
    from cascade.router.train.estimator import outer_splits

    _, correct = synthetic_outcomes(n=60, seed=4)
    for groups in (None, [f"g{i % 7}" for i in range(60)]):
        splits = outer_splits(correct, groups, folds=5, seed=1)
        held_out = np.sort(np.concatenate([test for _, test in splits]))
        assert len(splits) == 5 and np.array_equal(held_out, np.arange(60))
        if groups is not None:
            for train, test in splits:
                assert not {groups[i] for i in train} & {groups[i] for i in test}
    first, again = outer_splits(correct, seed=1), outer_splits(correct, seed=1)
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(first, again, strict=True))
