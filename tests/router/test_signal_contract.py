"""One contract for every RoutingSignal (cascade/router/policy.py): the heuristic, the random-route null (without
and with the tiers' accuracies), and the learned router as committed in models/routers/ (one per training set).

The promises: a name; `assess` is deterministic, total (empty, foreign, huge prompts) and in range
(difficulty and score in [0, 1], p_fail one probability per tier, cheapest first); its operating points
and target thresholds are ascending, one per tier but the last, and a higher accuracy target never
raises a threshold (a signal that can meet no target refuses every one as the client's error); a prompt
flagged out of domain is routed by the heuristic instead.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from cascade.errors import InvalidRequest
from cascade.router.learned import LearnedSignal
from cascade.router.policy import NAMED_HINTS, HeuristicSignal, QualityHint, RoutingPolicy, RoutingSignal
from cascade.router.random_split import RandomSignal

ROUTERS = Path(__file__).parents[2] / "models" / "routers"
IN_DOMAIN = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
             "How many clips did Natalia sell altogether in April and May?")
PROMPTS = [IN_DOMAIN, "What is 2+2?", "", "Écris un poème sur la mer 🌊", "word " * 5000]
FOREIGN = "Écris un poème sur la mer 🌊"  # neither arithmetic nor English: outside any GSM8K training set


@dataclass(frozen=True)
class Flavor:
    make: Callable[[], RoutingSignal]
    n_tiers: int
    checks_domain: bool  # whether it can flag a prompt as out of its training domain


def learned(name: str) -> Callable[[], RoutingSignal]:
    def make() -> RoutingSignal:
        tiers = json.loads((ROUTERS / name / "card.json").read_text())["tiers"]
        return LearnedSignal.load(ROUTERS / name, tiers)

    return make


def n_tiers_of(name: str) -> int:
    return len(json.loads((ROUTERS / name / "card.json").read_text())["tiers"])


FLAVORS = {
    "heuristic": Flavor(HeuristicSignal, 3, checks_domain=False),
    "random": Flavor(lambda: RandomSignal(seed=5), 3, checks_domain=False),
    "random-accuracies": Flavor(lambda: RandomSignal(seed=5, accuracies=[0.3, 0.55, 0.8]), 3, checks_domain=False),
    **{f"learned-{p.name}": Flavor(learned(p.name), n_tiers_of(p.name), checks_domain=True)
       for p in sorted(ROUTERS.iterdir()) if (p / "card.json").is_file()},
}


@dataclass(frozen=True)
class Subject:
    signal: RoutingSignal
    flavor: Flavor


@pytest.fixture(scope="module", params=sorted(FLAVORS))
def subject(request: pytest.FixtureRequest) -> Subject:
    # Module scope: a learned router takes seconds to load and is read-only once loaded.
    flavor = FLAVORS[request.param]
    return Subject(flavor.make(), flavor)


def test_the_committed_routers_are_all_in_the_contract() -> None:
    assert {name for name in FLAVORS if name.startswith("learned-")} >= {"learned-embedded-gsm8k", "learned-routellm-gsm8k"}


def test_a_signal_has_a_name(subject: Subject) -> None:
    assert isinstance(subject.signal.name, str) and subject.signal.name


@pytest.mark.parametrize("prompt", PROMPTS, ids=["gsm8k", "short", "empty", "foreign", "huge"])
def test_an_assessment_is_in_range_for_any_prompt(subject: Subject, prompt: str) -> None:
    assessment = subject.signal.assess(prompt)
    assert 0.0 <= assessment.difficulty <= 1.0 and 0.0 <= assessment.score <= 1.0
    assert isinstance(assessment.out_of_domain, bool)
    if assessment.p_fail is not None:
        assert len(assessment.p_fail) == subject.flavor.n_tiers
        assert all(0.0 <= p <= 1.0 for p in assessment.p_fail)


def test_an_assessment_is_deterministic(subject: Subject) -> None:
    for prompt in PROMPTS:
        assert subject.signal.assess(prompt) == subject.signal.assess(prompt)


def test_operating_points_are_named_hints_with_one_ascending_threshold_per_tier_but_the_last(subject: Subject) -> None:
    points = subject.signal.operating_points()
    assert set(points) <= set(NAMED_HINTS)
    for thresholds in points.values():
        assert len(thresholds) == subject.flavor.n_tiers - 1 and thresholds == sorted(thresholds)
    RoutingPolicy(subject.flavor.n_tiers, signal=subject.signal)  # which refuses anything else


def test_a_higher_accuracy_target_never_raises_a_threshold(subject: Subject) -> None:
    targets = [0.01, 0.5, 0.8, 0.9, 0.95, 0.99, 1.0]
    try:
        found = [subject.signal.thresholds_for_target(t) for t in targets]
    except InvalidRequest as refused:  # no target can be met: every one is refused, naming the hint's field
        assert refused.param == "quality"
        for target in targets:
            with pytest.raises(InvalidRequest):
                subject.signal.thresholds_for_target(target)
        return
    if all(thresholds is None for thresholds in found):
        return  # no calibration: the policy's default rule applies
    assert all(t is not None and len(t) == subject.flavor.n_tiers - 1 and t == sorted(t) for t in found)
    for lower, higher in itertools.pairwise(found):
        assert lower is not None and higher is not None
        assert all(h <= low for h, low in zip(higher, lower, strict=True))


def test_only_a_signal_that_checks_its_domain_flags_a_foreign_prompt(subject: Subject) -> None:
    assert subject.signal.assess(FOREIGN).out_of_domain is subject.flavor.checks_domain
    assert subject.signal.assess(IN_DOMAIN).out_of_domain is False


@pytest.mark.parametrize("prompt", [IN_DOMAIN, FOREIGN], ids=["in_domain", "foreign"])
def test_an_out_of_domain_prompt_is_routed_by_the_heuristic(subject: Subject, prompt: str) -> None:
    policy = RoutingPolicy(subject.flavor.n_tiers, signal=subject.signal)
    assessment = subject.signal.assess(prompt)
    route = policy.route(prompt, QualityHint(name="balanced"))
    assert 0 <= route.tier < subject.flavor.n_tiers
    assert route.assessment.out_of_domain is assessment.out_of_domain
    if assessment.out_of_domain:
        assert route.router == "heuristic" and route.assessment.score == HeuristicSignal().assess(prompt).score
        assert route.assessment.p_fail == assessment.p_fail  # what the learned router said is kept
    else:
        assert route.router == subject.signal.name and route.assessment == assessment
