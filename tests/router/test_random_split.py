"""The random-route null (cascade/router/random_split.py): its keyed score, and the cheapest split for a target."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cascade.config import RoutingConfig
from cascade.errors import InvalidRequest
from cascade.router.load import TierShape
from cascade.router.operating import NEVER
from cascade.router.policy import QualityHint, RoutingPolicy, tier_for
from cascade.router.random_split import RandomSignal, random_score, random_thresholds
from cascade.router.router import Router, routed_text


def shares(thresholds: list[float]) -> list[float]:
    """Each tier's share of uniform scores in [0, 1) under `thresholds` (tier = how many thresholds it reaches)."""
    edges = [0.0, *(min(max(t, 0.0), 1.0) for t in thresholds), 1.0]
    return [high - low for low, high in itertools.pairwise(edges)]


def expected(values: list[float], thresholds: list[float]) -> float:
    return sum(f * v for f, v in zip(shares(thresholds), values, strict=True))


def cheapest_by_pairs(accuracies: list[float], costs: list[float], target: float) -> float | None:
    """The least cost of any mixture whose accuracy reaches `target`, by enumeration: a linear programme with two
    constraints has an optimum on at most two tiers (None: none reaches it)."""
    best = [c for a, c in zip(accuracies, costs, strict=True) if a >= target]
    for (a1, c1), (a2, c2) in itertools.permutations(zip(accuracies, costs, strict=True), 2):
        if a1 < target < a2:
            share = (target - a1) / (a2 - a1)
            best.append((1 - share) * c1 + share * c2)
    return min(best) if best else None


def grid_mixtures(n: int, steps: int) -> list[tuple[float, ...]]:
    """Every mixture of `n` tiers whose shares are multiples of 1/steps."""
    return [tuple(k / steps for k in counts) for counts in itertools.product(range(steps + 1), repeat=n)
            if sum(counts) == steps]


def test_the_score_is_in_the_unit_interval_and_the_same_for_the_same_prompt_and_seed() -> None:
    for text in ("What is 2+2?", "", "Écris un poème sur la mer 🌊", "\ud800 a lone surrogate", "word " * 5000):
        score = random_score(text, 7)
        assert 0.0 <= score < 1.0 and score == random_score(text, 7)


def test_another_seed_gives_another_score() -> None:
    prompts = [f"question {i}" for i in range(200)]
    assert sum(random_score(p, 0) == random_score(p, 1) for p in prompts) == 0


def test_the_router_scores_the_same_bounded_text_every_policy_reads() -> None:
    router = Router([TierShape(name) for name in ("a", "b", "c")], RoutingConfig(max_prompt_chars=256),
                    RandomSignal(seed=2))
    long = "x" * 1000 + " the middle " + "y" * 1000
    score = router.assess(long).assessment.score
    assert score == random_score(routed_text(long, 256), 2)
    assert router.assess("x" * 1000 + " another middle " + "y" * 1000).assessment.score == score  # not read
    hint = QualityHint(name="balanced")
    assert router.itinerary(long, hint).itinerary.first == tier_for(score, [1 / 3, 2 / 3])


def test_one_seed_routes_a_prompt_to_the_same_tier_every_time_and_another_seed_splits_anew() -> None:
    prompts = [f"Question {i}: what is {i} times {i + 1}?" for i in range(60)]
    hint = QualityHint(name="balanced")

    def tiers(seed: int) -> list[int]:
        policy = RoutingPolicy(3, signal=RandomSignal(seed))
        return [policy.route(p, hint).tier for p in prompts]

    first = tiers(0)
    assert tiers(0) == first and set(first) == {0, 1, 2}
    assert tiers(1) != first  # 60 prompts on 3 tiers: alike by chance about once in 3**60


def test_two_seeds_split_the_same_prompts_independently() -> None:
    # Tier 1 of two under an even split, for 4,000 prompts under seeds 0 and 1: independent splits agree on about
    # half (sd 0.008; 0.5 +- 0.05 is six sd away), the same seed on all.
    prompts = [f"A shop sells {i} apples. How many are left?" for i in range(4000)]
    upper = [[random_score(p, seed) >= 0.5 for p in prompts] for seed in (0, 1)]
    agreement = sum(a == b for a, b in zip(*upper, strict=True)) / len(prompts)
    assert abs(agreement - 0.5) < 0.05


