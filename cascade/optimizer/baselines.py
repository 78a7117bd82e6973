"""Baselines for judging a plan (Cascadia's comparisons and ablations), on the same instance.

* single_largest: every request on the top tier, all GPUs to it (best parallelism).
* uniform_split: GPUs split evenly over tiers (remainder to the larger tiers); routing and
  parallelism still optimized (Cascadia's "w/o allocation optimization").
* uniform_parallelism: every replica of every tier uses one TP degree, the smallest that fits the
  largest model in a node, data parallel across the rest; routing and allocation optimized
  ("w/o parallelism optimization").
* routing_only: uniform split and uniform parallelism; only the routing is optimized (RouteLLM-like).

Each baseline runs the same bi-level loop with its inner level restricted, and is measured the same
way: worst-tier p95, end-to-end p95 through the ladder, throughput within an SLO.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import TypeVar

from cascade.optimizer import evaluate, planner, routing, search
from cascade.optimizer.instance import Instance, card_cost
from cascade.optimizer.parallelism import TierTable
from cascade.optimizer.roofline import ReplicaCost, Shape, valid_shape

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Outcome:
    name: str
    evaluation: search.Evaluation
    deployment: search.Deployment
    tables: list[TierTable]
    instance: Instance


def uniform_split(total_gpus: int, tiers: int) -> list[int]:
    base, extra = divmod(total_gpus, tiers)
    return [base + (1 if i >= tiers - extra else 0) for i in range(tiers)]


def slice_instance(inst: Instance, tiers: list[int]) -> Instance:
    """The same prompts and lengths, keeping only some tiers (e.g. the largest alone)."""
    data = routing.RoutingData(mode=inst.data.mode, signal=inst.data.signal if inst.data.mode == "route"
                               else inst.data.signal[:, tiers], quality=inst.data.quality[:, tiers])
    return dataclasses.replace(
        inst, names=[inst.names[i] for i in tiers], models=[inst.models[i] for i in tiers],
        served_models=[inst.served_models[i] for i in tiers], data=data,
        output_tokens=inst.output_tokens[:, tiers], costs=[inst.costs[i] for i in tiers],
        settings=[inst.settings[i] for i in tiers], curves={}, widths=_kept(inst.widths, tiers),
        branch_tokens=_kept(inst.branch_tokens, tiers), first_waves=_kept(inst.first_waves, tiers))


def _kept(per_tier: list[T], tiers: list[int]) -> list[T]:
    """The kept tiers' entries of a per-tier list (empty stays empty): a slice indexed by its own tier numbers must
    not read a dropped tier's width or branches."""
    return [per_tier[i] for i in tiers] if per_tier else []


def uniform_shape_instance(inst: Instance) -> Instance:
    """Every tier restricted to TP = the smallest degree on which the largest model fits (PP 1).
    Profiled tiers keep their measured shapes (no other shape has numbers)."""
    top = min(s.tp for s in inst.costs[-1] if s.pp == 1)
    cluster = inst.problem.cluster
    costs: list[dict[Shape, ReplicaCost]] = []
    specs = {t.name: t for t in inst.problem.tiers}
    for name, model, tier_costs in zip(inst.names, inst.models, inst.costs, strict=True):
        if model is None or inst.gpu is None:
            costs.append(tier_costs)
            continue
        tp = max(t for t in (1, 2, 4, 8) if t <= top and valid_shape(model, Shape(t), cluster.gpus_per_node))
        costs.append({Shape(tp): card_cost(inst.problem, specs[name], inst.gpu, model, Shape(tp))})
    return dataclasses.replace(inst, costs=costs, curves={})


def _fixed_split(inst: Instance, tables: list[TierTable]) -> search.Policy:
    return search.fixed_gpus_policy(tables, uniform_split(inst.total_gpus, len(inst.names)),
                                    weights=inst.slo_weights)


