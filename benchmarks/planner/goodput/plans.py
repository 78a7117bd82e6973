"""Arm e: `cascade optimize plan` for the target and the rate, on the training fold, served as planned.

Per fold and rate, a problem (the cluster of G emulated H200s, one TP1 replica per GPU, each tier's measured H200
profile with the engines' batch cap, the training fold's planning rows, the quality target, the end-to-end SLO as the
latency the plan must hold, or with `--plan-slo both` the TTFT and end-to-end SLOs: a voting tier then held to the
TTFT one) is planned by the real planner; its allocation becomes the fleet, its plan file the
gateway's `--plan` (thresholds per hint on the router's route score), its numeric hint the requests' quality.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import msgspec

from benchmarks.planner.goodput.arms import Arm
from benchmarks.planner.goodput.folds import TIERS, Fold, reasoning_width
from cascade.plan import load_plan
from cascade.testing.twin import H200, V8_TWIN

PROBLEM = """[cluster]
gpu = "h200"
gpus = {gpus}
gpus_per_node = 8
allocation = "at_most"
max_replica_gpus = 1
deploy_every_tier = {every_tier}
{tiers}
[workload]
rate_rps = {rate}
dataset = "gsm8k-train"

[outcomes]
kind = "file"
path = "{rows}"

[routing]
mode = "route"

[quality]
target = {target}
metric = "correct"
mu = 1000.0

[slo]
percentile = 95
{slo}
"""


def problem_toml(fold: Fold, gpus: int, rate: float, target: str, max_running: int, e2e_slo_s: float,
                 every_tier: bool = True, ttft_slo_s: float | None = None) -> str:
    """`ttft_slo_s` given: `[slo]` carries both SLOs (`ttft_s`, `e2e_s`), so that the planner holds the voting tier
    to the TTFT one; else `latency_s` = the end-to-end SLO, as the results before that were planned."""
    profiles = {t.tier: H200 / f"{t.profile}.json" for t in V8_TWIN}
    widths = {t: "" for t in TIERS}
    if fold.vote == "waves":  # the reasoning tier's width as served; the planner votes and times its branches
        n, m, first = reasoning_width()
        widths[TIERS[-1]] = f"branches = {n}\nbranches_to_finish = {m}\nfirst_wave = {first}\n"
    tiers = "".join(f'\n[[tiers]]\nname = "{t}"\nprofile = "{profiles[t]}"\nmax_batch = {max_running}\n{widths[t]}'
                    for t in TIERS)
    slo = (f"latency_s = {round(e2e_slo_s, 3)}" if ttft_slo_s is None else
           f"ttft_s = {round(ttft_slo_s, 3)}\ne2e_s = {round(e2e_slo_s, 3)}")
    return PROBLEM.format(gpus=gpus, tiers=tiers, rate=rate, rows=fold.planning_rows, target=target, slo=slo,
                          every_tier=str(every_tier).lower())


def planned(fold: Fold, gpus: int, rate: float, target: str, max_running: int, e2e_slo_s: float, work: Path,
            every_tier: bool = True, ttft_slo_s: float | None = None) -> Arm:
    """The plan for `fold` (made on its training questions) at `rate`, as an arm serving `fold`; `every_tier` false:
    the fleet sized for the target's traffic alone (`[cluster] deploy_every_tier = false`); `ttft_slo_s`: planned
    with both SLOs (problem_toml)."""
    work.mkdir(parents=True, exist_ok=True)
    spec, out = work / "problem.toml", work / "plan.json"
    if not out.exists():
        spec.write_text(problem_toml(fold, gpus, rate, target, max_running, e2e_slo_s, every_tier, ttft_slo_s))
        done = subprocess.run([sys.executable, "-m", "cascade.cli", "optimize", "plan", "--spec", str(spec),
                               "--out", str(out), "--no-figure"], capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise RuntimeError(f"planning failed: {done.stderr[-2000:]}")
    plan = load_plan(out)
    replicas = {d.tier: d.replicas for d in plan.deployment if d.replicas}
    return Arm("e-plan", replicas, routing={fold.name: f'policy = "learned"\nrouter = "{fold.router}"'},
               plan={fold.name: out})


def plan_summary(path: Path) -> dict[str, object]:
    plan = load_plan(path)
    return {"deployment": {d.tier: d.replicas for d in plan.deployment},
            "operating_points": {p.hint: msgspec.to_builtins(p) for p in plan.operating_points}}
