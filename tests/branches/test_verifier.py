"""The verifier scorer's model-free parts (cascade/branches/verifier.py): the Yes/No token lookup, the score
from their logits, the judging prompt, and reading a PRM input back into (question, steps)."""

from __future__ import annotations

import math

import pytest

from cascade.branches.prm_client import STEP_MARKER, prm_input
from cascade.branches.verifier import (
    JUDGE_QUESTION,
    SELF_QUESTION,
    answer_token_ids,
    judge_messages,
    parse_prm_input,
    yes_probability,
)


class WordTokenizer:
    """A tokenizer from a fixed table: each text maps to its listed ids (unknown texts: one id per char)."""

    def __init__(self, table: dict[str, list[int]]) -> None:
        self.table = table

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        assert add_special_tokens is False  # the answer's first token, no BOS in front of it
        return self.table.get(text, [1000 + ord(c) for c in text])


def test_answer_ids_are_the_first_token_of_each_spelling_deduplicated() -> None:
    tokenizer = WordTokenizer({"Yes": [10], " Yes": [11], "yes": [10], " yes": [12, 99],
                               "No": [20], " No": [21], "no": [22], " no": [21]})
    assert answer_token_ids(tokenizer) == ([10, 11, 12], [20, 21, 22])


def test_a_first_token_both_sides_share_is_dropped_from_both() -> None:
    # A tokenizer that splits " Yes" into " " + "Yes" and " No" into " " + "No": " " says neither.
    tokenizer = WordTokenizer({"Yes": [10], " Yes": [5, 10], "yes": [12], " yes": [5, 12],
                               "No": [20], " No": [5, 20], "no": [22], " no": [5, 22]})
    yes, no = answer_token_ids(tokenizer)
    assert 5 not in yes and 5 not in no and yes == [10, 12] and no == [20, 22]


def test_a_tokenizer_without_distinct_answer_tokens_is_refused() -> None:
    same = WordTokenizer({s: [7] for s in ("Yes", " Yes", "yes", " yes", "No", " No", "no", " no")})
    with pytest.raises(ValueError, match="no distinct first tokens"):
        answer_token_ids(same)


@pytest.mark.parametrize(("yes", "no", "expected"), [
    ([0.0], [0.0], 0.5),
    ([0.0, 0.0], [0.0], 2 / 3),  # P(yes) sums over its spellings
    ([math.log(3)], [0.0], 0.75),
    ([1000.0], [0.0], 1.0),  # no overflow
    ([-1000.0], [0.0], 0.0),
    ([-math.inf], [0.0], 0.0),
    ([-math.inf], [-math.inf], 0.5),  # neither possible: no opinion
])
def test_score_is_yes_probability_among_yes_and_no(yes: list[float], no: list[float], expected: float) -> None:
    assert yes_probability(yes, no) == pytest.approx(expected, abs=1e-12)


def test_score_rises_with_the_yes_logit() -> None:
    scores = [yes_probability([z], [0.5, -1.0]) for z in (-3.0, -1.0, 0.0, 2.0, 5.0)]
    assert scores == sorted(scores) and all(0 < s < 1 for s in scores)


@pytest.mark.parametrize("steps", [
    ["12 + 7 = 19 apples."],
    ["First, 3*4 = 12.", "Then 2 + 12 = 14.\nSo the answer is \\boxed{14}."],
    ["∑ 🍎 \\frac{1}{0}", "line one\nline two", "x" * 500],
])
def test_a_prm_input_reads_back_as_its_question_and_steps(steps: list[str]) -> None:
    question = "Tom has 12 apples.\nHe buys 7 more.\n\nHow many apples does he have?"
    assert parse_prm_input(prm_input(question, steps)) == (question, steps)


def test_markers_inside_a_step_are_cleaned_by_the_client_not_read_as_steps() -> None:
    assert parse_prm_input(prm_input("Q?", [f"a {STEP_MARKER} b", "c"])) == ("Q?", ["a  b", "c"])


@pytest.mark.parametrize(("text", "why"), [
    ("What is 2 + 2?", "not a PRM input"),
    ("<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\nA<extra_0>", "not a PRM input"),  # no system turn
    (prm_input("Q?", ["a", "b"]) + "c", "must end right after"),  # a step after the last marker
    (prm_input("Q?", ["a"]) + "<|im_end|>\n", "must end right after"),  # the full rendering, not cut
])
def test_text_that_is_not_a_prm_input_is_refused_with_the_reason(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_prm_input(text)


def test_the_judge_sees_the_question_the_steps_in_order_and_then_the_question_to_answer() -> None:
    [message] = judge_messages("  What is 2 + 3 * 4?\n", ["3 * 4 = 12.", "  ", "2 + 12 = 14."])
    content = message["content"]
    assert message["role"] == "user" and content.endswith(JUDGE_QUESTION)
    assert "What is 2 + 3 * 4?\n\nSolution so far:\n3 * 4 = 12.\n\n2 + 12 = 14.\n\n" in content


def test_the_judge_of_a_branch_without_steps_says_so() -> None:
    assert "(no steps yet)" in judge_messages("Q?", [])[0]["content"]


def test_the_self_prompt_shows_the_steps_as_the_models_own_answer_then_asks() -> None:
    messages = judge_messages("Q?", ["a", "b"], prompt="self")
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"] == "a\n\nb" and messages[2]["content"] == SELF_QUESTION
