"""A ladder whose cheapest tier never succeeds (the embedded SmolLM2 on GSM8K) still trains the others."""

from __future__ import annotations

import numpy as np

from cascade.router.classifier import DifficultyClassifier
from tests.router.conftest import synthetic_outcomes


def test_tiers_above_a_never_correct_tier_are_still_learned() -> None:
    prompts, correct = synthetic_outcomes(n=120, seed=3)
    ladder = np.c_[np.zeros(len(prompts), dtype=bool), correct]  # tier 0 never right
    model = DifficultyClassifier().fit(prompts, ladder)
    assert np.isnan(model.C_[0]) and not np.isnan(model.C_[1:]).any()
    assert np.abs(model.coef_[1:]).sum() > 0
    p_fail = model.predict_p_fail(prompts)
    assert p_fail[:, 0].min() > 0.9  # the never-right tier: a smoothed constant near 1
    # The learned tiers rank the synthetic difficulty: longer prompts fail more often.
    lengths = np.array([len(p) for p in prompts])
    assert np.corrcoef(lengths, p_fail[:, 1])[0, 1] > 0.3
