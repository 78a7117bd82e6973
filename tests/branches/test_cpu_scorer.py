"""The embedded CPU scorer: arithmetic claims (plain and LaTeX), repetition, length and the question, in [0, 1]."""

from __future__ import annotations

import pytest

from cascade.branches.cpu_scorer import CPUScorer, features
from cascade.branches.scoring import split_steps


@pytest.mark.parametrize(("text", "right", "wrong"), [
    ("She pays 3 * 6 = 18 dollars.", 1, 0),
    ("She pays 3 * 6 = 19 dollars.", 0, 1),
    ("$1,200 - $200 = $1,000 and 10% of 50 is 5", 1, 0),
    ("2 + 3 * 4 = 14, then 14 / 4 = 3.5, then 100 / 3 = 33.33", 3, 0),
    ("12 x 2 = 24 and 24 ÷ 4 = 7", 1, 1),
    ("no arithmetic here, just 42", 0, 0),
    ("divide 5 / 0 = 1", 0, 0),  # not checkable: not counted
    (r"\[ \frac{2100}{300} = 7 \text{ weeks} \]", 1, 0),
    (r"\[ 100 + 100 + 100 = 300 \text{ pages} \]", 1, 0),
    (r"\( 12 \times 3 = 38 \) and \( 10 \cdot 2 = 20 \) and \( 9 \div 3 = 3 \)", 2, 1),
])
def test_arithmetic_claims_are_recomputed(text: str, right: int, wrong: int) -> None:
    found = features([text])
    assert (found.right_claims, found.wrong_claims) == (right, wrong)


def test_wrong_arithmetic_and_loops_score_below_a_clean_derivation() -> None:
    scorer = CPUScorer()
    clean = split_steps("Each box has 3 * 6 = 18 eggs.\n\nTwo boxes: 18 * 2 = 36.\n\nAnswer: 36")
    wrong = split_steps("Each box has 3 * 6 = 19 eggs.\n\nTwo boxes: 19 * 2 = 38.\n\nAnswer: 38")
    looping = split_steps("\n\n".join(["Each box has 18 eggs."] * 8))
    assert scorer.score_steps(clean) > 0.5 > scorer.score_steps(wrong)
    assert scorer.score_steps(clean) > scorer.score_steps(looping)
    assert features(looping).repeated_steps == pytest.approx(7 / 8)
    assert all(0.0 <= scorer.score_steps(s) <= 1.0 for s in (clean, wrong, looping, []))


def test_question_numbers_used_and_invented_numbers_are_measured() -> None:
    question = "Tom has 12 apples and 5 pears. He buys 7 more apples. How many fruits?"
    steps = ["Tom has 12 apples and 5 pears.", "12 + 7 = 19 apples.", "Then 250 more from nowhere."]
    f = features(steps, question)
    assert f.question_numbers == 3
    assert f.question_coverage == pytest.approx(3 / 3)
    # Large numbers: 12, 19 (computed by a claim) and 250 (neither given nor computed).
    assert f.foreign_numbers == pytest.approx(1 / 3)
    assert features(steps[:1], question).question_coverage == pytest.approx(2 / 3)


def test_the_same_trace_scores_lower_on_a_longer_number_heavier_question() -> None:
    scorer = CPUScorer()
    steps = ["Each box has 3 * 6 = 18 eggs."]
    easy = "A box has 3 rows of 6 eggs. How many eggs?"
    hard = ("A farm ships 3 rows of 6 eggs per box, 14 boxes per crate and 9 crates per truck; 2 trucks "
            "break 25 eggs each, and the farm keeps 40% of the rest for its 11 shops. How many are sold?")
    assert scorer.score_steps(steps, easy) > scorer.score_steps(steps, hard)
