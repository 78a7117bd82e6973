"""A width with a first wave (adaptive consistency) in the planner: what it returns and decodes from recorded
branches, how its two waves are simulated, and how a problem and a plan carry it."""

from __future__ import annotations

import numpy as np
import pytest

from cascade.config import load_config
from cascade.engines.sglang_launch import gateway_config
from cascade.errors import ConfigError
from cascade.optimizer import simulator, synthetic
from cascade.optimizer.cards import load_gpu, load_model
from cascade.optimizer.parallelism import SimSettings, replica_curve
from cascade.optimizer.planner import plan_problem
from cascade.optimizer.problem import load_problem
from cascade.optimizer.roofline import RooflineCost, Shape
from cascade.optimizer.widths import BranchDraws, Width, vote

from .conftest import SMALL_PROBLEM

ADAPTIVE = Width(4, 4, first=2)


def draws(answers: list[list[int]], tokens: list[list[int]]) -> BranchDraws:
    a = np.array(answers)
    return BranchDraws(answer=a, score=np.where(a == 0, 0.9, 0.2), tokens=np.array(tokens))


def test_a_first_wave_that_agrees_settles_the_request_and_the_rest_never_start() -> None:
    result = vote(draws([[3, 3, 0, 0]], [[40, 60, 10, 10]]), ADAPTIVE)
    assert result.correct[0] == 0  # the wave's answer stands, though the later branches would have outvoted it
    assert result.branch_tokens.tolist() == [[40, 60, 0, 0]]
    assert result.finish_tokens[0] == 60


def test_a_first_wave_that_disagrees_starts_the_rest_after_it_and_all_vote() -> None:
    result = vote(draws([[3, 0, 0, 2]], [[40, 60, 10, 30]]), ADAPTIVE)
    assert result.correct[0] == 1  # 0 has two votes of four
    assert result.branch_tokens.tolist() == [[40, 60, 10, 30]]
    assert result.finish_tokens[0] == 60 + 30  # the second wave starts when the first has ended


def test_a_tie_goes_to_the_shorter_branch_even_from_the_second_wave() -> None:
    # 0 and 1 two votes each: the runner breaks the tie by branch length (no scorer), not by which wave finished first
    result = vote(draws([[0, 1, 1, 0]], [[50, 60, 20, 70]]), ADAPTIVE)
    assert result.correct[0] == 0


def test_unreadable_answers_agree_with_nothing() -> None:
    result = vote(draws([[-1, -2, 0, 0]], [[5, 5, 7, 9]]), ADAPTIVE)
    assert result.correct[0] == 1 and result.branch_tokens.tolist() == [[5, 5, 7, 9]]


def test_with_m_below_n_the_second_wave_stops_at_its_m_minus_w_th_finisher() -> None:
    width = Width(5, 3, first=2)
    result = vote(draws([[0, 1, 1, 0, 0]], [[20, 30, 50, 10, 40]]), width)
    # Voters: the first wave (0, 1) and the shortest later branch (0): answer 0; the others stop at 10 tokens.
    assert result.correct[0] == 1
    assert result.branch_tokens.tolist() == [[20, 30, 10, 10, 10]]
    assert result.finish_tokens[0] == 40


def test_without_a_first_wave_nothing_changes_and_a_bad_wave_is_refused() -> None:
    d = synthetic.gsm8k_like(["a"], n=200, seed=4, branches=4, correlation=0.5).branches[0]
    assert d is not None
    plain = vote(d, Width(4, 4))
    assert np.array_equal(vote(d, Width(4, 4, first=0)).correct, plain.correct)
    adaptive = vote(d, ADAPTIVE)
    settled = (adaptive.branch_tokens[:, 2:] == 0).all(axis=1)
    assert 0 < settled.mean() < 1
    assert (adaptive.decode_tokens <= plain.decode_tokens).all()
    with pytest.raises(ValueError, match="2 <= first < m"):
        Width(4, 2, first=2)


def _cost() -> RooflineCost:
    return RooflineCost(load_model("llama-3.1-8b"), load_gpu("h100-sxm"), Shape(1, 1))


def test_simulate_tier_runs_waves_only_where_the_tier_has_them() -> None:
    cost = _cost()
    arrivals, inputs = np.array([0.0, 0.5]), np.array([100, 100])
    lengths = np.array([[50, 80, 0, 0], [40, 40, 60, 60]])
    limits = dict(kv_capacity_tokens=cost.kv_capacity_tokens)
    waves = simulator.simulate_tier(cost, arrivals, inputs, lengths, first_wave=2, **limits)
    assert np.array_equal(waves.latency_s,
                          simulator.simulate_waves(cost, arrivals, inputs, lengths, first_wave=2, **limits).latency_s)
    together = simulator.simulate_tier(cost, arrivals, inputs, lengths, **limits)
    assert np.array_equal(together.latency_s,
                          simulator.simulate_branches(cost, arrivals, inputs, lengths, **limits).latency_s)
    assert waves.latency_s[1] > together.latency_s[1]  # the second wave waits for the first


def test_a_replica_curve_with_a_first_wave_is_planned_from_the_waves() -> None:
    cost = _cost()
    rng = np.random.default_rng(0)
    inputs = rng.integers(50, 150, size=200)
    lengths = rng.integers(200, 600, size=(200, 8))
    lengths[: 140, 2:] = 0  # 70 % settled by their first wave
    # The same tokens as one sequence per request, as the planner read a vote before it knew the waves
    summed = lengths.sum(axis=1)
    waves = replica_curve(cost, inputs, lengths, SimSettings(requests=400, first_wave=2))
    one = replica_curve(cost, inputs, summed, SimSettings(requests=400))
    assert waves.latency_s[0] is not None and one.latency_s[0] is not None
    assert waves.latency_s[0] < one.latency_s[0]  # alone, branches run side by side


def _problem(tmp_path, extra: str) -> tuple:
    text = SMALL_PROBLEM.format(mode="route").replace('model = "llama-3.1-8b"\n', f'model = "llama-3.1-8b"\n{extra}')
    path = tmp_path / "problem.toml"
    path.write_text(text)
    return load_problem(path)


def test_a_problem_tiers_first_wave_reaches_its_widths_the_plan_and_the_gateway_config(tmp_path) -> None:
    problem, base = _problem(tmp_path, "branches = 4\nbranches_to_finish = 4\nfirst_wave = 2\n")
    assert problem.tiers[0].candidate_widths == [ADAPTIVE]
    plan = plan_problem(problem, base).plan
    small = plan.deployment[0]
    assert (small.branches, small.branches_to_finish, small.first_wave) == (4, 4, 2)
    config = gateway_config(plan.tiers, [(t, "sglang", f"http://127.0.0.1:{30000 + i}", "m")
                                         for i, t in enumerate(plan.tiers)],
                            widths={d.tier: (d.branches, d.branches_to_finish, d.first_wave) for d in plan.deployment})
    (tmp_path / "cascade.toml").write_text(config)
    settings = {t.name: t.branches for t in load_config(tmp_path / "cascade.toml").tiers}
    assert (settings["small"].n, settings["small"].m, settings["small"].first_wave) == (4, 4, 2)


@pytest.mark.parametrize("extra", ["branches = 4\nbranches_to_finish = 2\nfirst_wave = 2\n",
                                   "branches = 4\nbranches_to_finish = 4\nfirst_wave = 1\n",
                                   "first_wave = 2\n"])
def test_a_first_wave_no_width_can_run_is_refused(tmp_path, extra: str) -> None:
    with pytest.raises(ConfigError, match="first_wave"):
        _problem(tmp_path, extra)
