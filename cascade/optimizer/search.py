"""Outer level: search the routing thresholds with pymoo.

For a candidate threshold vector the evaluator derives each tier's load and the quality Q from the
outcomes, asks a deployment policy for the latency L (normally the inner allocation solver over
the tiers' l(f) tables), and scores

    J = L + mu * max(0, (q_min - Q) / (z1 - z2))        (Cascadia, ICLR version)

with z1 / z2 the quality of all-to-top / all-to-bottom. A GA minimizes J; NSGA-II traces the
(L, Q) Pareto front; `tchebycheff_choice` is the v1-style alternative (scan weighted-Tchebycheff
weights over the front, keep the fastest point meeting q_min). A routing whose load no deployment
can carry is infeasible: pymoo sees it as a violated constraint (out["G"]), not an exception.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from cascade.optimizer import routing
from cascade.optimizer.milp import solve_dp
from cascade.optimizer.parallelism import TierTable
from cascade.optimizer.slo import weighted

BIG = 1e9  # stands in for an infinite latency inside pymoo, which needs finite objectives


@dataclass(frozen=True)
class Deployment:
    gpus: list[int]  # per tier
    groups: list[int]  # per tier: index of the replica group in the tier's table


@dataclass(frozen=True)
class Evaluation:
    ks: tuple[int, ...]
    thresholds: list[float]
    latency_s: float  # the slowest tier's p95 (s)
    quality: float
    objective: float
    fractions: list[float]
    deployment: Deployment | None
    # L, what J and every comparison of routings use: the bottleneck in SLO scale times e2e_s with `[slo] ttft_s` /
    # `e2e_s` (cascade/optimizer/slo.py), else latency_s itself.
    bottleneck_s: float


def quality_span(data: routing.RoutingData) -> float:
    """z1 - z2 (all on the top tier minus all on tier 0), 1 when the tiers do not differ."""
    z1, z2 = routing.quality_bounds(data)
    return z1 - z2 if z1 - z2 > 1e-9 else 1.0


class Served(NamedTuple):
    """What a policy's deployment gives: L (the bottleneck compared, cascade/optimizer/slo.py), the deployment, and
    the slowest tier's p95 in seconds (L itself without SLO weights)."""

    bottleneck_s: float
    deployment: Deployment | None
    latency_s: float


# A policy maps per-tier arrival rates to its deployment's L (Served; a plain (L, deployment) where L is in
# seconds); it is where the baselines differ. `weights` (per tier, cascade/optimizer/slo.py) rescale the tiers'
# latencies in the bottleneck; None: seconds.
Policy = Callable[[np.ndarray], Served | tuple[float, Deployment | None]]


def _served(latencies: np.ndarray, weights: np.ndarray | None, deployment: Deployment | None) -> Served:
    """L and the slowest tier's seconds of the tiers' `latencies` (s, one per tier)."""
    return Served(float(weighted(latencies, weights).max()), deployment, float(latencies.max()))


def joint_policy(tables: list[TierTable], total_gpus: int, exact: bool,
                 allowed: list[np.ndarray] | None = None, idle: bool = False,
                 weights: np.ndarray | None = None) -> Policy:
    """Best parallelism per (tier, f) and the allocation solver on top (Cascadia's inner level). `idle`: a tier no
    request reaches may get no GPUs."""

    def policy(rates: np.ndarray) -> Served:
        lats, groups = zip(*(t.latency(r, None if allowed is None else allowed[i], idle)
                             for i, (t, r) in enumerate(zip(tables, rates, strict=True))), strict=True)
        table = np.array(lats)
        allocation = solve_dp(weighted(table, weights), total_gpus, exact, allow_idle=idle)
        if allocation.status != "optimal":
            return Served(math.inf, None, math.inf)
        chosen = [int(groups[i][f]) for i, f in enumerate(allocation.gpus)]
        deployment = Deployment(gpus=allocation.gpus, groups=chosen)
        if weights is None:
            return Served(allocation.latency_s, deployment, allocation.latency_s)
        return _served(table[np.arange(len(tables)), allocation.gpus], weights, deployment)

    return policy


def fixed_gpus_policy(tables: list[TierTable], gpus: list[int], allowed: list[np.ndarray] | None = None,
                      weights: np.ndarray | None = None) -> Policy:
    """GPU counts fixed (e.g. a uniform split); the parallelism is still chosen per tier."""

    def policy(rates: np.ndarray) -> Served:
        lats, groups = [], []
        for i, (table, rate) in enumerate(zip(tables, rates, strict=True)):
            lat, group = table.latency(rate, None if allowed is None else allowed[i])
            lats.append(float(lat[gpus[i]]))
            groups.append(int(group[gpus[i]]))
        return _served(np.array(lats), weights, Deployment(gpus=list(gpus), groups=groups))

    return policy