def test_a_target_between_two_tiers_mixes_them_in_the_shares_that_give_it() -> None:
    thresholds = random_thresholds([0.4, 0.6, 0.8], [0, 1, 2], 0.5)
    assert shares(thresholds) == pytest.approx([0.5, 0.5, 0.0])
    assert thresholds[1] == NEVER  # the top tier gets nothing: no score reaches its threshold


def test_a_tier_under_the_hull_is_skipped() -> None:
    # The middle tier costs 1 for 0.45: a half-and-half mix of the others gets 0.6 for the same cost.
    thresholds = random_thresholds([0.4, 0.45, 0.8], [0, 1, 2], 0.6)
    assert shares(thresholds) == pytest.approx([0.5, 0.0, 0.5])
    assert thresholds == pytest.approx([0.5, 0.5])


def test_a_target_the_cheapest_tier_reaches_sends_everything_there() -> None:
    assert random_thresholds([0.7, 0.8, 0.9], [0, 1, 2], 0.5) == [NEVER, NEVER]


def test_an_unreachable_target_sends_everything_to_the_most_accurate_tier() -> None:
    assert random_thresholds([0.4, 0.9, 0.8], [0, 1, 2], 0.95) == [0.0, NEVER]
    # Equally accurate tiers: the cheaper one.
    assert random_thresholds([0.4, 0.9, 0.9], [0, 2, 1], 0.95) == [0.0, 0.0]


def test_a_target_at_a_tiers_accuracy_sends_everything_to_that_tier() -> None:
    assert random_thresholds([0.4, 0.6, 0.8], [0, 1, 2], 0.6) == [0.0, NEVER]


def test_one_tier_has_no_thresholds() -> None:
    assert random_thresholds([0.5], [0], 0.9) == [] and random_thresholds([0.5], [0], 0.1) == []


@pytest.mark.parametrize(("accuracies", "costs", "target"), [
    ([], [], 0.5), ([0.5, 0.6], [0], 0.5), ([0.5, math.nan], [0, 1], 0.5), ([0.5, 0.6], [0, 1], math.nan),
])
def test_malformed_inputs_are_refused(accuracies, costs, target) -> None:
    with pytest.raises(ValueError):
        random_thresholds(accuracies, costs, target)


accuracy = st.floats(0.0, 1.0)
cost = st.floats(0.0, 100.0)


@st.composite
def ladders(draw: st.DrawFn, smallest: int = 1, largest: int = 6) -> tuple[list[float], list[float], float]:
    n = draw(st.integers(smallest, largest))
    return (draw(st.lists(accuracy, min_size=n, max_size=n)), draw(st.lists(cost, min_size=n, max_size=n)),
            draw(accuracy))


@settings(max_examples=400, deadline=None)
@given(ladders())
def test_a_split_is_ascending_and_reaches_a_reachable_target_exactly_at_the_least_cost(ladder) -> None:
    accuracies, costs, target = ladder
    thresholds = random_thresholds(accuracies, costs, target)
    assert len(thresholds) == len(accuracies) - 1 and thresholds == sorted(thresholds)
    assert all(0.0 <= t <= 1.0 or t == NEVER for t in thresholds)
    got, spent = expected(accuracies, thresholds), expected(costs, thresholds)
    least = cheapest_by_pairs(accuracies, costs, target)
    if least is None:  # unreachable: the most accurate tier alone, the cheapest of equals
        best = max(accuracies)
        assert got == best and spent == min(c for a, c in zip(accuracies, costs, strict=True) if a == best)
        return
    assert spent == pytest.approx(least, abs=1e-9)
    cheapest_alone = max(a for a, c in zip(accuracies, costs, strict=True) if c == min(costs))
    if target > cheapest_alone:  # spending less than the cheapest tier is impossible: above it, exactly the target
        assert got == pytest.approx(target, abs=1e-9)
    else:
        assert got >= target - 1e-9 and spent == min(costs)