def run(name: str, inst: Instance, factory: planner.PolicyFactory) -> Outcome:
    best, tables, _ = planner.bilevel(inst, lambda _: None, factory)
    if factory is planner.joint:
        deployment = planner.solve_deployment(inst, tables, best.ks)
    else:
        assert best.deployment is not None, f"{name}: no deployment carries the load"
        deployment = best.deployment
    return Outcome(name=name, evaluation=best, deployment=deployment, tables=tables, instance=inst)


SYSTEMS: dict[str, Callable[[Instance], Outcome]] = {
    "cascadia": lambda inst: run("cascadia", inst, planner.joint),
    "single_largest": lambda inst: run("single_largest", slice_instance(inst, [len(inst.names) - 1]), planner.joint),
    "uniform_split": lambda inst: run("uniform_split", inst, _fixed_split),
    "uniform_parallelism": lambda inst: run("uniform_parallelism", uniform_shape_instance(inst), planner.joint),
    "routing_only": lambda inst: run("routing_only", uniform_shape_instance(inst), _fixed_split),
}


def e2e_p95(outcome: Outcome, rate_rps: float, n_requests: int, seed: int) -> float:
    inst = outcome.instance
    latencies = evaluate.e2e_latencies(inst, outcome.tables, outcome.deployment, outcome.evaluation.ks, rate_rps,
                                       n_requests=n_requests, seed=seed)
    return evaluate.percentile(latencies, inst.problem.slo.percentile)


def throughput_rps(outcome: Outcome, slo_s: float, n_requests: int, seed: int, steps: int = 10) -> float:
    """Highest arrival rate whose end-to-end p95 stays within slo_s (bisection on the simulation).
    A rate some tier's replicas cannot sustain (beyond the latency curves' last point) fails
    outright: a finite simulation of an overloaded queue would only show its start."""
    inst, e = outcome.instance, outcome.evaluation
    fractions = inst.fractions(e.ks)
    tables, deployment = outcome.tables, outcome.deployment

    def ok(rate: float) -> bool:
        loads = zip(tables, deployment.groups, deployment.gpus, rate * fractions, strict=True)
        if any(not math.isfinite(t.group_latency(g, f, r)) for t, g, f, r in loads):
            return False
        # Simulate about a minute of traffic, so that queues have time to build.
        n = int(min(4 * n_requests, max(n_requests, 60 * rate)))
        return e2e_p95(outcome, rate, n, seed) <= slo_s

    lo, hi = 0.0, inst.rate_rps
    while ok(hi) and hi < 1e4:
        lo, hi = hi, 2 * hi
    for _ in range(steps):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def base_latency_s(inst: Instance) -> float:
    """Scale 1 of the SLO: the median latency of a request alone on the largest model's fastest replica."""
    from cascade.optimizer.simulator import unloaded_percentile

    costs = inst.costs[-1]
    fastest = min(costs.values(), key=lambda c: c.decode_time(1, 1000))
    return unloaded_percentile(fastest, inst.input_tokens, inst.output_tokens[:, -1], 50.0)


def summary(outcome: Outcome, base_s: float, slo_s: float, n_requests: int, seed: int) -> dict[str, object]:
    e = outcome.evaluation
    p95 = e2e_p95(outcome, outcome.instance.rate_rps, n_requests, seed)
    return {
        "thresholds": e.thresholds, "quality": round(e.quality, 4),
        "tier_fractions": [round(x, 3) for x in e.fractions],
        "gpus": dict(zip(outcome.instance.names, outcome.deployment.gpus, strict=True)),
        "replicas": {name: [f"{r.count}xTP{r.tp}" + (f"xPP{r.pp}" if r.pp > 1 else "")
                            for r in t.replicas(g, f) if r.count]
                     for name, t, g, f in zip(outcome.instance.names, outcome.tables, outcome.deployment.groups,
                                              outcome.deployment.gpus, strict=True)},
        "worst_tier_p95_s": round(e.latency_s, 3), "e2e_p95_s": round(p95, 3),
        "slo_scale": round(p95 / base_s, 3),
        "throughput_rps": round(throughput_rps(outcome, slo_s, n_requests, seed), 3),
    }

