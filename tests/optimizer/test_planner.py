"""The bi-level planner end to end on a small problem."""

from __future__ import annotations

import msgspec
import pytest

from cascade.errors import ConfigError
from cascade.optimizer.planner import plan_problem
from cascade.optimizer.problem import load_problem
from cascade.plan import Plan


def test_the_plan_meets_the_quality_target_within_the_gpus(small_problem) -> None:
    problem, base = load_problem(small_problem)
    result = plan_problem(problem, base)
    plan = result.plan
    assert sum(d.gpus for d in plan.deployment) == 8
    for d in plan.deployment:
        assert sum(s.tp * s.pp * s.count for s in d.sets()) <= d.gpus
    balanced = next(p for p in plan.operating_points if p.hint == "balanced")
    assert balanced.predicted_quality is not None and balanced.predicted_quality >= 0.85
    assert {p.hint for p in plan.operating_points} >= {"fast", "balanced", "best", "0.85"}
    fast = next(p for p in plan.operating_points if p.hint == "fast")
    assert fast.predicted_p95_latency_s <= balanced.predicted_p95_latency_s


def test_operating_points_reach_the_gateway_in_its_own_threshold_semantics(small_problem) -> None:
    problem, base = load_problem(small_problem)
    plan = msgspec.json.decode(msgspec.json.encode(plan_problem(problem, base).plan), type=Plan)
    points = plan.thresholds_by_hint(2)
    assert points["fast"] == [1.01]  # above any difficulty: nothing escalates
    assert 0.0 <= points["balanced"][0] <= 1.01


def test_a_cascade_plan_carries_acceptance_thresholds_for_the_gateways_cascade_mode(small_cascade_problem) -> None:
    problem, base = load_problem(small_cascade_problem)
    plan = plan_problem(problem, base).plan
    assert plan.routing == "cascade" and plan.pareto_front
    points = plan.thresholds_by_hint(2)
    assert set(points) >= {"fast", "balanced", "best"} and all(len(h) == 1 for h in points.values())
    with pytest.raises(ConfigError, match="the config has 3"):
        plan.thresholds_by_hint(3)


def test_the_same_seed_gives_the_same_plan(small_problem) -> None:
    problem, base = load_problem(small_problem)
    first, second = plan_problem(problem, base).plan, plan_problem(problem, base).plan
    strip = {"planner": None}
    assert msgspec.structs.replace(first, **strip) == msgspec.structs.replace(second, **strip)


def test_problem_errors_name_the_key(tmp_path) -> None:
    bad = tmp_path / "p.toml"
    bad.write_text('[cluster]\ngpu = "h100-sxm"\ngpus = 8\ngpuz = 1\n')
    with pytest.raises(ConfigError, match="unknown key `gpuz` in `cluster`"):
        load_problem(bad)
