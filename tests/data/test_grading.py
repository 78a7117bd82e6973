"""The shared grader on real GSM8K-style answers, multiple choice and plain text."""

from __future__ import annotations

import itertools

import pytest

from cascade.data.grading import answer_key, extract, final_number, grade, reference_answer
from tests.shared_data import shared_file

GSM8K_REFERENCE = ("Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\n"
                   "She makes 9 * 2 = $<<9*2=18>>18 every day at the farmer’s market.\n#### 18")

CASES = [
    # (response, reference, correct)
    ("Janet sells 16 - 3 - 4 = 9 eggs.\nShe makes 9 * 2 = $18 every day.\n#### 18", GSM8K_REFERENCE, True),
    ("She has 16 - 3 - 4 = 9 eggs left, so she makes 9 * $2 = $18 every day at the farmers' market.", GSM8K_REFERENCE, True),
    ("Step 1: 16 - 7 = 9.\nStep 2: 9 x 2 = 18.\nAnswer: $18", GSM8K_REFERENCE, True),
    ("The answer is 18 dollars.", "#### 18", True),
    ("She makes 9 * 2 = 18 dollars, then spends 3. Answer: 15", "#### 18", False),
    ("Therefore the final answer is \\boxed{42}.", "#### 42", True),
    ("**Answer:** 1,200", "#### 1200", True),
    ("The total cost is $1,234.50", "1234.5", True),
    ("It takes 2 + 1 = 3 bolts in total.", "#### 3", True),
    ("It takes 2/2 = 1 bolt of white fiber, so 2 + 1 = 3 bolts.\n#### 3", "#### 3", True),
    ("The temperature dropped to -5 degrees.", "#### -5", True),
    ("18.00", "#### 18", True),
    ("She answered 5 questions; the total score is 12.", "#### 12", True),
    ("Half of it is 5/2.", "2.5", True),
    ("The discount is 25%.", "#### 25", True),
    ("I cannot solve this.", "#### 18", False),
    ("", "#### 18", False),
    ("Answer: 70000", "#### 70,000", True),
    ("So he ran 3 * 60 = 180 meters a week.\nAnswer: 540", "#### 540", True),
    ("Answer: C", "C", True),
    ("The correct answer is (B) because light scatters.", "B", True),
    ("B", "B", True),
    ("Answer: **D**", "D", True),
    ("I think the answer is D.", "C", False),
    ("A. This type occurs in binary systems.", "A", True),
    ("Paris.", "Paris", True),
    ("The capital is Rome. Answer: paris", "Paris", True),
    ("Lyon", "Paris", False),
]


@pytest.mark.parametrize(("response", "reference", "correct"), CASES)
def test_grade_decides_like_a_careful_human(response: str, reference: str, correct: bool) -> None:
    assert grade(response, reference) is correct


def test_reference_answer_takes_the_part_after_the_gsm8k_marker() -> None:
    assert reference_answer(GSM8K_REFERENCE) == "18"
    assert reference_answer("  42 ") == "42"


def test_final_number_prefers_the_marked_answer_over_the_last_number() -> None:
    assert str(final_number("#### 7\nChecked in 3 steps")) == "7"
    assert str(final_number("Answer: 12 (about 3 hours)")) == "12"
    assert final_number("no digits here") is None


def test_extract_reports_what_was_read_in_the_reference_kind() -> None:
    assert extract("so she makes $18.00.", GSM8K_REFERENCE) == "18"
    assert extract("The answer is (C).", "C") == "C"
    assert extract("Answer: Paris!", "paris") == "paris"
    assert extract("nothing", "#### 18") is None


def test_real_gsm8k_references_grade_their_own_solutions_correct() -> None:
    from cascade.data.datasets import load_gsm8k

    prompts = load_gsm8k(shared_file("gsm8k", "test.jsonl"))[:200]
    assert all(p.reference and grade(p.reference, p.reference) for p in prompts)
    # and a solution never grades correct against a different answer
    wrong = sum(grade(a.reference or "", b.reference or "") for a, b in itertools.pairwise(prompts)
                if reference_answer(a.reference or "") != reference_answer(b.reference or ""))
    assert wrong == 0


@pytest.mark.parametrize(("response", "key"), [
    ("She pays 3 * 6 = $18.\n#### 18", "18"),
    ("The answer is 18.00 dollars.", "18"),
    ("so \\boxed{3/4}", "0.75"),
    ("Answer: (C) because the others fail", "C"),
    ("Answer: Paris.", "paris"),
    ("I think it is Paris\n\nFinal: paris!", "final: paris"),
    ("", None),
])
def test_answer_key_reads_answers_without_a_reference(response: str, key: str | None) -> None:
    assert answer_key(response) == key


def test_answers_with_equal_keys_grade_alike() -> None:
    reference = "#### 18"
    for a, b in [("#### 18", "The answer is $18.00"), ("Answer: 17", "so 17")]:
        assert answer_key(a) == answer_key(b) and grade(a, reference) == grade(b, reference)
