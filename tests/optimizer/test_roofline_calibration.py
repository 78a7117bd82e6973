"""The planner's step predictions against the step times measured on the GPUs cascade ships profiles for (issue 62
item 4): ../shared/data/gpu/<gpu>-steps.json, today the H200's (an unfused decoder with CUDA-graph decode)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import pytest

from benchmarks.planner import roofline_calibration
from cascade.optimizer import measured_steps as ms
from cascade.optimizer.cards import ModelCard, load_gpu, load_model
from cascade.optimizer.instance import card_cost, load_instance
from cascade.optimizer.planner import plan_problem
from cascade.optimizer.problem import Problem, TierSpec, load_problem
from cascade.optimizer.profile import PROFILE_DIR, ProfileCost, load_profile
from cascade.optimizer.report import markdown
from cascade.optimizer.roofline import Efficiency, RooflineCost, Shape
from tests.optimizer.conftest import SMALL_PROBLEM
from tests.shared_data import shared_file

BOUND = 0.15  # relative error the planner's prediction may have at any measured point
# The calibrated roofline on shapes without a GPU model card: the planner never runs the roofline on them (their
# tiers need a profile), so the fit leaves them out; held at what it gives them, smollm2 decode -7.8%..+16.0%,
# qwen2.5-coder-0.5b decode -21.0%..+19.1% and prefill of 8,192 tokens -18.2%.
ROOFLINE_OFF_CARD = {"smollm2-135m": 0.17, "qwen2.5-coder-0.5b": 0.22}
MEASURED = sorted((gpu.name, path.stem) for gpu in PROFILE_DIR.iterdir() if gpu.is_dir() for path in gpu.glob("*.json"))


def measured(gpu: str) -> tuple[ms.MeasuredSteps, dict[str, ModelCard]]:
    steps = shared_file("gpu", f"{gpu}-steps.json")
    return ms.load_steps(steps), ms.shape_cards(steps)


def planner_problem(gpu: str) -> Problem:
    problem = msgspec.toml.decode(SMALL_PROBLEM.format(mode="route").replace('"h100-sxm"', f'"{gpu}"'), type=Problem)
    assert problem.efficiency == Efficiency()  # the default the planner plans with
    return problem


def worst(errors: np.ndarray) -> str:
    i = int(np.argmax(np.abs(errors)))
    return f"{errors[i]:+.1%} (point {i})"


@pytest.mark.parametrize(("gpu", "shape"), MEASURED)
def test_the_planners_default_tp1_prediction_is_within_15_percent_of_every_measured_decode_step(gpu: str, shape: str
                                                                                                ) -> None:
    steps, cards = measured(gpu)
    cost = card_cost(planner_problem(gpu), TierSpec(name="t", model=shape), load_gpu(gpu), cards[shape], Shape(1))
    errors = ms.decode_errors(cost, steps.models[shape])
    assert np.max(np.abs(errors)) <= BOUND, f"{gpu} {shape} ({type(cost).__name__}): worst {worst(errors)}"


@pytest.mark.parametrize(("gpu", "shape"), MEASURED)
def test_the_calibrated_roofline_alone_is_within_its_bound_of_every_measured_step(gpu: str, shape: str) -> None:
    """Every decode step, and every prefill that kernel launches do not bound (measured_steps.launch_bound)."""
    steps, cards = measured(gpu)
    cost = RooflineCost(cards[shape], load_gpu(gpu), Shape(1))
    bound = ROOFLINE_OFF_CARD.get(shape, BOUND)
    decode = ms.decode_errors(cost, steps.models[shape])
    prefill = ms.prefill_errors(cost, steps.models[shape])[~ms.launch_bound(steps.models[shape])]
    assert np.max(np.abs(decode)) <= bound, f"{gpu} {shape} decode: worst {worst(decode)} (bound {bound:.0%})"
    assert np.max(np.abs(prefill), initial=0.0) <= bound, f"{gpu} {shape} prefill: worst {worst(prefill)}"


def test_the_default_efficiency_is_the_committed_fit_of_the_h200_steps() -> None:
    steps, cards = measured("h200")
    carded = msgspec.structs.replace(steps, models={n: m for n, m in steps.models.items() if ms.has_card(n)})
    fitted = roofline_calibration.fit(cards, carded, "h200")
    default = Efficiency()
    assert roofline_calibration.rounded(fitted) == {f: getattr(default, f) for f in roofline_calibration.FITTED}


def test_every_shipped_profile_of_a_cards_model_is_its_tp1_replica() -> None:
    for gpu, shape in MEASURED:
        profile = load_profile(PROFILE_DIR / gpu / f"{shape}.json")
        assert profile.shape == Shape(1), (gpu, shape)
        if ms.has_card(shape):
            assert profile.model == load_model(shape).hf_id, (gpu, shape)


def test_a_card_tier_on_a_gpu_with_its_measured_profile_plans_tp1_with_it_and_tp2_with_the_roofline() -> None:
    inst = load_instance(planner_problem("h200"), Path.cwd())
    for costs in inst.costs:
        assert isinstance(costs[Shape(1)], ProfileCost)
        assert all(isinstance(c, RooflineCost) for s, c in costs.items() if s != Shape(1))
    assert inst.shipped_profiles == {"small": "models/gpu/profiles/h200/llama-3.1-8b.json",
                                     "large": "models/gpu/profiles/h200/deepseek-r1-distill-qwen-32b.json"}
    assert inst.latency_model == "mixed"


def test_a_tier_opts_out_of_the_shipped_profile_and_other_gpus_have_none() -> None:
    problem = planner_problem("h200")
    opted_out = msgspec.structs.replace(problem, tiers=[msgspec.structs.replace(t, shipped_profile=False)
                                                        for t in problem.tiers])
    for inst in (load_instance(opted_out, Path.cwd()), load_instance(planner_problem("h100-sxm"), Path.cwd())):
        assert all(isinstance(c, RooflineCost) for costs in inst.costs for c in costs.values())
        assert inst.shipped_profiles == {} and inst.latency_model == "roofline"


def test_an_explicit_profile_wins_over_the_shipped_one(tmp_path: Path) -> None:
    mine = load_profile(PROFILE_DIR / "h200" / "llama-3.1-8b.json")
    mine = msgspec.structs.replace(mine, decode=msgspec.structs.replace(mine.decode, fixed_s=0.5))
    (tmp_path / "mine.json").write_bytes(msgspec.json.encode(mine))
    problem = planner_problem("h200")
    tiers = [msgspec.structs.replace(problem.tiers[0], profile="mine.json"), problem.tiers[1]]
    inst = load_instance(msgspec.structs.replace(problem, tiers=tiers), tmp_path)
    cost = inst.costs[0][Shape(1)]
    assert isinstance(cost, ProfileCost) and cost.profile.decode.fixed_s == 0.5
    assert list(inst.shipped_profiles) == ["large"]


def test_the_plan_and_its_report_name_the_shipped_profiles_it_planned_with(tmp_path: Path) -> None:
    spec = tmp_path / "problem.toml"
    spec.write_text(SMALL_PROBLEM.format(mode="route").replace('"h100-sxm"', '"h200"'))
    problem, base = load_problem(spec)
    plan = plan_problem(problem, base).plan
    assert plan.planner is not None
    assert set(plan.planner.shipped_profiles) == {"small", "large"}
    assert "plans TP1 with the measured profile `models/gpu/profiles/h200/llama-3.1-8b.json`" in markdown(plan)
