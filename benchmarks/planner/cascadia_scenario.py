"""A Cascadia-like scenario: 32 x H100 (4 nodes x 8), three DeepSeek-R1 distills (Qwen-7B,
Qwen-32B, Llama-70B), a GSM8K-like reasoning workload with judge scores, quality targets 0.85 and
0.90. Compares the plan with the single largest model, a uniform GPU split, uniform parallelism
and routing-only (cascade/optimizer/baselines.py), and puts the ratios next to the paper's
(PAPERS.md §1.6).

Method
  * Outcomes are synthetic (cascade/optimizer/synthetic.py, seeded): there is no labelled DeepSeek
    data on this machine. Latencies come from the roofline model + continuous-batching simulator.
  * Every system runs the same bi-level loop with its inner level restricted, then is measured by a
    request-level simulation through the ladder (judge hops of 0.27 s included) at the nominal rate.
  * SLO scale = end-to-end p95 / base, base = median latency of a request alone on the largest
    model's fastest replica (the paper's base latency was not recovered). Throughput = highest
    arrival rate whose end-to-end p95 stays within the single largest model's p95 at the nominal
    rate (so that baseline is ~1x by construction).

Output: one JSON object on stdout. Usage: .venv/bin/python -m benchmarks.planner.cascadia_scenario [--rate 16]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import msgspec

from cascade.optimizer import baselines
from cascade.optimizer.instance import load_instance
from cascade.optimizer.problem import Problem, load_problem
from cascade.repo_paths import recorded_value
from cascade.testing.scripts import print_result

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "problem-cascadia.toml"
PAPER = {
    "single_largest": {"slo_scale": "avg 2.8x, up to 4x tighter", "throughput": "avg 3x, up to 5x higher"},
    "uniform_split": {"slo_scale": "avg 1.7x, up to 2.1x (w/o allocation optimization)"},
    "uniform_parallelism": {"slo_scale": "avg 1.4x, up to 1.6x (w/o parallelism optimization)"},
    "routing_only": {"slo_scale": "21.3% lower scale (vs RouteLLM)", "throughput": "18.8% higher"},
}


def scenario(problem: Problem, target: float, n_requests: int, seed: int) -> dict[str, object]:
    problem = msgspec.structs.replace(problem, quality=msgspec.structs.replace(problem.quality, target=target))
    inst = load_instance(problem, EXAMPLE.parent)
    base_s = baselines.base_latency_s(inst)
    outcomes, times = {}, {}
    for name, system in baselines.SYSTEMS.items():
        started = time.perf_counter()
        outcomes[name] = system(inst)
        times[name] = round(time.perf_counter() - started, 2)
    slo_s = baselines.e2e_p95(outcomes["single_largest"], inst.rate_rps, n_requests, seed)
    systems = {name: baselines.summary(o, base_s, slo_s, n_requests, seed) | {"plan_time_s": times[name]}
               for name, o in outcomes.items()}
    ours = systems["cascadia"]
    ratios = {name: {"slo_scale": round(s["slo_scale"] / ours["slo_scale"], 2),  # type: ignore[operator]
                     "throughput": round(ours["throughput_rps"] / max(s["throughput_rps"], 1e-9), 2)}  # type: ignore[operator]
              for name, s in systems.items() if name != "cascadia"}
    return {"quality_target": target, "base_latency_s": round(base_s, 3), "slo_s_for_throughput": round(slo_s, 3),
            "systems": systems, "cascadia_advantage": ratios}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default=str(EXAMPLE))
    parser.add_argument("--rate", type=float, help="override workload.rate_rps")
    parser.add_argument("--targets", default="0.85,0.90")
    parser.add_argument("--requests", type=int, default=1500, help="requests per end-to-end simulation")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-out", help="also write the JSON here")
    args = parser.parse_args()
    problem, _ = load_problem(args.spec)
    if args.rate:
        workload = msgspec.structs.replace(problem.workload, rate_rps=args.rate)
        problem = msgspec.structs.replace(problem, workload=workload)
    started = time.perf_counter()
    results = [scenario(problem, float(t), args.requests, args.seed) for t in args.targets.split(",")]
    print_result({
        "config": {"spec": recorded_value(args.spec), "gpus": problem.cluster.gpus, "gpu": problem.cluster.gpu,
                   "tiers": [t.model for t in problem.tiers], "rate_rps": problem.workload.rate_rps,
                   "routing": problem.routing.mode, "outcomes": "synthetic gsm8k-like (seeded)"},
        "scenarios": results,
        "paper_ratios_PAPERS_md_1_6": PAPER,
        "wall_time_s": round(time.perf_counter() - started, 1),
    }, args.json_out, indent=2)


if __name__ == "__main__":
    main()