@settings(max_examples=150, deadline=None)
@given(ladders(3, 4))
def test_no_mixture_on_a_grid_reaches_the_target_for_less(ladder) -> None:
    accuracies, costs, target = ladder
    spent = expected(costs, random_thresholds(accuracies, costs, target))
    for mixture in grid_mixtures(len(accuracies), 12):
        if sum(f * a for f, a in zip(mixture, accuracies, strict=True)) >= target:
            assert spent <= sum(f * c for f, c in zip(mixture, costs, strict=True)) + 1e-9


@settings(max_examples=200, deadline=None)
@given(st.lists(accuracy, min_size=2, max_size=5), st.lists(accuracy, min_size=2, max_size=5))
def test_a_higher_target_never_raises_a_threshold_on_a_ladder_priced_by_its_index(accuracies, targets) -> None:
    costs = [float(t) for t in range(len(accuracies))]
    found = [random_thresholds(accuracies, costs, t) for t in sorted(targets)]
    for lower, higher in itertools.pairwise(found):
        assert all(h <= low for h, low in zip(higher, lower, strict=True))


def test_the_signal_routes_named_hints_by_the_default_thresholds() -> None:
    policy = RoutingPolicy(3, signal=RandomSignal(seed=3))
    route = policy.route("What is 2+2?", QualityHint(name="balanced"))
    assert route.router == "random" and route.thresholds == pytest.approx([1 / 3, 2 / 3])
    assert route.assessment.score == random_score("What is 2+2?", 3)
    assert route.tier == tier_for(route.assessment.score, route.thresholds)
    assert policy.route("What is 2+2?", QualityHint(name="best")).tier == 2
    assert policy.route("What is 2+2?", QualityHint(name="fast")).tier == 0


def test_a_numeric_hint_without_the_tiers_accuracies_is_the_clients_error() -> None:
    policy = RoutingPolicy(3, signal=RandomSignal())
    with pytest.raises(InvalidRequest, match=r"routing\.random\] accuracies") as info:
        policy.route("What is 2+2?", QualityHint(target=0.8))
    assert info.value.param == "quality"
    # A numeric operating point the config names is served as it is.
    named = RoutingPolicy(3, {"0.8": [0.2, 0.6]}, RandomSignal())
    assert named.route("What is 2+2?", QualityHint(target=0.8)).thresholds == [0.2, 0.6]


def test_a_numeric_hint_with_the_tiers_accuracies_gets_the_cheapest_split() -> None:
    signal = RandomSignal(accuracies=[0.4, 0.6, 0.8])
    assert signal.costs == [0.0, 1.0, 2.0]
    route = RoutingPolicy(3, signal=signal).route("What is 2+2?", QualityHint(target=0.7))
    assert route.thresholds == random_thresholds([0.4, 0.6, 0.8], [0, 1, 2], 0.7) == [0.0, pytest.approx(0.5)]


@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_tier_shares_over_many_prompts_match_the_thresholds(seed: int) -> None:
    # 20,000 distinct prompts: each tier's share is binomial, sd <= sqrt(0.25 / 20,000) = 0.0035, so 0.02 is more
    # than five sd from it (every prompt and seed is fixed: the count is the same on every run).
    accuracies, costs = [0.3, 0.5, 0.9], [1.0, 2.0, 9.0]
    thresholds = random_thresholds(accuracies, costs, 0.6)  # 0.75 on tier 1, 0.25 on tier 2
    policy = RoutingPolicy(3, signal=RandomSignal(seed, accuracies, costs))
    n = 20_000
    counts = [0, 0, 0]
    for i in range(n):
        counts[policy.route(f"Question {i}: how many apples are left after {i % 97} are eaten?",
                            QualityHint(target=0.6)).tier] += 1
    for share, want in zip((c / n for c in counts), shares(thresholds), strict=True):
        assert abs(share - want) < 0.02
