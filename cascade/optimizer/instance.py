"""A problem resolved into what the solvers use: cards, candidate replica shapes, routing data,
token lengths, and per-tier latency tables for the workload a routing induces (cached)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cascade.errors import ConfigError
from cascade.optimizer import cards, routing, synthetic
from cascade.optimizer.outcomes import Outcomes, load_outcomes
from cascade.optimizer.parallelism import (
    ReplicaCurve,
    SimSettings,
    TierTable,
    candidate_shapes,
    enumerate_shapes,
    replica_curve,
)
from cascade.optimizer.problem import FileOutcomes, LengthSpec, Problem
from cascade.optimizer.roofline import RooflineCost, Shape, valid_shape


@dataclass
class Instance:
    problem: Problem
    names: list[str]
    gpu: cards.GpuSpec
    models: list[cards.ModelCard]
    data: routing.RoutingData
    input_tokens: np.ndarray  # (n,) int
    output_tokens: np.ndarray  # (n, tiers) int
    costs: list[dict[Shape, RooflineCost]]  # candidate shapes per tier
    settings: list[SimSettings]
    curves: dict[tuple[int, Shape, str], ReplicaCurve] = field(default_factory=dict)

    @property
    def total_gpus(self) -> int:
        return self.problem.cluster.gpus

    @property
    def rate_rps(self) -> float:
        return self.problem.workload.rate_rps

    def fractions(self, ks: tuple[int, ...]) -> np.ndarray:
        """Share of requests each tier processes under thresholds ks."""
        final = routing.final_tier(self.data, ks)
        return routing.reach(self.data, final).mean(axis=0)

    def tables(self, ks: tuple[int, ...]) -> list[TierTable]:
        """Each tier's l(f) table for the request mix that reaches it under ks."""
        reach = routing.reach(self.data, routing.final_tier(self.data, ks))
        return [self._tier_table(i, reach[:, i]) for i in range(len(self.names))]

    def _tier_table(self, tier: int, rows_mask: np.ndarray) -> TierTable:
        rows = np.flatnonzero(rows_mask)
        if len(rows) == 0:  # no traffic: keep the tier's full mix so that its table stays defined
            rows = np.arange(len(rows_mask))
        key = hashlib.sha256(rows.tobytes()).hexdigest()
        inputs, outputs = self.input_tokens[rows], self.output_tokens[rows, tier]
        curves = []
        for shape, cost in self.costs[tier].items():
            cache_key = (tier, shape, key)
            if cache_key not in self.curves:
                self.curves[cache_key] = replica_curve(cost, inputs, outputs, self.settings[tier])
            curves.append(self.curves[cache_key])
        return TierTable(curves, self.total_gpus)


def load_instance(problem: Problem, base_dir: Path) -> Instance:
    names = [t.name for t in problem.tiers]
    gpu = cards.load_gpu(problem.cluster.gpu)
    models = [cards.load_model(t.model) for t in problem.tiers]
    outcomes = _outcomes(problem, base_dir)
    rng = np.random.default_rng(problem.search.seed)
    inputs = _fill(outcomes.input_tokens, problem.workload.input_tokens, rng)
    outputs = np.stack([_fill(outcomes.output_tokens[:, i], problem.workload.output_tokens, rng)
                        for i in range(len(names))], axis=1)
    data = _routing_data(problem, outcomes)
    settings = [SimSettings(requests=problem.search.sim_requests, percentile=problem.slo.percentile,
                            max_batch=t.max_batch, max_prefill_tokens=t.max_prefill_tokens,
                            seed=problem.search.seed + i) for i, t in enumerate(problem.tiers)]
    costs = [_tier_costs(problem, gpu, models[i], inputs, outputs[:, i], settings[i]) for i in range(len(names))]
    return Instance(problem=problem, names=names, gpu=gpu, models=models, data=data, input_tokens=inputs,
                    output_tokens=outputs, costs=costs, settings=settings)


def _outcomes(problem: Problem, base_dir: Path) -> Outcomes:
    keys = [t.outcome_key for t in problem.tiers]
    spec = problem.outcomes
    if isinstance(spec, FileOutcomes):
        path = Path(spec.path)
        found = load_outcomes(path if path.is_absolute() else base_dir / path, keys)
    else:
        found = synthetic.gsm8k_like(keys, n=spec.n, seed=spec.seed, skills=spec.skills,
                                     output_medians=spec.output_medians)
    return found


def _fill(values: np.ndarray, spec: LengthSpec, rng: np.random.Generator) -> np.ndarray:
    """Known token counts as they are; unknown ones drawn from the workload's distribution."""
    drawn = np.clip(np.round(rng.lognormal(np.log(spec.median), spec.sigma, size=len(values))), 1, spec.max)
    return np.where(np.isnan(values), drawn, values).astype(np.int64)


def _routing_data(problem: Problem, outcomes: Outcomes) -> routing.RoutingData:
    metric = problem.quality.metric
    quality = outcomes.score if metric == "score" else outcomes.correct
    _require(quality, outcomes.tiers, f"`{metric}` (quality.metric)")
    if problem.routing.mode == "cascade":
        _require(outcomes.score, outcomes.tiers, "`score` (judge scores drive routing.mode = cascade)")
        signal = outcomes.score
    else:
        if np.isnan(outcomes.difficulty).any():
            raise ConfigError("outcomes: every row needs `difficulty` (or p_fail of tier 0) for routing.mode = route")
        signal = outcomes.difficulty
    return routing.RoutingData(mode=problem.routing.mode, signal=signal, quality=quality)


def _require(values: np.ndarray, tiers: list[str], what: str) -> None:
    missing = [t for i, t in enumerate(tiers) if np.isnan(values[:, i]).any()]
    if missing:
        raise ConfigError(f"outcomes: tier(s) {', '.join(missing)} lack {what} on some rows")


def _tier_costs(problem: Problem, gpu: cards.GpuSpec, model: cards.ModelCard, inputs: np.ndarray,
                outputs: np.ndarray, settings: SimSettings) -> dict[Shape, RooflineCost]:
    cluster = problem.cluster
    longest = int((inputs + outputs).max())
    costs = {}
    for shape in enumerate_shapes(min(cluster.gpus, cluster.max_replica_gpus)):
        if not valid_shape(model, shape, cluster.gpus_per_node):
            continue
        cost = RooflineCost(model, gpu, shape, gpus_per_node=cluster.gpus_per_node,
                            internode_gb_s=cluster.internode_gb_s, efficiency=problem.efficiency)
        if cost.fits(longest):
            costs[shape] = cost
    if not costs:
        raise ConfigError(f"model `{model.name}` does not fit on up to {min(cluster.gpus, cluster.max_replica_gpus)} "
                          f"{gpu.name} GPUs with a {longest}-token request in its KV cache")
    keep = candidate_shapes(costs, float(inputs.mean()), float(outputs.mean()), settings)
    return {s: costs[s] for s in keep}
