"""The bi-level planner (Cascadia's Algorithm 1) and the plan it writes.

    theta <- theta_0 (proportional routing)
    repeat
        W <- workload of theta: each tier's request mix and rate
        tables l_i(f) for W (simulator), deployment D for theta (HiGHS MILP)
        theta <- argmin_theta J(theta) given the tables (pymoo GA; inner level per candidate)
    until theta repeats, or J is stable (relative change <= tolerance) for `patience` rounds

Within a round only the tiers' arrival rates follow the candidate theta; their length mixes are
those of the round's theta (the next round re-simulates). The deployment returned is HiGHS's
answer for the best theta's own tables, cross-checked against the dynamic program. Each named
quality hint then gets its own thresholds on that one deployment (GPUs cannot move per request).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from cascade.optimizer import evaluate, routing, search, slo
from cascade.optimizer.instance import Instance, load_instance
from cascade.optimizer.milp import SolverError, solve_dp, solve_highs, weighted
from cascade.optimizer.parallelism import TierTable
from cascade.optimizer.problem import Problem
from cascade.optimizer.widths import Width
from cascade.optimizer.workload import LengthScale
from cascade.plan import (
    FrontPoint,
    OperatingPoint,
    Plan,
    PlannerInfo,
    PlanWorkload,
    ReplicaSet,
    TierDeployment,
    WidthTrial,
)

Progress = Callable[[str], None]
PolicyFactory = Callable[[Instance, list[TierTable]], search.Policy]


def joint(inst: Instance, tables: list[TierTable]) -> search.Policy:
    return search.joint_policy(tables, inst.total_gpus, inst.problem.cluster.allocation == "exact",
                               idle=not inst.problem.cluster.deploy_every_tier, weights=inst.slo_weights)


@dataclass
class PlanResult:
    plan: Plan
    instance: Instance
    tables: list[TierTable]
    primary: search.Evaluation
    deployment: search.Deployment
    front: list[search.Evaluation]
    points: dict[str, search.Evaluation]
    history: list[search.Evaluation] = field(default_factory=list)
    solve_time_s: float = 0.0


def plan_problem(problem: Problem, base_dir: Path, progress: Progress | None = None,
                 lengths: LengthScale | None = None) -> PlanResult:
    """`lengths` rescales the workload's token counts (`cascade optimize drift --spec` re-plans). Tiers
    with several candidate reasoning widths get theirs by coordinate descent around the bi-level plan."""
    if all(len(t.candidate_widths) == 1 for t in problem.tiers):
        return plan_at_widths(problem, base_dir, progress, lengths)
    return choose_widths(problem, base_dir, progress, lengths)


def plan_at_widths(problem: Problem, base_dir: Path, progress: Progress | None = None,
                   lengths: LengthScale | None = None, widths: list[Width] | None = None,
                   quality_span: float | None = None) -> PlanResult:
    """The bi-level plan with each tier's reasoning width fixed (default: its first candidate)."""
    started = time.perf_counter()
    say = progress or (lambda _: None)
    inst = load_instance(problem, base_dir, lengths, widths)
    inst.quality_span = quality_span
    primary, tables, history = bilevel(inst, say)
    deployment = solve_deployment(inst, tables, primary.ks)
    evaluator = _evaluator(inst, joint(inst, tables))
    primary = evaluator(primary.ks)
    s = problem.search
    seeds = [primary.ks, routing.proportional_start(inst.data), *routing.extremes(len(inst.names) - 1, inst.data.mode)]
    front = search.explore_front(evaluator, len(inst.names) - 1, seeds, pop_size=s.pop_size,
                                 generations=s.front_generations, seed=s.seed)
    say(f"front: {len(front)} points")
    points = operating_points(inst, tables, deployment, primary, front)
    elapsed = time.perf_counter() - started
    plan = build_plan(inst, tables, deployment, primary, front, points, len(history), elapsed)
    return PlanResult(plan=plan, instance=inst, tables=tables, primary=primary, deployment=deployment,
                      front=front, points=points, history=history, solve_time_s=elapsed)


