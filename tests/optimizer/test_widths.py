"""Branch width (N, M) in the planner: what a width returns, what it runs, and how the plan chooses it."""

from __future__ import annotations

import json

import msgspec
import numpy as np
import pytest

from cascade.config import load_config
from cascade.data.outcomes import OutcomeRow
from cascade.engines.sglang_launch import gateway_config
from cascade.errors import ConfigError
from cascade.optimizer import simulator, synthetic
from cascade.optimizer.cards import load_gpu, load_model
from cascade.optimizer.outcomes import from_rows
from cascade.optimizer.planner import plan_problem
from cascade.optimizer.problem import FileOutcomes, load_problem
from cascade.optimizer.roofline import RooflineCost, Shape
from cascade.optimizer.widths import SINGLE, BranchDraws, Width, vote

from .conftest import SMALL_PROBLEM


def draws(answers: list[list[int]], tokens: list[list[int]], scores: list[list[float]] | None = None) -> BranchDraws:
    a = np.array(answers)
    return BranchDraws(answer=a, score=np.array(scores) if scores else np.where(a == 0, 0.9, 0.2),
                       tokens=np.array(tokens))


def test_the_first_m_to_finish_vote_and_ties_go_to_the_earliest_finisher() -> None:
    # Branch 2 (answer 0, the reference) finishes first, then branches 0 and 1 (both answer 1).
    d = draws([[1, 1, 0]], [[20, 30, 10]], [[0.3, 0.4, 0.95]])
    first = vote(d, Width(3, 1))
    assert first.correct[0] == 1 and first.score[0] == 0.95 and first.finish_tokens[0] == 10
    tie = vote(d, Width(3, 2))  # {0, 1}: one vote each, the earliest finisher's answer wins
    assert tie.correct[0] == 1 and tie.finish_tokens[0] == 20
    assert tie.branch_tokens.tolist() == [[20, 20, 10]]  # branch 1 stopped when the second finished
    majority = vote(d, Width(3, 3))
    assert majority.correct[0] == 0 and majority.score[0] == 0.3  # the earliest finisher giving answer 1
    assert majority.decode_tokens[0] == 60


def test_equal_lengths_finish_in_sampling_order() -> None:
    d = draws([[2, 0, 0]], [[50, 50, 50]])
    assert vote(d, Width(3, 1)).correct[0] == 0
    assert vote(d, Width(3, 3)).correct[0] == 1


def test_a_width_needs_m_at_most_n_and_enough_branches() -> None:
    with pytest.raises(ValueError, match="1 <= m <= n"):
        Width(2, 3)
    with pytest.raises(ValueError, match="needs 4 branches"):
        vote(draws([[0, 1]], [[5, 6]]), Width(4, 2))


def test_synthetic_branches_leave_the_single_answer_outcomes_unchanged_and_keep_each_branchs_accuracy() -> None:
    tiers = ["a", "b"]
    plain = synthetic.gsm8k_like(tiers, n=4000, seed=1)
    wide = synthetic.gsm8k_like(tiers, n=4000, seed=1, branches=6, correlation=0.5)
    for field in ("correct", "score", "output_tokens", "input_tokens", "difficulty"):
        assert np.array_equal(getattr(plain, field), getattr(wide, field))
    assert plain.branches == ()
    for i in range(2):
        d = wide.branches[i]
        assert d is not None and d.count == 6
        single = vote(d, SINGLE)
        assert np.array_equal(single.correct, plain.correct[:, i]) and np.array_equal(single.score, plain.score[:, i])
        # Every branch is marginally as accurate as the single answer (copies and fresh draws alike).
        per_branch = (d.answer == 0).mean(axis=0)
        assert np.all(np.abs(per_branch - plain.correct[:, i].mean()) < 0.03)
    # Correlated errors: a wider vote helps, but less than independent branches would.
    base = plain.correct[:, 0].mean()
    assert base < vote(wide.branches[0], Width(5, 5)).correct.mean() < base + 0.1


def test_correlation_one_makes_every_branch_the_same_answer() -> None:
    wide = synthetic.gsm8k_like(["a"], n=500, seed=2, branches=4, correlation=1.0)
    d = wide.branches[0]
    assert d is not None and (d.answer == d.answer[:, :1]).all()
    assert np.array_equal(vote(d, Width(4, 3)).correct, wide.correct[:, 0])


