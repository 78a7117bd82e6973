"""The outer level: Cascadia's objective, the GA, the front and infeasible routings."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from cascade.optimizer import routing, search


def toy(mode: routing.Mode = "cascade") -> routing.RoutingData:
    rng = np.random.default_rng(5)
    score = rng.uniform(size=(400, 3))
    score[:, 2] = np.maximum(score[:, 2], 0.5)
    signal = score if mode == "cascade" else rng.uniform(size=400)
    return routing.RoutingData(mode=mode, signal=signal, quality=score)


def load_policy(rates: np.ndarray) -> tuple[float, search.Deployment | None]:
    """Latency grows with the load on the expensive tiers; too much load on tier 2 cannot be served."""
    if rates[2] > 4.0:
        return math.inf, None
    return 1.0 + 2.0 * rates[1] + 5.0 * rates[2], None


def test_the_objective_reproduces_the_papers_worked_example() -> None:
    evaluator = search.Evaluator(toy(), 1.0, load_policy, q_min=0.90, mu=100.0)
    evaluator.span = 0.20  # z1* - z2* in the example
    assert evaluator.objective(11.0, 0.88) == pytest.approx(21.0)
    assert evaluator.objective(11.4, 0.91) == pytest.approx(11.4)


def test_the_ga_finds_what_exhaustive_search_finds() -> None:
    data = toy()
    exhaustive = search.Evaluator(data, 8.0, load_policy, q_min=0.75, mu=100.0)
    grid = [(a, b) for a in range(0, routing.NEVER + 1, 2) for b in range(0, routing.NEVER + 1, 2)]
    best = min((exhaustive(ks) for ks in grid), key=lambda e: e.objective)
    ga = search.Evaluator(data, 8.0, load_policy, q_min=0.75, mu=100.0)
    found = search.minimize_objective(ga, 2, [(0, 0)], pop_size=24, generations=25, seed=0)
    assert found.objective <= best.objective * 1.01


def test_routings_no_deployment_can_carry_are_constraint_violations_not_errors() -> None:
    evaluator = search.Evaluator(toy(), 20.0, load_policy, q_min=0.99, mu=100.0)
    found = search.minimize_objective(evaluator, 2, [(routing.NEVER, routing.NEVER)], pop_size=12,
                                      generations=4, seed=1)
    assert math.isinf(evaluator((routing.NEVER, routing.NEVER)).latency_s)
    assert math.isfinite(found.latency_s)


def test_a_single_threshold_is_searched_exhaustively() -> None:
    evaluator = search.Evaluator(toy("route"), 8.0, lambda r: (1.0 + r[1], None), q_min=0.0, mu=1.0)
    search.minimize_objective(evaluator, 1, [], pop_size=20, generations=10, seed=0)
    assert len(evaluator.memo) == routing.NEVER + 1


def test_the_front_is_non_dominated_and_tchebycheff_picks_the_fastest_point_meeting_the_target() -> None:
    evaluator = search.Evaluator(toy(), 8.0, load_policy, q_min=0.8, mu=100.0)
    front = search.explore_front(evaluator, 2, [(0, 0)], pop_size=16, generations=6, seed=0)
    assert len(front) >= 3
    for a, b in itertools.pairwise(front):
        assert a.latency_s <= b.latency_s and a.quality < b.quality
    target = front[len(front) // 2].quality
    chosen = search.tchebycheff_choice(front, q_min=target)
    assert chosen.quality >= target
    assert chosen.latency_s == min(e.latency_s for e in front if e.quality >= target)
