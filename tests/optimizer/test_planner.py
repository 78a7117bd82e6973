"""The bi-level planner end to end on a small problem."""

from __future__ import annotations

import msgspec
import pytest

from cascade.errors import ConfigError
from cascade.optimizer.planner import plan_problem
from cascade.optimizer.problem import load_problem
from cascade.plan import Plan
from tests.optimizer.conftest import SMALL_PROBLEM


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


@pytest.mark.parametrize("every_tier", [True, False])
def test_a_tier_no_request_reaches_gets_no_gpu_only_when_the_fleet_is_sized_for_the_target_alone(
        tmp_path, every_tier: bool) -> None:
    """At a target the small tier meets alone, everything goes to it; with `deploy_every_tier = false` the large tier
    is then left without GPUs (and `best` falls back to what is deployed), by default it keeps at least one."""
    path = tmp_path / "problem.toml"
    text = SMALL_PROBLEM.format(mode="route").replace("target = 0.85", "target = 0.5").replace(
        "gpus_per_node = 8\n", f'gpus_per_node = 8\nallocation = "at_most"\ndeploy_every_tier = '
                               f'{str(every_tier).lower()}\n')
    path.write_text(text)
    problem, base = load_problem(path)
    plan = plan_problem(problem, base).plan
    gpus = {d.tier: d.gpus for d in plan.deployment}
    balanced = next(p for p in plan.operating_points if p.hint == "balanced")
    assert balanced.tier_fractions[1] == 0 and balanced.predicted_quality >= 0.5
    if every_tier:
        assert gpus["large"] >= 1
    else:
        assert gpus["large"] == 0 and gpus["small"] >= 1
        best = next(p for p in plan.operating_points if p.hint == "best")
        assert best.tier_fractions[1] == 0  # nothing is routed where nothing serves
        large = next(d for d in plan.deployment if d.tier == "large")
        assert large.replicas == 0 and large.predicted_p95_latency_s == 0.0