def _cost() -> RooflineCost:
    return RooflineCost(load_model("llama-3.1-8b"), load_gpu("h100-sxm"), Shape(1, 1))


def test_a_request_with_branches_ends_with_its_last_branch_and_starts_with_its_first() -> None:
    cost = _cost()
    inputs, branches = np.array([100, 100]), np.array([[50, 80, 0], [40, 40, 40]])
    grouped = simulator.simulate_branches(cost, np.array([0.0, 0.0]), inputs, branches,
                                          kv_capacity_tokens=cost.kv_capacity_tokens)
    flat = simulator.simulate(cost, np.zeros(5), np.full(5, 100), np.array([50, 80, 40, 40, 40]),
                              kv_capacity_tokens=cost.kv_capacity_tokens)
    assert grouped.latency_s.tolist() == [flat.latency_s[:2].max(), flat.latency_s[2:].max()]
    assert grouped.ttft_s.tolist() == [flat.ttft_s[:2].min(), flat.ttft_s[2:].min()]
    with pytest.raises(ValueError, match="at least one branch"):
        simulator.simulate_branches(cost, np.zeros(1), np.array([10]), np.array([[0, 0]]),
                                    kv_capacity_tokens=cost.kv_capacity_tokens)


def test_four_branches_per_request_cut_a_replicas_request_capacity() -> None:
    cost = _cost()
    rng = np.random.default_rng(0)
    inputs = rng.integers(50, 150, size=400)
    outputs = rng.integers(200, 600, size=400)
    limits = dict(kv_capacity_tokens=cost.kv_capacity_tokens, max_batch=256, max_prefill_tokens=16384)
    one = simulator.saturation_rps(cost, inputs, outputs, **limits)
    four = simulator.saturation_rps(cost, inputs, np.repeat(outputs[:, None], 4, axis=1), **limits)
    assert 0.15 * one < four < 0.5 * one  # 4x the sequences; a fuller batch decodes them a little cheaper


def _problem(tmp_path, extra_small: str = "", extra_large: str = "", mode: str = "cascade") -> tuple:
    text = SMALL_PROBLEM.format(mode=mode)
    text = text.replace('model = "llama-3.1-8b"\n', f'model = "llama-3.1-8b"\n{extra_small}')
    text = text.replace('model = "deepseek-r1-distill-qwen-32b"\n',
                        f'model = "deepseek-r1-distill-qwen-32b"\n{extra_large}')
    if mode == "cascade":
        text = text.replace('metric = "correct"', 'metric = "score"').replace("target = 0.85", "target = 0.80")
    path = tmp_path / "problem.toml"
    path.write_text(text)
    return load_problem(path)


def test_the_plan_keeps_the_width_with_the_lowest_objective_and_deploys_it(tmp_path) -> None:
    problem, base = _problem(tmp_path, extra_small="widths = [[1, 1], [4, 3]]\n")
    result = plan_problem(problem, base)
    plan = result.plan
    assert plan.planner is not None
    trials = {tuple(map(tuple, t.widths)): t for t in plan.planner.width_trials}
    assert set(trials) == {((1, 1), (1, 1)), ((4, 3), (1, 1))}
    chosen = ((plan.deployment[0].branches, plan.deployment[0].branches_to_finish), (1, 1))
    assert trials[chosen].objective == min(t.objective for t in trials.values())
    assert result.instance.widths == [Width(*chosen[0]), SINGLE]
    config = gateway_config(plan.tiers, [(t, "sglang", f"http://127.0.0.1:{30000 + i}", "m")
                                         for i, t in enumerate(plan.tiers)],
                            widths={d.tier: (d.branches, d.branches_to_finish, d.first_wave) for d in plan.deployment})
    path = tmp_path / "cascade.toml"
    path.write_text(config)
    tiers = {t.name: t for t in load_config(path).tiers}
    assert (tiers["small"].branches.n, tiers["small"].branches.m) == chosen[0]
    assert tiers["large"].branches.n == 1
    # One backend per tier: nothing to choose among, so the default choice stays
    assert {t.replicas.choice for t in tiers.values()} == {"least_outstanding"}


