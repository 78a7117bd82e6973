"""Planned reasoning width against fixed widths, on the same cluster and quality target. Prints JSON.

Method
  * The problem is a planning spec (default examples/problem-cascadia.toml: 32 H100s, three DeepSeek-R1
    distills, judge-score cascade, synthetic GSM8K-like outcomes with branches repeating a tier's answer
    with probability `branch_correlation`). Every arm plans the same cluster, workload and outcomes
    (matched cost: the same GPUs), at each quality target of `--targets`:
      - `fixed-1`: one branch per request on every tier (Cascadia as published);
      - `fixed-N,M` for each `--fixed N,M`: that width on every tier;
      - `planned`: every tier chooses among `--widths` (cascade/optimizer/planner.py `choose_widths`:
        coordinate descent over widths, a full bi-level plan per combination).
  * Reported per arm and target: J, the worst tier's p95 L (s) and its envelope (the lowest L among the
    arm's plans whose quality meets this target: the search is a heuristic, and a plan made for a higher
    target may beat the one made for this), quality Q, the widths, GPUs per tier,
    the balanced point's end-to-end p95, tokens decoded per request (all branches, every tier the
    request visits, from the plan's own routing), and the solve time. Predictions of the planner's
    models (roofline + simulator), not measurements on GPUs.
  * `--plot FILE.png`: L and tokens per request against the target, one line per arm.

Usage: .venv/bin/python -m benchmarks.planner.plan_widths [--spec examples/problem-cascadia.toml]
       [--targets 0.88,0.90,0.92] [--widths 1,1:3,2:5,3:8,5] [--fixed 5,3] [--branched-tiers a,b]
       [--plot out.png] [--out out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from cascade.errors import CascadeError
from cascade.optimizer import routing
from cascade.optimizer.planner import PlanResult, plan_problem
from cascade.optimizer.problem import Problem, load_problem
from cascade.repo_paths import recorded_value
from cascade.testing.scripts import print_result

ROOT = Path(__file__).resolve().parents[2]


def parse_widths(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(":"):
        n, _, m = part.partition(",")
        out.append((int(n), int(m)))
    return out


def with_widths(problem: Problem, target: float, fixed: tuple[int, int] | None,
                candidates: list[tuple[int, int]], branched: set[str] | None = None) -> Problem:
    """The problem at `target`, every tier in `branched` (default: all) at the fixed width, or choosing among
    the candidates; the other tiers answer with one branch."""
    tiers = []
    for t in problem.tiers:
        one_branch = branched is not None and t.name not in branched
        width = (1, 1) if one_branch or not fixed else fixed
        widths = [] if one_branch or fixed else list(candidates)
        tiers.append(msgspec.structs.replace(t, widths=widths, branches=width[0], branches_to_finish=width[1]))
    return msgspec.structs.replace(problem, tiers=tiers,
                                   quality=msgspec.structs.replace(problem.quality, target=target))


def tokens_per_request(result: PlanResult) -> float:
    """Decoded tokens per request, all branches of every tier the request visits, at the plan's thresholds."""
    inst = result.instance
    reach = routing.reach(inst.data, routing.final_tier(inst.data, result.primary.ks))
    total = np.zeros(len(reach))
    for i in range(len(inst.names)):
        decoded = inst.decode_lengths(i, np.arange(len(reach)))
        total += np.where(reach[:, i], decoded.sum(axis=1) if decoded.ndim == 2 else decoded, 0)
    return float(total.mean())


def ratio(planned: float | None, other: float | None) -> float | None:
    """planned / other, None where either arm has no plan meeting the target."""
    return None if planned is None or other is None else round(planned / other, 3)


