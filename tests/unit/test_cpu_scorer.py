"""The embedded CPU scorer: arithmetic claims, repetition and length, in [0, 1]."""

from __future__ import annotations

import pytest

from cascade.branches.cpu_scorer import CPUScorer, claims, features
from cascade.branches.scoring import split_steps


@pytest.mark.parametrize(("text", "right", "wrong"), [
    ("She pays 3 * 6 = 18 dollars.", 1, 0),
    ("She pays 3 * 6 = 19 dollars.", 0, 1),
    ("$1,200 - $200 = $1,000 and 10% of 50 is 5", 1, 0),
    ("2 + 3 * 4 = 14, then 14 / 4 = 3.5, then 100 / 3 = 33.33", 3, 0),
    ("12 x 2 = 24 and 24 ÷ 4 = 7", 1, 1),
    ("no arithmetic here, just 42", 0, 0),
    ("divide 5 / 0 = 1", 0, 0),  # not checkable: not counted
])
def test_arithmetic_claims_are_recomputed(text: str, right: int, wrong: int) -> None:
    assert claims(text) == (right, wrong)


def test_wrong_arithmetic_and_loops_score_below_a_clean_derivation() -> None:
    scorer = CPUScorer()
    clean = split_steps("Each box has 3 * 6 = 18 eggs.\n\nTwo boxes: 18 * 2 = 36.\n\nAnswer: 36")
    wrong = split_steps("Each box has 3 * 6 = 19 eggs.\n\nTwo boxes: 19 * 2 = 38.\n\nAnswer: 38")
    looping = split_steps("\n\n".join(["Each box has 18 eggs."] * 8))
    assert scorer.score_steps(clean) > 0.5 > scorer.score_steps(wrong)
    assert scorer.score_steps(clean) > scorer.score_steps(looping)
    assert features(looping).repeated_steps == pytest.approx(7 / 8)
    assert all(0.0 <= scorer.score_steps(s) <= 1.0 for s in (clean, wrong, looping, []))
