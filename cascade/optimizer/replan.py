"""Re-plan from observed traffic: `cascade optimize drift --plan P --traffic T --spec problem.toml --out new.json`.

The window's arrival rate replaces `workload.rate_rps` (the problem's rate stays when the window
has too few records to estimate one). Its token lengths rescale the problem's (`LengthScale`):
prompts by the drift check's observed / expected mean prompt tokens, each tier's outputs by its own
observed / expected mean completion tokens (the pooled ratio for a tier with fewer than
`min_requests` records). "Expected" is relative to the old plan, so --spec should be the problem
that plan was made from. Outcomes, cluster and quality target stay the problem's; the hint mix is
no planner input (the deployment is planned for the quality target, every hint gets a point on it).

The report's "replan" entry:

    {"plan": str, "report": str, "rate_rps": float, "rate_source": "traffic" | "problem",
     "length_scale": {"prompt": float, "output": {tier: float}} | null, "notes": [str],
     "allocation": {"old": {tier: gpus}, "new": {tier: gpus}},
     "hints": {hint: {"old": P | null, "new": P | null}}}
        P = {"predicted_p95_latency_s", "predicted_e2e_p95_latency_s", "predicted_throughput_rps",
             "predicted_quality"}   (old: at the old plan's rate; new: at the observed rate)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from cascade.errors import ConfigError
from cascade.optimizer.planner import PlanResult, Progress, plan_problem
from cascade.optimizer.problem import Problem
from cascade.optimizer.workload import LengthScale
from cascade.plan import OperatingPoint, Plan


def length_scale(report: dict[str, Any], tiers: list[str], min_requests: int) -> tuple[LengthScale | None, list[str]]:
    tokens = report["checks"]["tokens"]
    if tokens["prompt"] is None or tokens["completion"] is None:
        return None, ["the old plan records no workload lengths: the problem's token lengths are kept"]
    notes = []
    if tokens["n"] < min_requests:
        notes.append(f"token lengths rescaled from only {tokens['n']} record(s)")
    pooled = tokens["completion"]["ratio"] or 1.0
    output = []
    for name in tiers:
        entry = tokens["tiers"].get(name)
        own = entry["completion"]["ratio"] if entry is not None and entry["n"] >= min_requests else None
        output.append(own or pooled)
    return LengthScale(prompt=tokens["prompt"]["ratio"] or 1.0, output=tuple(output)), notes


def replan(plan: Plan, report: dict[str, Any], problem: Problem, base_dir: Path, min_requests: int,
           progress: Progress | None = None) -> tuple[PlanResult, dict[str, Any]]:
    names = [t.name for t in problem.tiers]
    if names != list(plan.tiers):
        raise ConfigError(f"--spec has tiers {', '.join(names)}; the plan has {', '.join(plan.tiers)}: give the "
                          "problem the plan was made from")
    observed = report["checks"]["rate"]["observed_rps"]
    notes: list[str] = []
    if observed is None:
        notes.append("too few records to estimate the rate: the problem's workload.rate_rps is kept")
    rate = observed if observed is not None else problem.workload.rate_rps
    workload = msgspec.structs.replace(problem.workload, rate_rps=rate)
    scale, scale_notes = length_scale(report, names, min_requests)
    if report["checks"]["hint_mix"]["status"] == "drift":
        notes.append(f"the hint mix is no planner input: the new deployment is still sized for "
                     f"`{report['checks']['hint_mix']['planned_hint']}`")
    result = plan_problem(msgspec.structs.replace(problem, workload=workload), base_dir, progress, scale)
    summary = {
        "plan": None, "report": None, "rate_rps": result.instance.rate_rps,
        "rate_source": "problem" if observed is None else "traffic",
        "length_scale": None if scale is None else {
            "prompt": round(scale.prompt, 4),
            "output": {n: round(f, 4) for n, f in zip(names, scale.output, strict=True)}},
        "notes": notes + scale_notes,
        "allocation": {"old": {d.tier: d.gpus for d in plan.deployment},
                       "new": {d.tier: d.gpus for d in result.plan.deployment}},
        "hints": compare_points(plan, result.plan),
    }
    return result, summary


def _predictions(point: OperatingPoint | None) -> dict[str, float | None] | None:
    if point is None:
        return None
    return {"predicted_p95_latency_s": point.predicted_p95_latency_s,
            "predicted_e2e_p95_latency_s": point.predicted_e2e_p95_latency_s,
            "predicted_throughput_rps": point.predicted_throughput_rps, "predicted_quality": point.predicted_quality}


def compare_points(old: Plan, new: Plan) -> dict[str, dict[str, Any]]:
    before = {p.hint: p for p in old.operating_points}
    after = {p.hint: p for p in new.operating_points}
    hints = [*after, *(h for h in before if h not in after)]
    return {h: {"old": _predictions(before.get(h)), "new": _predictions(after.get(h))} for h in hints}