def test_a_voting_tier_with_several_replicas_picks_them_by_prefix_and_a_direct_one_does_not(tmp_path) -> None:
    backends = [(tier, "sglang", f"http://127.0.0.1:{30000 + i}", "m")
                for i, tier in enumerate(["vote", "vote", "direct", "direct"])]
    path = tmp_path / "cascade.toml"
    path.write_text(gateway_config(["direct", "vote"], backends, widths={"vote": (8, 8, 2), "direct": (1, 1, 0)}))
    tiers = {t.name: t for t in load_config(path).tiers}
    assert tiers["vote"].replicas.choice == "prefix" and tiers["vote"].branches.n == 8
    assert tiers["direct"].replicas.choice == "least_outstanding"


def test_a_fixed_width_runs_every_branch_in_the_simulator(tmp_path) -> None:
    narrow, base = _problem(tmp_path)
    wide, _ = _problem(tmp_path, extra_small="branches = 4\nbranches_to_finish = 3\n")
    one, four = plan_problem(narrow, base), plan_problem(wide, base)
    assert four.plan.deployment[0].branches == 4
    assert four.instance.branch_tokens[0] is not None and four.instance.branch_tokens[0].shape[1] == 4
    cap = {p.instance.widths[0]: p.tables[0].curves[0].capacity_rps for p in (one, four)}
    assert cap[Width(4, 3)] < 0.6 * cap[SINGLE]