def choose_widths(problem: Problem, base_dir: Path, progress: Progress | None = None,
                  lengths: LengthScale | None = None) -> PlanResult:
    """Coordinate descent over the tiers' candidate widths: each round tries every width of one tier with
    the others fixed (a whole bi-level plan each: a width changes the tier's quality, its answers' lengths
    and the branches its engine runs, so thresholds and GPUs follow) and keeps the lowest J; it stops
    when a round changes nothing, or after `search.width_rounds`. J's shortfall is normalized by the
    first candidate combination's quality range, so that plans at different widths compare."""
    say = progress or (lambda _: None)
    started = time.perf_counter()
    options = [t.candidate_widths for t in problem.tiers]
    current = [o[0] for o in options]
    tried: dict[tuple[Width, ...], PlanResult] = {}

    def plan(widths: list[Width], span: float | None) -> PlanResult:
        key = tuple(widths)
        if key not in tried:
            result = tried[key] = plan_at_widths(problem, base_dir, None, lengths, widths, span)
            say(f"widths {' '.join(str(w) for w in widths)}: J = {result.primary.objective:.3f} "
                f"({slo.bottleneck_text(result.instance.slo_bounds, result.primary)}, "
                f"Q = {result.primary.quality:.3f})")
        return tried[key]

    span = search.quality_span(plan(current, None).instance.data)
    for _ in range(problem.search.width_rounds):
        changed = False
        for i, candidates in enumerate(options):
            if len(candidates) == 1:
                continue
            trials = {w: plan([*current[:i], w, *current[i + 1:]], span) for w in candidates}
            # Ties go to the narrower width: the same J for fewer decoded tokens.
            pick = min(trials, key=lambda w: (trials[w].primary.objective, trials[w].primary.bottleneck_s, w.n, w.m))
            if pick != current[i]:
                current[i], changed = pick, True
        if not changed:
            break
    best = tried[tuple(current)]
    record = [WidthTrial(widths=[[w.n, w.m] for w in key], objective=round(r.primary.objective, 4),
                         latency_s=round(r.primary.latency_s, 3), quality=round(r.primary.quality, 4))
              for key, r in tried.items()]
    assert best.plan.planner is not None
    info = msgspec.structs.replace(best.plan.planner, width_trials=record,
                                   solve_time_s=round(time.perf_counter() - started, 3))
    best.plan = msgspec.structs.replace(best.plan, planner=info)
    best.solve_time_s = info.solve_time_s
    return best


def _exact(inst: Instance) -> bool:
    return inst.problem.cluster.allocation == "exact"


def _evaluator(inst: Instance, policy: search.Policy, q_min: float | None = None) -> search.Evaluator:
    q = inst.problem.quality
    return search.Evaluator(inst.data, inst.rate_rps, policy, q.target if q_min is None else q_min, q.mu,
                            inst.quality_span)


