"""The goodput benchmark's parts (benchmarks/planner/goodput/): its scores on hand-made rows, and one arm end to end on
two emulated GPUs for a few seconds: a fleet process, a real `cascade serve` per fold, `cascade loadgen`, the real
grader — every request answered as the ladder recorded it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import msgspec
import pytest

from benchmarks.planner.goodput import arms
from benchmarks.planner.goodput.arms import REASON_TIER
from benchmarks.planner.goodput.folds import Fold, reasoning_width, split, vote_branches, write_questions
from benchmarks.planner.goodput.plans import problem_toml
from benchmarks.planner.goodput.predict import recorded_waves
from benchmarks.planner.goodput.run import Setting, measure
from benchmarks.planner.goodput.scores import held_rate, paired_difference, point_stats, scale_needed, summarize
from benchmarks.planner.goodput_per_gpu import parse_args, plan_dir
from cascade.config.load import decode_config
from cascade.data.outcomes import read_rows
from cascade.optimizer.outcomes import from_rows
from cascade.optimizer.problem import load_problem
from cascade.optimizer.widths import Width, vote
from cascade.testing.fakes.recorded import read_tier
from cascade.testing.twin import V8, V8_TWIN

SLO = (1.0, 2.0)  # TTFT, end to end (s)


def _row(q: str, ttft: float | None, e2e: float | None, correct: bool, error: str | None = None) -> dict[str, object]:
    return {"q": q, "tier": "t", "ttft_s": ttft, "e2e_s": e2e, "correct": correct, "error": error, "status": None}


def test_a_request_is_good_only_correct_and_within_both_slos() -> None:
    rows = [_row("a", 0.5, 1.0, True), _row("b", 1.5, 1.0, True), _row("c", 0.5, 3.0, True),
            _row("d", 0.5, 1.0, False), _row("e", None, None, False, "HTTP 429")]
    stats = point_stats(rows, rate=10.0, gpus=2, ttft_slo_s=SLO[0], e2e_slo_s=SLO[1])
    assert stats["good_share"] == pytest.approx(1 / 5)
    assert stats["goodput_per_gpu"] == pytest.approx(10.0 * (1 / 5) / 2)
    assert stats["slo_attainment"] == pytest.approx(2 / 5)
    assert stats["accuracy"] == pytest.approx(3 / 5)
    assert stats["shed"] == pytest.approx(1 / 5)
    assert scale_needed(rows[1], *SLO) == pytest.approx(1.5)
    assert math.isinf(scale_needed(rows[4], *SLO))


def _point(seed: int, good: Any) -> dict[str, Any]:
    """Ten questions asked twice at 10 req/s on 2 GPUs; `good(q, seed)`: whether that question's answers are right
    (every answer within the SLOs)."""
    rows = [{"q": f"q{q}", "correct": good(q, seed), "error": None, "status": 200, "ttft_s": 0.5, "e2e_s": 1.0,
             "tier": "t"} for q in range(10) for _ in range(2)]
    return {"rate": 10.0, "gpus": 2, "seed": seed, "requests": rows}


def test_a_paired_difference_cancels_what_two_arms_share_and_needs_the_same_seeds() -> None:
    half = [_point(s, lambda q, s: q % 2 == 0) for s in (0, 1)]
    twin = paired_difference(half, [_point(s, lambda q, s: q % 2 == 0) for s in (0, 1)], 30.0, 60.0, resamples=200)
    assert twin["good_share"] == {"first": 0.5, "second": 0.5, "difference": 0.0, "ci95": [0.0, 0.0]}
    # Right wherever `half` is, and on q1, q3, q5, q7 too: ahead on 4 questions, behind on none
    better = paired_difference([_point(s, lambda q, s: q != 9) for s in (0, 1)], half, 30.0, 60.0, resamples=200)
    assert better["good_share"]["difference"] == pytest.approx(0.4)
    assert better["goodput_per_gpu"]["difference"] == pytest.approx(10.0 * 0.4 / 2)
    low, high = better["good_share"]["ci95"]
    assert 0.0 <= low < 0.4 < high  # the questions' draw moves it, but no draw puts the first arm behind
    with pytest.raises(ValueError, match="same arrival seeds"):
        paired_difference(half, [_point(s, lambda q, s: True) for s in (0, 2)], 30.0, 60.0)


def test_the_held_rate_is_the_highest_within_slo_and_accurate_enough() -> None:
    by_rate = {1.0: {"slo_attainment": 1.0, "accuracy": 0.7}, 2.0: {"slo_attainment": 0.96, "accuracy": 0.7},
               4.0: {"slo_attainment": 0.90, "accuracy": 0.7}, 8.0: {"slo_attainment": 0.99, "accuracy": 0.5}}
    assert held_rate(by_rate, 0.6) == 2.0
    assert held_rate(by_rate, 0.8) is None


def test_folds_split_every_question_once_and_by_seed() -> None:
    ids = [f"q{i}" for i in range(10)]
    a, b = split(ids, 0)
    assert sorted(a + b) == sorted(ids) and not set(a) & set(b) and len(a) == 5
    assert split(ids, 0) == (a, b) and split(ids, 1) != (a, b)


def two_recorded_folds(tmp_path: Path) -> tuple[dict[str, Any], list[Fold]]:
    """The first 8 recorded questions as two folds of 4 (no router, no planning rows): the quick end-to-end runs'."""
    recorded = {row.id: row for _, row in read_rows(V8) if row.id is not None}
    ids = sorted(recorded)[:8]
    folds = []
    for name, served in (("A", ids[:4]), ("B", ids[4:])):
        dataset = write_questions(tmp_path / f"{name}.jsonl", served)
        folds.append(Fold(name=name, questions=served, trained_on=[], dataset=dataset, router=tmp_path,
                          planning_rows=tmp_path, accuracy={}))
    return recorded, folds