def fixed_deployment_policy(tables: list[TierTable], deployment: Deployment,
                            weights: np.ndarray | None = None) -> Policy:
    """Everything fixed: the plan's deployment serving another routing (operating points)."""

    def policy(rates: np.ndarray) -> Served:
        lats = [t.group_latency(g, f, r) for t, g, f, r in
                zip(tables, deployment.groups, deployment.gpus, rates, strict=True)]
        return _served(np.array(lats), weights, deployment)

    return policy


class Evaluator:
    """Memoized J(theta) for one routing data set, rate, policy and quality target."""

    def __init__(self, data: routing.RoutingData, rate_rps: float, policy: Policy, q_min: float, mu: float,
                 span: float | None = None) -> None:
        """`span`: the quality range normalizing J's shortfall (default z1 - z2 of `data`); plans at other
        reasoning widths pass the same one so that their J compare."""
        self.data, self.rate, self.policy, self.q_min, self.mu = data, rate_rps, policy, q_min, mu
        self.span = span if span is not None else quality_span(data)
        self.memo: dict[tuple[int, ...], Evaluation] = {}

    def __call__(self, ks: tuple[int, ...]) -> Evaluation:
        found = self.memo.get(ks)
        if found is None:
            found = self.memo[ks] = self._evaluate(ks)
        return found

    def _evaluate(self, ks: tuple[int, ...]) -> Evaluation:
        final = routing.final_tier(self.data, ks)
        fractions = routing.reach(self.data, final).mean(axis=0)
        q = routing.quality(self.data, final)
        served = self.policy(self.rate * fractions)
        bottleneck, deployment = served[0], served[1]
        seconds = served.latency_s if isinstance(served, Served) else bottleneck
        return Evaluation(ks=ks, thresholds=routing.thresholds(self.data.mode, ks), latency_s=seconds, quality=q,
                          objective=self.objective(bottleneck, q), fractions=[float(x) for x in fractions],
                          deployment=deployment, bottleneck_s=bottleneck)

    def objective(self, latency: float, quality: float) -> float:
        return latency + self.mu * max(0.0, (self.q_min - quality) / self.span)

    def front(self) -> list[Evaluation]:
        """Non-dominated (low L, high Q) points among everything evaluated so far."""
        points = sorted((e for e in self.memo.values() if math.isfinite(e.bottleneck_s)),
                        key=lambda e: (e.bottleneck_s, -e.quality))
        front: list[Evaluation] = []
        for e in points:
            if not front or e.quality > front[-1].quality + 1e-12:
                front.append(e)
        return front


def _algorithm(kind: str, n_var: int, pop_size: int, seeds: list[tuple[int, ...]], rng: np.random.Generator) -> Any:
    from pymoo.algorithms.moo.nsga2 import NSGA2
    from pymoo.algorithms.soo.nonconvex.ga import GA
    from pymoo.operators.crossover.sbx import SBX
    from pymoo.operators.mutation.pm import PM
    from pymoo.operators.repair.rounding import RoundingRepair

    # Integer thresholds: real-valued SBX/PM followed by rounding (pymoo's integer recipe); the
    # initial population holds the seeds and random grid points.
    start = np.array(list(dict.fromkeys(seeds))[:pop_size] or [(0,) * n_var], dtype=float)
    extra = rng.integers(0, routing.NEVER + 1, size=(max(0, pop_size - len(start)), n_var))
    sampling = np.vstack([start, extra]).astype(float)
    operators = dict(sampling=sampling, crossover=SBX(prob=0.9, eta=3.0, vtype=float, repair=RoundingRepair()),
                     mutation=PM(prob=1.0, eta=3.0, vtype=float, repair=RoundingRepair()), eliminate_duplicates=True)
    return (GA if kind == "ga" else NSGA2)(pop_size=pop_size, **operators)


def _problem(evaluator: Evaluator, n_var: int, objectives: int) -> Any:
    from pymoo.core.problem import ElementwiseProblem

    class ThresholdProblem(ElementwiseProblem):
        def __init__(self) -> None:
            super().__init__(n_var=n_var, n_obj=objectives, n_ieq_constr=1, xl=0, xu=routing.NEVER, vtype=int)

        def _evaluate(self, x: np.ndarray, out: dict[str, Any], *args: Any, **kwargs: Any) -> None:
            e = evaluator(tuple(round(v) for v in x))
            feasible = math.isfinite(e.bottleneck_s)
            latency = e.bottleneck_s if feasible else BIG
            out["F"] = [e.objective if feasible else BIG] if objectives == 1 else [latency, -e.quality]
            out["G"] = [0.0 if feasible else 1.0]

    return ThresholdProblem()


