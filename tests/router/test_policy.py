"""Quality hints and thresholds -> tier."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cascade.errors import InvalidRequest
from cascade.router.heuristic import heuristic_difficulty
from cascade.router.policy import (
    Assessment,
    HeuristicSignal,
    QualityHint,
    RoutingPolicy,
    default_operating_points,
    out_of_domain_note,
    parse_hint,
    thresholds_for_target,
    tier_for,
)


@pytest.mark.parametrize(("raw", "expected"), [
    ("fast", QualityHint(name="fast")), ("BEST", QualityHint(name="best")), (" balanced ", QualityHint(name="balanced")),
    (0.9, QualityHint(target=0.9)), ("0.75", QualityHint(target=0.75)), (1, QualityHint(target=1.0)),
    (None, None), ("", None),
])
def test_hints_parse_in_all_forms(raw, expected) -> None:
    assert parse_hint(raw) == expected


@pytest.mark.parametrize("raw", ["fastest", 0, -0.5, 1.5, "nan", True, float("inf")])
def test_bad_hints_are_rejected_naming_the_param(raw) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_hint(raw, "quality")
    assert info.value.param == "quality"


def test_low_difficulty_routes_to_cheapest_tier() -> None:
    assert tier_for(0.05, [0.3, 0.6]) == 0
    assert tier_for(0.45, [0.3, 0.6]) == 1
    assert tier_for(0.95, [0.3, 0.6]) == 2


def test_named_operating_points_span_the_ladder() -> None:
    policy = RoutingPolicy(3)
    for difficulty in (0.0, 0.5, 0.99):
        assert tier_for(difficulty, policy.thresholds(QualityHint(name="fast"))) == 0
        assert tier_for(difficulty, policy.thresholds(QualityHint(name="best"))) == 2
    assert tier_for(0.1, policy.thresholds(QualityHint(name="balanced"))) == 0
    assert tier_for(0.9, policy.thresholds(QualityHint(name="balanced"))) == 2


def test_higher_accuracy_target_never_routes_cheaper() -> None:
    policy = RoutingPolicy(3)
    for difficulty in (0.1, 0.4, 0.7, 0.95):
        tiers = [tier_for(difficulty, policy.thresholds(QualityHint(target=q))) for q in (0.1, 0.5, 0.8, 0.95, 1.0)]
        assert tiers == sorted(tiers)
        assert tiers[-1] == 2


def test_configured_operating_points_override_defaults() -> None:
    policy = RoutingPolicy(2, {"balanced": [0.9], "0.8": [0.2]})
    assert tier_for(0.5, policy.thresholds(QualityHint(name="balanced"))) == 0
    assert tier_for(0.5, policy.thresholds(QualityHint(target=0.8))) == 1
    assert policy.thresholds(QualityHint(name="fast")) == [math.inf]


def test_arithmetic_word_problem_is_harder_than_chitchat() -> None:
    easy = heuristic_difficulty("Say hello.")
    hard = heuristic_difficulty(
        "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
        "How many clips did Natalia sell altogether in April and May?"
    )
    assert 0.0 <= easy < hard < 1.0


class _OutOfDomainSignal:
    """A learned-router stand-in whose every prompt is out of its domain (the policy seam's contract)."""

    name = "learned"

    def assess(self, text: str) -> Assessment:
        return Assessment(difficulty=0.9, score=5.0, p_fail=(0.9, 0.5, 0.1), out_of_domain=True)

    def operating_points(self) -> dict[str, list[float]]:
        return {"balanced": [10.0, 20.0], "best": [10.0, 20.0]}

    def thresholds_for_target(self, target: float) -> list[float] | None:
        return [10.0, 20.0]


@pytest.mark.parametrize("hint", [QualityHint(name="fast"), QualityHint(name="balanced"), QualityHint(name="best"),
                                  QualityHint(target=0.5), QualityHint(target=1.0)])
def test_an_out_of_domain_prompt_is_routed_by_the_heuristic_with_its_default_thresholds(hint) -> None:
    policy = RoutingPolicy(3, signal=_OutOfDomainSignal())
    text = "Write a haiku about autumn leaves."
    route = policy.route(text, hint)
    expected = HeuristicSignal().assess(text)
    assert route.router == "heuristic" and route.assessment.out_of_domain
    assert route.assessment.score == expected.score and route.assessment.p_fail == (0.9, 0.5, 0.1)
    thresholds = (default_operating_points(3)[hint.name] if hint.name else thresholds_for_target(hint.target, 3))
    assert route.thresholds == thresholds and route.tier == tier_for(expected.score, thresholds)


@pytest.mark.parametrize("hint", [QualityHint(name="fast"), QualityHint(name="balanced"), QualityHint(name="best")])
def test_an_out_of_domain_route_says_the_heuristic_chose_its_tier_not_the_p_fail_it_reports(hint) -> None:
    names = ["small", "medium", "large"]
    route = RoutingPolicy(3, signal=_OutOfDomainSignal()).route("Write a haiku about autumn leaves.", hint)
    note = out_of_domain_note(route, names)
    assert note is not None and note.startswith("out of domain:") and "p_fail" in note
    assert f"chose `{names[route.tier]}`" in note and f"difficulty {route.assessment.score:.2f}" in note
    # `fast`'s thresholds are never reached (infinite): said in words, not as `inf`
    assert ("never, never" in note) == (hint.name == "fast") and "inf" not in note


def test_an_in_domain_or_pinned_route_has_no_out_of_domain_note() -> None:
    route = RoutingPolicy(3).route("What is 2 + 2?", QualityHint(name="balanced"))
    assert not route.assessment.out_of_domain
    assert out_of_domain_note(route, ["a", "b", "c"]) is None and out_of_domain_note(None, ["a", "b", "c"]) is None


NOTE_SHAPE = re.compile(r"out of domain: the prompt is unlike the learned router's training prompts, so its p_fail "
                        r"\(reported\) was not used; the heuristic's difficulty \d\.\d\d against the default "
                        r"thresholds \[(?:\d\.\d\d|never)(?:, (?:\d\.\d\d|never))*\] chose `(?:small|medium|large)`")
# Hostile prompts: long runs, deep brackets, huge numbers, mixed text.
HOSTILE = st.one_of(
    st.integers(1, 20_000).map(lambda n: "a" * n),
    st.integers(1, 2_000).map(lambda n: "[" * n + "]" * n),
    st.integers(10**30, 10**60).map(lambda n: f"What is {n} + {n}?"),
    st.text(max_size=2_000),
)


@settings(max_examples=60, deadline=None)
@given(prompt=HOSTILE, hint=st.sampled_from([QualityHint(name="fast"), QualityHint(name="balanced"),
                                             QualityHint(name="best"), QualityHint(target=0.5)]))
def test_the_out_of_domain_note_is_short_and_never_repeats_the_prompt(prompt: str, hint: QualityHint) -> None:
    route = RoutingPolicy(3, signal=_OutOfDomainSignal()).route(prompt, hint)
    note = out_of_domain_note(route, ["small", "medium", "large"])
    assert note is not None and len(note) < 300
    # numbers and tier names only, whatever the prompt: one fixed sentence around them
    assert NOTE_SHAPE.fullmatch(note), note
