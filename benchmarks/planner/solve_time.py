"""Planner solve times on this machine: the allocation MILP alone and the whole bi-level plan.

Cases (issue #5 targets): 32 GPUs x 3 tiers (< 5 s) and 256 GPUs x 4 tiers (< 60 s).
  * milp: random non-increasing l(f) tables (seeded), HiGHS on the plain model, HiGHS with the
    dynamic program's answer as column bound, and the dynamic program alone.
  * plan: `plan_problem` end to end (simulated latency curves, bi-level search, HiGHS deployment,
    Pareto front, operating points, end-to-end simulation). Solver imports (pymoo, highspy,
    scipy) are done first and timed apart: they are a fixed per-process cost. Wall and CPU time
    are both reported because the machine is shared (wall > CPU means waiting for a core).

Output: one JSON object on stdout. Usage: .venv/bin/python -m benchmarks.planner.solve_time
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import msgspec
import numpy as np

from cascade.testing.scripts import print_result

ROOT = Path(__file__).resolve().parents[2]
LARGE = """
[cluster]
gpu = "h100-sxm"
gpus = 256
gpus_per_node = 8
[[tiers]]
name = "r1-qwen-1.5b"
model = "deepseek-r1-distill-qwen-1.5b"
[[tiers]]
name = "r1-qwen-7b"
model = "deepseek-r1-distill-qwen-7b"
[[tiers]]
name = "r1-qwen-32b"
model = "deepseek-r1-distill-qwen-32b"
[[tiers]]
name = "r1-llama-70b"
model = "deepseek-r1-distill-llama-70b"
[workload]
rate_rps = 128.0
[outcomes]
kind = "synthetic"
n = 2000
skills = [0.45, 0.6, 0.78, 0.92]
[quality]
target = 0.90
"""


def timed(fn):  # type: ignore[no-untyped-def]
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, round(time.perf_counter() - wall, 3), round(time.process_time() - cpu, 3)


def milp_case(tiers: int, gpus: int, seed: int) -> dict[str, object]:
    from cascade.optimizer.milp import solve_dp, solve_highs

    rng = np.random.default_rng(seed)
    table = np.minimum.accumulate(rng.uniform(1.0, 10.0, size=(tiers, gpus + 1)), axis=1)
    table[:, 0] = np.inf
    dp, dp_wall, _ = timed(lambda: solve_dp(table, gpus))
    plain, plain_wall, _ = timed(lambda: solve_highs(table, gpus))
    bounded, bounded_wall, _ = timed(lambda: solve_highs(table, gpus, upper_bound=dp.latency_s))
    assert plain.latency_s == bounded.latency_s == dp.latency_s
    return {"tiers": tiers, "gpus": gpus, "highs_s": plain_wall, "highs_with_bound_s": bounded_wall, "dp_s": dp_wall,
            "latency_s": round(dp.latency_s, 4)}


def plan_case(name: str, problem_toml: bytes, base_dir: Path) -> dict[str, object]:
    from cascade.optimizer.planner import plan_problem
    from cascade.optimizer.problem import Problem

    problem = msgspec.toml.decode(problem_toml, type=Problem)
    rounds: list[str] = []
    result, wall, cpu = timed(lambda: plan_problem(problem, base_dir, rounds.append))
    balanced = next(p for p in result.plan.operating_points if p.hint == "balanced")
    return {"case": name, "gpus": problem.cluster.gpus, "tiers": len(problem.tiers), "wall_s": wall, "cpu_s": cpu,
            "rounds": len(result.history), "objective": round(result.primary.objective, 3),
            "quality": balanced.predicted_quality, "allocation": {d.tier: d.gpus for d in result.plan.deployment},
            "curves_simulated": len(result.instance.curves)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json-out", help="also write the JSON here")
    args = parser.parse_args()
    _, import_s, _ = timed(lambda: __import__("cascade.optimizer.warm_imports", fromlist=["*"]))
    milp = [milp_case(3, 32, 0), milp_case(4, 256, 0)]
    plans = [plan_case("32 GPUs x 3 tiers (examples/problem-cascadia.toml)",
                       (ROOT / "examples" / "problem-cascadia.toml").read_bytes(), ROOT / "examples"),
             plan_case("256 GPUs x 4 tiers", LARGE.encode(), ROOT)]
    targets = {"32x3_under_5_s": plans[0]["wall_s"] < 5, "256x4_under_60_s": plans[1]["wall_s"] < 60}
    print_result({"solver_imports_s": import_s, "milp": milp, "plan": plans, "targets_met": targets}, args.json_out,
                 indent=2)


if __name__ == "__main__":
    main()