def summarize(result: PlanResult, seconds: float) -> dict[str, Any]:
    plan = result.plan
    balanced = next((p for p in plan.operating_points if p.hint == "balanced"), None)
    return {
        "objective": round(result.primary.objective, 3), "latency_s": round(result.primary.latency_s, 3),
        "quality": round(result.primary.quality, 4), "thresholds": result.primary.thresholds,
        "widths": {d.tier: [d.branches, d.branches_to_finish] for d in plan.deployment},
        "gpus": {d.tier: d.gpus for d in plan.deployment},
        "e2e_p95_s": balanced.predicted_e2e_p95_latency_s if balanced else None,
        "tokens_per_request": round(tokens_per_request(result), 1),
        "plans_tried": len(plan.planner.width_trials) if plan.planner and plan.planner.width_trials else 1,
        "solve_s": round(seconds, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spec", default=str(ROOT / "examples" / "problem-cascadia.toml"))
    parser.add_argument("--targets", default="0.88,0.90,0.92", help="quality targets, comma-separated")
    parser.add_argument("--widths", default="1,1:3,2:5,3:8,5", help="candidate widths N,M separated by ':'")
    parser.add_argument("--fixed", action="append", default=None, help="a fixed width N,M for every tier "
                        "(repeatable; default 5,3); one branch is always an arm")
    parser.add_argument("--branched-tiers", default="", help="comma-separated tiers that get the widths (default: "
                        "every tier); the others answer with one branch")
    parser.add_argument("--plot", default="")
    parser.add_argument("--out", "--json-out", dest="out", default="")
    args = parser.parse_args(argv)
    try:
        targets = [float(t) for t in args.targets.split(",")]
        candidates = parse_widths(args.widths)
        fixed = [(1, 1), *[parse_widths(f)[0] for f in (args.fixed or ["5,3"])]]
    except ValueError as exc:
        print(f"plan_widths: bad --targets/--widths/--fixed: {exc}", file=sys.stderr)
        return 2
    try:
        problem, base = load_problem(args.spec)
    except CascadeError as exc:
        print(f"plan_widths: {exc.message}", file=sys.stderr)
        return 2
    branched = {t for t in args.branched_tiers.split(",") if t} or None
    unknown = sorted((branched or set()) - {t.name for t in problem.tiers})
    if unknown:
        print(f"plan_widths: --branched-tiers: no tier {', '.join(unknown)} in {args.spec}", file=sys.stderr)
        return 2
    arms: dict[str, tuple[int, int] | None] = {("fixed-1" if w == (1, 1) else f"fixed-{w[0]},{w[1]}"): w
                                               for w in fixed}
    arms["planned"] = None
    rows: list[dict[str, Any]] = []
    for target in targets:
        for arm, width in arms.items():
            started = time.perf_counter()
            result = plan_problem(with_widths(problem, target, width, candidates, branched), base)
            row = {"target": target, "arm": arm, **summarize(result, time.perf_counter() - started)}
            print(json.dumps(row), file=sys.stderr)
            rows.append(row)
    for row in rows:
        # A plan that meets a higher target meets this one too: the search is a heuristic (a bi-level
        # alternation can settle in a local optimum), so each arm is also read at its best plan so far.
        # None: no plan of this arm meets the target (a fixed width may be unable to reach it at all).
        row["meets_target"] = row["quality"] >= row["target"] - 1e-9
        row["latency_envelope_s"] = min((r["latency_s"] for r in rows if r["arm"] == row["arm"]
                                         and r["quality"] >= row["target"] - 1e-9), default=None)
    by_target = {t: {r["arm"]: r for r in rows if r["target"] == t} for t in targets}
    ratios = {f"{t:g}": {
        **{f"{key}_vs_{arm}": ratio(r["planned"][key], r[arm][key])
           for arm in arms if arm != "planned" for key in ("latency_s", "latency_envelope_s", "tokens_per_request")}}
        for t, r in by_target.items()}
    out = {"spec": recorded_value(args.spec), "branched_tiers": sorted(branched) if branched else "all",
           "gpus": problem.cluster.gpus, "rate_rps": problem.workload.rate_rps, "candidate_widths": candidates,
           "runs": rows, "ratios": ratios}
    print_result(out, args.out, indent=1)
    if args.plot:
        plot(rows, list(arms), args.plot)
    return 0


def plot(rows: list[dict[str, Any]], arms: list[str], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (lat_ax, tok_ax) = plt.subplots(1, 2, figsize=(10, 4))
    for arm in arms:
        mine = [r for r in rows if r["arm"] == arm]
        x = [r["target"] for r in mine]
        line = lat_ax.plot(x, [r["latency_s"] for r in mine], marker="o", label=arm)[0]
        lat_ax.plot(x, [np.nan if r["latency_envelope_s"] is None else r["latency_envelope_s"] for r in mine],
                    linestyle=":", color=line.get_color())
        tok_ax.plot(x, [r["tokens_per_request"] for r in mine], marker="o", label=arm)
    lat_ax.set_xlabel("quality target")
    lat_ax.set_ylabel("worst tier p95 L (s), predicted")
    lat_ax.set_title("latency at matched GPUs (dotted: best plan meeting the target)")
    tok_ax.set_xlabel("quality target")
    tok_ax.set_ylabel("tokens decoded per request")
    tok_ax.set_title("decode work")
    lat_ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