def bilevel(inst: Instance, say: Progress, factory: PolicyFactory = joint
            ) -> tuple[search.Evaluation, list[TierTable], list[search.Evaluation]]:
    """Alternate the levels; returns the best consistent (theta, its own tables) and the history.
    `factory` builds the inner level from a round's tables (the baselines restrict it)."""
    s, q = inst.problem.search, inst.problem.quality
    n_thresholds = len(inst.names) - 1
    start = routing.proportional_start(inst.data)
    ks = start
    history: list[search.Evaluation] = []
    best: tuple[search.Evaluation, list[TierTable]] | None = None
    stable = 0
    for round_index in range(s.max_rounds):
        tables = inst.tables(ks)
        evaluator = _evaluator(inst, factory(inst, tables))
        current = evaluator(ks)  # J of theta with theta's own workload: the value that must settle
        history.append(current)
        say(f"round {round_index + 1}: J = {current.objective:.3f} ({slo.bottleneck_text(inst.slo_bounds, current)}, "
            f"Q = {current.quality:.3f}) at thresholds {current.thresholds}")
        if best is None or current.objective < best[0].objective:
            best = (current, tables)
        if len(history) > 1:
            previous = history[-2].objective
            same = math.isclose(current.objective, previous, rel_tol=s.tolerance) or current.objective == previous
            stable = stable + 1 if same else 0
            if stable >= s.patience:
                break
        seeds = [ks, best[0].ks, start, *routing.extremes(n_thresholds, inst.data.mode)]
        if q.objective == "penalty":
            found = search.minimize_objective(evaluator, n_thresholds, seeds, pop_size=s.pop_size,
                                              generations=s.generations, seed=s.seed + round_index)
        else:
            front = search.explore_front(evaluator, n_thresholds, seeds, pop_size=s.pop_size,
                                         generations=s.generations, seed=s.seed + round_index)
            found = search.tchebycheff_choice(front, q.target) if front else current
        if found.ks == ks:  # a fixed point: the next round would repeat this one exactly
            break
        ks = found.ks
    assert best is not None
    return best[0], best[1], history


def solve_deployment(inst: Instance, tables: list[TierTable], ks: tuple[int, ...]) -> search.Deployment:
    """The inner MILP in HiGHS for theta's loads, each stage checked against the dynamic program.
    Stage 1: min L. Stage 2: among allocations within (1 + latency_slack) L, the least
    traffic-weighted latency, so GPUs the bottleneck tier barely benefits from make the other tiers
    (and the other operating points, and headroom for more load) faster."""
    fractions = inst.fractions(ks)
    idle = not inst.problem.cluster.deploy_every_tier
    lats, groups = zip(*(t.latency(r, idle=idle) for t, r in zip(tables, inst.rate_rps * fractions, strict=True)),
                       strict=True)
    matrix = slo.weighted(np.array(lats), inst.slo_weights)  # both stages compare tiers as the bottleneck does
    exact, slack = _exact(inst), inst.problem.search.latency_slack
    dp = solve_dp(matrix, inst.total_gpus, exact, allow_idle=idle)
    if dp.status != "optimal":
        raise SolverError("no allocation of the GPUs carries this load; add GPUs or lower workload.rate_rps")
    first = solve_highs(matrix, inst.total_gpus, exact, upper_bound=dp.latency_s, allow_idle=idle)
    if first.status != "optimal" or not math.isclose(first.latency_s, dp.latency_s, rel_tol=1e-9):
        raise SolverError(f"HiGHS ({first.latency_s}) and the dynamic program ({dp.latency_s}) disagree on L")
    weights = fractions + 1e-3  # a tier without traffic still prefers to be fast
    dp2 = solve_dp(matrix, inst.total_gpus, exact, weights, slack, allow_idle=idle)
    chosen = solve_highs(matrix, inst.total_gpus, exact, upper_bound=dp.latency_s * (1 + slack), weights=weights,
                         slack=slack, allow_idle=idle)
    if not math.isclose(weighted(matrix, chosen.gpus, weights), weighted(matrix, dp2.gpus, weights), rel_tol=1e-9):
        raise SolverError("HiGHS and the dynamic program disagree on the tie-break")
    return search.Deployment(gpus=chosen.gpus, groups=[int(groups[i][f]) for i, f in enumerate(chosen.gpus)])


def hint_targets(inst: Instance) -> dict[str, float]:
    q = inst.problem.quality
    z1, z2 = routing.quality_bounds(inst.data)
    return {"fast": z2, "balanced": q.target, "best": z1} | {f"{q.target:g}": q.target} | dict(q.hints)