@pytest.mark.parametrize(("extra", "message"), [
    ("widths = [[2, 3]]\n", "more branches to finish than it launches"),
    ("widths = [[2, 1], [2, 1]]\n", "lists a width twice"),
    ("widths = [[2, 1]]\nbranches = 2\n", "not both"),
    ("widths = [[64, 1]]\n", "more than 32 branches"),
    ("branches = 2\nbranches_to_finish = 3\n", "more branches to finish"),
])
def test_bad_widths_are_refused_with_the_tier_named(tmp_path, extra: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _problem(tmp_path, extra_small=extra)


def test_outcomes_without_branches_cannot_plan_a_wide_tier(tmp_path) -> None:
    rows = tmp_path / "outcomes.jsonl"
    rows.write_text("\n".join(
        f'{{"id": "x:{i}", "difficulty": {i / 40}, "tiers": {{"small": {{"correct": {str(i % 2 == 0).lower()}}}, '
        f'"large": {{"correct": true}}}}}}' for i in range(40)) + "\n")
    problem, base = _problem(tmp_path, extra_small="widths = [[1, 1], [3, 2]]\n", mode="route")
    problem = msgspec.structs.replace(problem, outcomes=FileOutcomes(path=str(rows)))
    with pytest.raises(ConfigError, match="needs reasoning branches per prompt"):
        plan_problem(problem, base)


def _branch_row(i: int, branches: list[tuple[str | None, bool, int]]) -> dict:
    first = branches[0]
    return {"id": f"x:{i}", "difficulty": round(i / 60, 3), "tiers": {
        "small": {"correct": first[1], "output_tokens": first[2],
                  "branches": [{"answer": a, "correct": c, "output_tokens": t} for a, c, t in branches]},
        "large": {"correct": True, "output_tokens": 200}}}


def test_recorded_branches_become_draws_with_answer_ids_and_the_fewest_branches_any_row_has() -> None:
    rows = [msgspec.convert(r, OutcomeRow) for r in (
        _branch_row(0, [("7", False, 50), ("7", False, 60), ("9", True, 40)]),
        _branch_row(1, [(None, False, 30), (None, False, 35), ("4", False, 20), ("4", False, 25)]),
    )]
    outcomes = from_rows(rows, ["small", "large"])
    draws = outcomes.branches[0]
    assert outcomes.branches[1] is None  # the large tier recorded no branches
    assert draws is not None and draws.count == 3  # row 0 has 3 branches: the first 3 of row 1 are kept
    assert draws.answer[0].tolist() == [1, 1, 0]  # equal wrong answers share an id; a correct branch is 0
    unread = draws.answer[1].tolist()
    assert len(set(unread)) == 3 and 0 not in unread  # unreadable answers agree with nothing
    assert draws.tokens[0].tolist() == [50, 60, 40] and np.isnan(draws.score).all()
    assert vote(draws, Width(3, 3)).correct.tolist() == [0, 0]  # two "7"s outvote the right "9"
    assert vote(draws, Width(3, 1)).correct.tolist() == [1, 0]  # the right branch finishes first


def test_the_planner_reads_a_widths_quality_from_recorded_branches(tmp_path) -> None:
    rng = np.random.default_rng(0)
    lines = []
    for i in range(60):
        right = rng.uniform(size=4) < 0.6 - i / 150
        branches = [("42" if r else str(int(rng.integers(1, 4))), bool(r), int(rng.integers(150, 400)))
                    for r in right]
        lines.append(json.dumps(_branch_row(i, branches)))
    path = tmp_path / "branches.jsonl"
    path.write_text("\n".join(lines) + "\n")
    problem, base = _problem(tmp_path, extra_small="widths = [[1, 1], [3, 2], [4, 3]]\n", mode="route")
    problem = msgspec.structs.replace(problem, outcomes=FileOutcomes(path=str(path)))
    result = plan_problem(problem, base)
    assert result.plan.planner is not None
    trials = {tuple(t.widths[0]): t.objective for t in result.plan.planner.width_trials}
    assert set(trials) == {(1, 1), (3, 2), (4, 3)}
    chosen = result.instance.widths[0]
    assert trials[(chosen.n, chosen.m)] == min(trials.values())
    draws = from_rows([msgspec.convert(json.loads(line), OutcomeRow) for line in lines], ["small", "large"])
    assert draws.branches[0] is not None
    expected = vote(draws.branches[0], chosen).correct if chosen != SINGLE else draws.correct[:, 0]
    assert np.array_equal(result.instance.data.quality[:, 0], expected)


def test_a_settled_first_wave_is_simulated_as_its_branches_alone() -> None:
    cost, rng = _cost(), np.random.default_rng(1)
    arrivals = np.sort(rng.uniform(0, 5, 40))
    inputs, first = rng.integers(50, 200, 40), rng.integers(20, 300, (40, 2))
    settled = np.concatenate([first, np.zeros((40, 6), dtype=first.dtype)], axis=1)
    limits = dict(kv_capacity_tokens=cost.kv_capacity_tokens)
    waves = simulator.simulate_waves(cost, arrivals, inputs, settled, first_wave=2, **limits)
    alone = simulator.simulate_branches(cost, arrivals, inputs, first, **limits)
    assert waves.latency_s.tolist() == alone.latency_s.tolist()


def test_a_second_wave_starts_when_the_first_ended() -> None:
    cost = _cost()
    limits = dict(kv_capacity_tokens=cost.kv_capacity_tokens)
    # One request alone: its second wave decodes after its first, so its latency is about the two waves' in turn.
    branches = np.array([[100, 60, 80, 80, 80]])
    waves = simulator.simulate_waves(cost, np.zeros(1), np.array([100]), branches, first_wave=2, **limits)
    first = simulator.simulate_branches(cost, np.zeros(1), np.array([100]), branches[:, :2], **limits)
    second = simulator.simulate_branches(cost, np.zeros(1), np.array([100]), branches[:, 2:], **limits)
    together = simulator.simulate_branches(cost, np.zeros(1), np.array([100]), branches, **limits)
    assert waves.latency_s[0] == pytest.approx(first.latency_s[0] + second.latency_s[0], rel=1e-9)
    assert waves.latency_s[0] > together.latency_s[0]
    assert waves.ttft_s[0] == pytest.approx(first.ttft_s[0])


def test_second_waves_delay_the_first_waves_that_share_their_replica() -> None:
    cost, rng = _cost(), np.random.default_rng(2)
    n = 200
    arrivals = np.sort(rng.uniform(0, 20, n))
    inputs, first = rng.integers(50, 200, n), rng.integers(100, 400, (n, 2))
    later = np.where(rng.random((n, 1)) < 0.5, rng.integers(100, 400, (n, 6)), 0)
    limits = dict(kv_capacity_tokens=cost.kv_capacity_tokens, max_batch=256)
    waves = simulator.simulate_waves(cost, arrivals, inputs, np.concatenate([first, later], axis=1), first_wave=2,
                                     **limits)
    alone = simulator.simulate_branches(cost, arrivals, inputs, first, **limits)
    assert waves.stable and alone.stable
    settled = (later == 0).all(axis=1)
    assert waves.latency_s[settled].mean() > 1.1 * alone.latency_s[settled].mean()
    assert (waves.latency_s[~settled] > alone.latency_s[~settled]).all()
