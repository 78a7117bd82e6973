"""`[slo] ttft_s` / `e2e_s`: a tier whose width votes is held to the TTFT bound (its answer streams once the vote is
decided), a direct tier to the end-to-end one, and the planner compares tiers in SLO scale (cascade/optimizer/slo.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cascade.errors import ConfigError
from cascade.optimizer import report, search, slo
from cascade.optimizer.parallelism import ReplicaCurve, TierTable
from cascade.optimizer.planner import plan_problem
from cascade.optimizer.problem import load_problem
from cascade.optimizer.widths import SINGLE, Width
from cascade.plan import Plan
from tests.optimizer.conftest import SMALL_PROBLEM

BOUNDS = "[slo]\nttft_s = 10.0\ne2e_s = 40.0\n"


def _voting_ladder(tmp_path: Path, slo_keys: str = "") -> Path:
    """The small problem loaded on both tiers: a direct tier with long answers, a top tier voting 4 branches (3 to
    finish) with short ones. In seconds the direct tier is the slower; held to TTFT 10 s, the vote is."""
    text = SMALL_PROBLEM.format(mode="route").replace(
        'model = "deepseek-r1-distill-qwen-32b"\n', 'model = "deepseek-r1-distill-qwen-32b"\nbranches = 4\n'
        'branches_to_finish = 3\n').replace("rate_rps = 4.0", "rate_rps = 12.0").replace(
        "output_medians = [300.0, 250.0]", "output_medians = [1500.0, 250.0]")
    path = tmp_path / ("problem-slo.toml" if slo_keys else "problem.toml")
    path.write_text(text + slo_keys)
    return path


def _slo_text(extra: str) -> str:
    return SMALL_PROBLEM.format(mode="route") + "[slo]\n" + extra


@pytest.mark.parametrize(("extra", "message"), [
    ("ttft_s = 5.0\n", "`slo.e2e_s` is missing"),
    ("e2e_s = 10.0\n", "`slo.ttft_s` is missing"),
    ("ttft_s = 11.0\ne2e_s = 10.0\n", "`slo.ttft_s` (11) exceeds `slo.e2e_s` (10)"),
    ("ttft_s = 5.0\ne2e_s = 10.0\nlatency_s = 10.0\n", "exclusive"),
    ("ttft_s = 0.0\ne2e_s = 10.0\n", "ttft_s"),  # the bounds are positive
    ("ttft_s = 5.0\ne2e_s = -1.0\n", "e2e_s"),
])
def test_the_two_bounds_come_together_positive_and_in_order(tmp_path, extra: str, message: str) -> None:
    path = tmp_path / "problem.toml"
    path.write_text(_slo_text(extra))
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_problem(path)


def test_equal_bounds_are_allowed_and_no_bounds_mean_no_weights(tmp_path) -> None:
    path = tmp_path / "problem.toml"
    path.write_text(_slo_text("ttft_s = 10.0\ne2e_s = 10.0\n"))
    problem, _ = load_problem(path)
    bounds = slo.tier_bounds(problem.slo, [SINGLE, Width(4, 3)])
    assert bounds is not None and bounds.weights.tolist() == [1.0, 1.0]
    path.write_text(SMALL_PROBLEM.format(mode="route"))
    assert slo.tier_bounds(load_problem(path)[0].slo, [SINGLE, Width(4, 3)]) is None


def test_a_voting_tier_is_held_to_ttft_and_a_direct_one_to_e2e(tmp_path) -> None:
    problem, _ = load_problem(_voting_ladder(tmp_path, BOUNDS))
    bounds = slo.tier_bounds(problem.slo, [SINGLE, Width(4, 3), Width(2, 1)])
    assert bounds is not None
    assert bounds.binding == ["e2e", "ttft", "ttft"] and bounds.bound_s == [40.0, 10.0, 10.0]
    assert bounds.weights.tolist() == [1.0, 4.0, 4.0]  # L in seconds of the end-to-end bound
    assert bounds.scale(1, 5.0) == 0.5


def _table(latency_at_half_load: float, capacity_rps: float) -> TierTable:
    curve = ReplicaCurve(tp=1, pp=1, capacity_rps=capacity_rps,
                         latency_s=[latency_at_half_load * x for x in (0.5, 0.7, 1.0, 1.5, 3.0)])
    return TierTable([curve], total_gpus=8)


def test_the_allocation_minimizes_the_worst_scale_and_reports_seconds() -> None:
    """Two equal tiers: in seconds they split 4 + 4; when the second votes under a bound 4x tighter, it gets more
    GPUs, L is its scaled p95 and latency_s the slowest tier's seconds."""
    tables = [_table(2.0, 1.0), _table(2.0, 1.0)]
    rates = np.array([2.0, 2.0])
    plain = search.joint_policy(tables, 8, exact=True)(rates)
    scaled = search.joint_policy(tables, 8, exact=True, weights=np.array([1.0, 4.0]))(rates)
    assert isinstance(plain, search.Served) and isinstance(scaled, search.Served)
    assert plain.deployment is not None and scaled.deployment is not None
    assert plain.deployment.gpus == [4, 4] and plain.bottleneck_s == plain.latency_s
    assert scaled.deployment.gpus[1] > 4
    lat = [tables[i].latency(rates[i])[0][f] for i, f in enumerate(scaled.deployment.gpus)]
    assert scaled.bottleneck_s == pytest.approx(max(lat[0], 4 * lat[1]))
    assert scaled.latency_s == pytest.approx(max(lat))
    fixed = search.fixed_deployment_policy(tables, scaled.deployment, np.array([1.0, 4.0]))(rates)
    assert isinstance(fixed, search.Served) and fixed.bottleneck_s == pytest.approx(scaled.bottleneck_s)