def operating_points(inst: Instance, tables: list[TierTable], deployment: search.Deployment,
                     primary: search.Evaluation, front: list[search.Evaluation]) -> dict[str, search.Evaluation]:
    """Thresholds per hint on the fixed deployment: minimize J with the hint's quality target."""
    s = inst.problem.search
    policy = search.fixed_deployment_policy(tables, deployment, inst.slo_weights)
    n_thresholds = len(inst.names) - 1
    seeds = [primary.ks, *[e.ks for e in front], *routing.extremes(n_thresholds, inst.data.mode)]
    points: dict[str, search.Evaluation] = {}
    for hint, target in hint_targets(inst).items():
        evaluator = _evaluator(inst, policy, q_min=target)
        if target == inst.problem.quality.target:
            points[hint] = evaluator(primary.ks)  # the point the deployment was planned for
            continue
        # Seeded with the front, which already spans the quality range: no grid scan needed.
        points[hint] = search.minimize_objective(evaluator, n_thresholds, seeds, pop_size=s.pop_size,
                                                 generations=max(3, s.generations // 2), seed=s.seed, grid_points=0)
    return points


def throughput_rps(inst: Instance, tables: list[TierTable], deployment: search.Deployment,
                   ks: tuple[int, ...], slo_s: float) -> float:
    """Highest arrival rate (same mix) at which the bottleneck (every tier's predicted latency in seconds, or with
    `[slo] ttft_s` / `e2e_s` its weighted one) stays within slo_s."""
    fractions = inst.fractions(ks)
    policy = search.fixed_deployment_policy(tables, deployment, inst.slo_weights)

    def ok(rate: float) -> bool:
        return policy(rate * fractions)[0] <= slo_s

    if not math.isfinite(slo_s):
        return 0.0
    lo, hi = 0.0, inst.rate_rps
    while ok(hi) and hi < 1e6:
        lo, hi = hi, hi * 2
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def e2e_p95(inst: Instance, tables: list[TierTable], deployment: search.Deployment, ks: tuple[int, ...]) -> float:
    """The SLO percentile of end-to-end latency through the ladder (judge hops included)."""
    latencies = evaluate.e2e_latencies(inst, tables, deployment, ks, inst.rate_rps,
                                       n_requests=2 * inst.problem.search.sim_requests, seed=inst.problem.search.seed)
    return evaluate.percentile(latencies, inst.problem.slo.percentile)


def build_plan(inst: Instance, tables: list[TierTable], deployment: search.Deployment, primary: search.Evaluation,
               front: list[search.Evaluation], points: dict[str, search.Evaluation], rounds: int,
               elapsed: float) -> Plan:
    problem = inst.problem
    # With both bounds, L is in seconds of the end-to-end bound: e2e_s is where every tier meets its own.
    bounds = inst.slo_bounds
    slo_s = bounds.e2e_s if bounds is not None else problem.slo.latency_s or 2 * primary.latency_s
    targets = hint_targets(inst)
    e2e = {ks: e2e_p95(inst, tables, deployment, ks) for ks in {e.ks for e in points.values()}}
    lengths = {ks: answered_lengths(inst, ks) for ks in e2e}
    ops = [OperatingPoint(hint=hint, thresholds=e.thresholds, predicted_quality=round(e.quality, 4),
                          predicted_p95_latency_s=round(e.latency_s, 3), quality_target=round(targets[hint], 4),
                          tier_fractions=[round(x, 4) for x in e.fractions],
                          predicted_e2e_p95_latency_s=round(e2e[e.ks], 3),
                          predicted_throughput_rps=round(throughput_rps(inst, tables, deployment, e.ks, slo_s), 3),
                          mean_prompt_tokens=lengths[e.ks][0], mean_output_tokens=lengths[e.ks][1])
           for hint, e in points.items()]
    rates = inst.rate_rps * np.asarray(primary.fractions)
    p95 = [tables[i].group_latency(deployment.groups[i], deployment.gpus[i], float(rates[i]))
           for i in range(len(problem.tiers))]
    tiers = []
    for i, spec in enumerate(problem.tiers):
        f, g = deployment.gpus[i], deployment.groups[i]
        sets = [ReplicaSet(tp=r.tp, pp=r.pp, count=r.count) for r in tables[i].replicas(g, f) if r.count > 0]
        shape = sets[0] if sets else ReplicaSet(tp=1, pp=1, count=0)  # an idle tier (deploy_every_tier = false)
        binding, scale = slo.tier_record(bounds, i, p95[i])
        tiers.append(TierDeployment(
            tier=spec.name, gpus=f, replicas=sum(r.count for r in sets), tp=shape.tp, pp=shape.pp,
            branches=inst.widths[i].n, branches_to_finish=inst.widths[i].m, first_wave=inst.widths[i].first,
            model=inst.served_models[i], replica_sets=sets if len(sets) > 1 else [],
            **_output_settings(inst, i),
            arrival_rate_rps=round(float(rates[i]), 4),
            predicted_p95_latency_s=round(p95[i], 3), capacity_rps=round(float(tables[i].capacity[g, f]), 3),
            binding_slo=binding, predicted_slo_scale=scale))
    z1, z2 = routing.quality_bounds(inst.data)
    info = PlannerInfo(objective=problem.quality.objective, quality_target=problem.quality.target,
                       mu=problem.quality.mu, quality_utopia=round(z1, 4), quality_nadir=round(z2, 4),
                       objective_value=round(primary.objective, 4), rounds=rounds, solve_time_s=round(elapsed, 3),
                       rate_rps=inst.rate_rps, slo_percentile=problem.slo.percentile,
                       latency_model=inst.latency_model, shipped_profiles=inst.shipped_profiles,
                       ttft_slo_s=problem.slo.ttft_s, e2e_slo_s=problem.slo.e2e_s)
    return Plan(tiers=list(inst.names), operating_points=ops, deployment=tiers, routing=inst.data.mode,
                gpu=inst.gpu.name if inst.gpu else problem.cluster.gpu, gpus_per_node=problem.cluster.gpus_per_node,
                pareto_front=[FrontPoint(thresholds=e.thresholds, latency_s=round(e.latency_s, 3),
                                         quality=round(e.quality, 4)) for e in front],
                planner=info, workload=plan_workload(inst, primary.ks),
                predicted_slo_scale=None if bounds is None else round(bounds.worst(p95), 4))


def _output_settings(inst: Instance, i: int) -> dict[str, Any]:
    """Tier i's SGLang output parsers (from its model card; left to `cascade deploy` to look up for a
    profiled tier) and whether its branches must be reproducible."""
    card = inst.models[i]
    parsers = {} if card is None else {"reasoning_parser": card.reasoning_parser,
                                       "tool_call_parser": card.tool_call_parser}
    return {**parsers, "deterministic": inst.problem.tiers[i].deterministic}


def answered_lengths(inst: Instance, ks: tuple[int, ...]) -> tuple[list[float], list[float]]:
    """Per tier, the mean prompt and output tokens of the requests it answers under ks (over all
    requests for a tier that answers none): what the traffic of each (hint, tier) should look like."""
    final = routing.final_tier(inst.data, ks)
    prompts, outputs = [], []
    for i in range(len(inst.names)):
        rows = final == i
        if not rows.any():
            rows = np.ones_like(rows)
        prompts.append(round(float(inst.input_tokens[rows].mean()), 1))
        outputs.append(round(float(inst.output_tokens[rows, i].mean()), 1))
    return prompts, outputs


def plan_workload(inst: Instance, ks: tuple[int, ...]) -> PlanWorkload:
    final = routing.final_tier(inst.data, ks)
    answered = inst.output_tokens[np.arange(len(final)), final]
    return PlanWorkload(rate_rps=inst.rate_rps, mean_prompt_tokens=round(float(inst.input_tokens.mean()), 1),
                        mean_output_tokens=round(float(answered.mean()), 1),
                        mean_output_tokens_per_tier=[round(float(x), 1) for x in inst.output_tokens.mean(axis=0)])