def _small_grid(evaluator: Evaluator, n_thresholds: int, budget: int) -> bool:
    """Evaluate the whole threshold grid when it is no larger than the GA's budget (exact, and
    cheaper than a GA on a tiny space). Route mode sorts thresholds: ascending vectors suffice."""
    values = range(routing.NEVER + 1)
    size = math.comb(len(values) + n_thresholds - 1, n_thresholds) if evaluator.data.mode == "route" \
        else len(values) ** n_thresholds
    if size > budget:
        return False
    grid = (itertools.combinations_with_replacement(values, n_thresholds) if evaluator.data.mode == "route"
            else itertools.product(values, repeat=n_thresholds))
    for ks in grid:
        evaluator(tuple(ks))
    return True


def coarse_grid(evaluator: Evaluator, n_thresholds: int, points: int) -> list[tuple[int, ...]]:
    """Evaluate an even grid of at most `points` threshold vectors (0.06 steps for two thresholds
    at 400 points) and return them best first: the GA starts from the basins a grid search finds."""
    step = 1
    while (routing.NEVER // step + 1) ** n_thresholds > points:
        step += 1
    values = sorted({*range(0, routing.NEVER + 1, step), routing.NEVER})
    grid = [tuple(ks) for ks in itertools.product(values, repeat=n_thresholds)]
    return sorted(grid, key=lambda ks: evaluator(ks).objective)


def minimize_objective(evaluator: Evaluator, n_thresholds: int, seeds: list[tuple[int, ...]], *,
                       pop_size: int, generations: int, seed: int, grid_points: int = 400) -> Evaluation:
    """GA over the threshold grid, started from the seeds and the best coarse-grid points; returns
    the best evaluation seen."""
    for s in seeds:
        evaluator(s)
    if n_thresholds > 0 and not _small_grid(evaluator, n_thresholds, pop_size * generations):
        from pymoo.optimize import minimize

        if grid_points:
            seeds = [*seeds, *coarse_grid(evaluator, n_thresholds, grid_points)[: pop_size // 2]]
        algorithm = _algorithm("ga", n_thresholds, pop_size, seeds, np.random.default_rng(seed))
        minimize(_problem(evaluator, n_thresholds, 1), algorithm, ("n_gen", generations), seed=seed, verbose=False)
    return min(evaluator.memo.values(), key=lambda e: (e.objective, e.bottleneck_s, -e.quality))


def explore_front(evaluator: Evaluator, n_thresholds: int, seeds: list[tuple[int, ...]], *,
                  pop_size: int, generations: int, seed: int) -> list[Evaluation]:
    """NSGA-II on (L, -Q); the front is read from everything evaluated (the GA's points too)."""
    for s in seeds:
        evaluator(s)
    if n_thresholds > 0 and not _small_grid(evaluator, n_thresholds, pop_size * generations):
        from pymoo.optimize import minimize

        algorithm = _algorithm("nsga2", n_thresholds, pop_size, seeds, np.random.default_rng(seed))
        minimize(_problem(evaluator, n_thresholds, 2), algorithm, ("n_gen", generations), seed=seed, verbose=False)
    return evaluator.front()


def tchebycheff_choice(front: list[Evaluation], q_min: float, weights: int = 201) -> Evaluation:
    """v1-style: each weight w picks argmin max(w (L - L*) / range_L, (1 - w) (Q* - Q) / range_Q)
    on the front; among those picks, the fastest meeting q_min. If the weight grid skipped every
    point meeting q_min, the fastest such front point; if none meets it, the best quality."""
    lat = np.array([e.bottleneck_s for e in front])
    qual = np.array([e.quality for e in front])
    l_range = max(float(lat.max() - lat.min()), 1e-12)
    q_range = max(float(qual.max() - qual.min()), 1e-12)
    picks = set()
    for w in np.linspace(0.0, 1.0, weights):
        score = np.maximum(w * (lat - lat.min()) / l_range, (1 - w) * (qual.max() - qual) / q_range)
        picks.add(int(np.argmin(score)))
    for pool in ([front[i] for i in sorted(picks)], front):
        meeting = [e for e in pool if e.quality >= q_min]
        if meeting:
            return min(meeting, key=lambda e: e.bottleneck_s)
    return max(front, key=lambda e: e.quality)