def test_one_arm_end_to_end_on_two_emulated_gpus_answers_as_recorded(tmp_path: Path) -> None:
    recorded, folds = two_recorded_folds(tmp_path)
    ids = [q for fold in folds for q in fold.questions]
    setting = Setting(time_scale=1.0, max_running=16, stream_interval=8, ttft_slo_s=30.0, e2e_slo_s=60.0,
                      requests_per_fold=4, arrival="poisson")
    arm = arms.all_reasoning(2)
    point = measure(arm, folds, rate=2.0, seed=0, setting=setting, work=tmp_path / "run", quality={})
    rows = point["requests"]
    assert len(rows) == 8 and {r["q"] for r in rows} == set(ids)
    assert all(r["error"] is None and r["tier"] == arms.REASON_TIER for r in rows)
    expected = {q: bool(recorded[q].tiers[arms.REASON_TIER].correct) for q in ids}
    assert {r["q"]: r["correct"] for r in rows} == expected
    summary = summarize([point], setting.ttft_slo_s, setting.e2e_slo_s, resamples=20)
    assert summary["accuracy"] == pytest.approx(sum(expected.values()) / 8)
    assert summary["slo_attainment"] == 1.0 and summary["shed"] == 0.0


def test_arm_p_asks_every_tier_for_the_prefix_replica_choice_and_t_keeps_the_default() -> None:
    replicas = {arms.PLAIN_TIER: 2, REASON_TIER: 3}
    urls = {arms.PLAIN_TIER: ["http://127.0.0.1:1001", "http://127.0.0.1:1002"],
            REASON_TIER: [f"http://127.0.0.1:{2001 + i}" for i in range(3)]}
    by_choice = {}
    for choice in ("", "prefix"):
        text = arms.gateway_toml(arms.Arm("p", replicas, replica_choice=choice), urls, "A", max_running=16)
        by_choice[choice] = {t.name: t.replicas.choice for t in decode_config(text).tiers}
    assert set(by_choice["prefix"].values()) == {"prefix"} and len(by_choice["prefix"]) == len(arms.TIERS)
    assert set(by_choice[""].values()) == {"least_outstanding"}