def _scale_without_keys(plan: Plan, bound_s: list[float]) -> float:
    return max((d.predicted_p95_latency_s or 0.0) / b for d, b in zip(plan.deployment, bound_s, strict=True))


def test_with_the_bounds_the_vote_gets_more_gpus_or_less_traffic_and_a_scale_no_worse(tmp_path) -> None:
    without = plan_problem(*load_problem(_voting_ladder(tmp_path))).plan
    result = plan_problem(*load_problem(_voting_ladder(tmp_path, BOUNDS)))
    plan = result.plan
    assert without.predicted_slo_scale is None and report.tier_slos(without) is None
    assert all(d.binding_slo is None and d.predicted_slo_scale is None for d in without.deployment)
    direct, vote = plan.deployment
    assert (direct.binding_slo, vote.binding_slo) == ("e2e", "ttft")
    assert vote.predicted_slo_scale == pytest.approx((vote.predicted_p95_latency_s or 0.0) / 10.0, abs=1e-3)
    assert plan.predicted_slo_scale == max(direct.predicted_slo_scale or 0.0, vote.predicted_slo_scale or 0.0)
    share_before, share_after = (next(p.tier_fractions[1] for p in x.operating_points if p.hint == "balanced")
                                 for x in (without, plan))
    assert vote.gpus > without.deployment[1].gpus or share_after < share_before
    assert plan.predicted_slo_scale <= _scale_without_keys(without, [40.0, 10.0]) + 1e-3
    # Reported latencies stay in seconds: the slowest tier's p95, not the scaled bottleneck.
    assert result.primary.latency_s == pytest.approx(max(d.predicted_p95_latency_s or 0.0 for d in plan.deployment),
                                                     rel=0.05)
    assert result.primary.bottleneck_s == pytest.approx(40.0 * plan.predicted_slo_scale, rel=0.05)
    assert plan.planner is not None and (plan.planner.ttft_slo_s, plan.planner.e2e_slo_s) == (10.0, 40.0)


def test_a_ladder_without_a_vote_plans_the_same_with_the_bounds(tmp_path) -> None:
    """A direct tier's weight is exactly 1: the bounds change the report, not the plan."""
    path = tmp_path / "problem.toml"
    path.write_text(SMALL_PROBLEM.format(mode="route"))
    before = plan_problem(*load_problem(path)).plan
    path.write_text(SMALL_PROBLEM.format(mode="route") + BOUNDS)
    after = plan_problem(*load_problem(path)).plan
    assert [(d.gpus, d.tp, d.replicas) for d in after.deployment] == [(d.gpus, d.tp, d.replicas)
                                                                        for d in before.deployment]
    assert [p.thresholds for p in after.operating_points] == [p.thresholds for p in before.operating_points]
    assert {d.binding_slo for d in after.deployment} == {"e2e"}


def test_plan_json_names_the_worst_scale_its_tier_and_each_tiers_bound(tmp_path) -> None:
    out = tmp_path / "plan.json"
    done = subprocess.run([sys.executable, "-m", "cascade.cli", "optimize", "plan", "--spec",
                           str(_voting_ladder(tmp_path, BOUNDS)), "--out", str(out), "--json", "--no-figure"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    tiers = summary["tier_slos"]
    assert {t: v["binding_slo"] for t, v in tiers.items()} == {"small": "e2e", "large": "ttft"}
    assert {t: v["bound_s"] for t, v in tiers.items()} == {"small": 40.0, "large": 10.0}
    worst = max(tiers, key=lambda t: tiers[t]["slo_scale"])
    assert summary["binding_tier"] == worst and summary["binding_slo"] == tiers[worst]["binding_slo"]
    assert summary["slo_scale"] == tiers[worst]["slo_scale"]
    assert summary["slowest_tier_p95_s"] == summary["latency_s"]  # the old keys keep their meaning (seconds)
    assert "; held to the TTFT SLO (10 s" in summary["allocation_reasons"]["large"]
    assert "; held to the end-to-end SLO (40 s" in summary["allocation_reasons"]["small"]
    assert "| SLO | scale |" in out.with_suffix(".md").read_text()