def test_the_gateways_limits_are_the_defaults_at_8_gpus_and_grow_with_the_fleet() -> None:
    urls = {REASON_TIER: ["http://127.0.0.1:2001"]}
    defaults = decode_config(arms.gateway_toml(arms.Arm("b", {REASON_TIER: 8}), urls, "A", max_running=64))
    assert defaults.gateway.limits == type(defaults.gateway.limits)()
    large = decode_config(arms.gateway_toml(arms.Arm("b", {REASON_TIER: 32}), urls, "A", max_running=64))
    assert large.gateway.limits.max_backend_streams == 4 * defaults.gateway.limits.max_backend_streams
    assert large.gateway.limits.max_in_flight_per_tier == 4 * defaults.gateway.limits.max_in_flight_per_tier


def test_the_vote_is_predicted_in_the_waves_the_twin_replays() -> None:
    rows = {row.id: row for _, row in read_rows(V8) if row.id is not None}
    ids = sorted(rows)[:60]
    lengths, first = recorded_waves(ids)
    records = read_tier(next(t for t in V8_TWIN if t.tier == REASON_TIER).records, REASON_TIER)
    assert first == 2 and lengths.shape == (60, 8)
    settled = 0
    for question, row in zip(ids, lengths, strict=True):
        branches = records[question].branches
        launched = int((row > 0).sum())
        assert launched in (2, 8) and (row[:launched] > 0).all()
        if branches:  # the first wave is the first two recorded branches; the rest only where they disagree
            assert row[:2].tolist() == [max(1, b.output_tokens) for b in branches[:2]]
            agree = branches[0].answer is not None and branches[0].answer == branches[1].answer
            assert launched == (2 if agree else 8)
        settled += launched == 2
    assert 0 < settled < 60  # both kinds among them


def test_the_planner_votes_and_times_the_branches_the_twin_replays() -> None:
    """The planning rows' branches (`--vote waves`), voted by the planner's adaptive width, launch the branches the
    twin's replay does, at the recorded lengths."""
    rows = {row.id: row for _, row in read_rows(V8) if row.id is not None}
    ids = sorted(rows)[:60]
    n, m, first = reasoning_width()
    branches = vote_branches(ids)
    planning = [msgspec.structs.replace(rows[q], tiers={REASON_TIER: msgspec.structs.replace(
        rows[q].tiers[REASON_TIER], branches=branches[q])}) for q in ids]
    draws = from_rows(planning, [REASON_TIER]).branches[0]
    assert draws is not None
    voted = vote(draws, Width(n, m, first))
    lengths, _ = recorded_waves(ids)
    assert voted.branch_tokens.tolist() == lengths.tolist()


def test_plans_with_both_slos_keep_their_own_folder_and_give_the_planner_both_bounds(tmp_path: Path) -> None:
    """`--plan-slo both`: the planned arms' problem.toml carries the TTFT and end-to-end SLOs (the planner holds the
    vote to the TTFT one) and their plans a folder of their own; the default reproduces the folders and problems of
    the results before it."""
    fold = Fold(name="A", questions=[], trained_on=[], dataset=tmp_path, router=tmp_path,
                planning_rows=tmp_path / "rows.jsonl", accuracy={})
    assert parse_args([]).plan_slo == "e2e"
    default = plan_dir(tmp_path, 8, "-mid", "t", fold, 75.0)
    assert default == tmp_path / "plans" / "g8-mid-target-fleet-waves" / "rate-75" / "fold-A"
    assert plan_dir(tmp_path, 8, "-mid", "t", fold, 75.0, "e2e") == default
    both = plan_dir(tmp_path, 8, "-mid", "t", fold, 75.0, "both")
    assert both != default and both.parts[-3] == "g8-mid-target-fleet-waves-slo-both"
    problems = {}
    for name, ttft in (("e2e", None), ("both", 4.9)):
        path = tmp_path / f"problem-{name}.toml"
        path.write_text(problem_toml(fold, 8, 75.0, "0.7270", 64, 9.8, every_tier=False, ttft_slo_s=ttft))
        problems[name] = load_problem(path)[0]
    assert (problems["e2e"].slo.latency_s, problems["e2e"].slo.bounds) == (9.8, None)
    assert (problems["both"].slo.latency_s, problems["both"].slo.bounds) == (None, (4.9, 9.8))
    assert problems["both"].tiers[-1].branches > 1  # the reasoning tier votes: the TTFT SLO binds it
