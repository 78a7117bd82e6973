"""A problem resolved into what the solvers use: cards or measured profiles, candidate replica
shapes, routing data, token lengths, and per-tier latency tables for the workload a routing
induces (cached). A card's shape is planned with the profile measured on the cluster's GPU when
one ships (models/gpu/profiles/), else with the roofline."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from cascade.errors import ConfigError
from cascade.optimizer import cards, routing, slo, synthetic, workload
from cascade.optimizer.outcomes import Outcomes, load_outcomes
from cascade.optimizer.parallelism import (
    ReplicaCurve,
    SimSettings,
    TierTable,
    candidate_shapes,
    enumerate_shapes,
    replica_curve,
)
from cascade.optimizer.problem import FileOutcomes, Problem, SyntheticOutcomes, TierSpec
from cascade.optimizer.profile import ProfileCost, load_profile, shipped_profile
from cascade.optimizer.roofline import ReplicaCost, RooflineCost, Shape, valid_shape
from cascade.optimizer.widths import SINGLE, Width, WidthResult, vote
from cascade.repo_paths import recorded_path


@dataclass
class Instance:
    problem: Problem
    names: list[str]
    gpu: cards.GpuSpec | None  # None when every tier has a measured profile
    models: list[cards.ModelCard | None]  # None: a profiled tier
    served_models: list[str]  # the checkpoint each tier serves (the plan's `model`)
    data: routing.RoutingData
    input_tokens: np.ndarray  # (n,) int
    output_tokens: np.ndarray  # (n, tiers) int
    costs: list[dict[Shape, ReplicaCost]]  # candidate shapes per tier
    settings: list[SimSettings]
    rate_rps: float
    # Each tier's reasoning width, and for a width with N > 1 the tokens each branch decodes, (n, N).
    widths: list[Width] = field(default_factory=list)
    branch_tokens: list[np.ndarray | None] = field(default_factory=list)
    # Per tier, adaptive consistency's first wave (0 or absent: every branch starts with its request); its other
    # branches, where `branch_tokens` gives them a length, start when it ended (simulator.simulate_waves).
    first_waves: list[int] = field(default_factory=list)
    quality_span: float | None = None  # J's shortfall normalizer, shared by plans at several widths
    curves: dict[tuple[int, Shape, str], ReplicaCurve] = field(default_factory=dict)

    @property
    def total_gpus(self) -> int:
        return self.problem.cluster.gpus

    @property
    def slo_bounds(self) -> slo.TierBounds | None:
        """The bound each tier is held to at its width (`[slo] ttft_s` / `e2e_s`); None without them."""
        return slo.tier_bounds(self.problem.slo, self.widths)

    @property
    def slo_weights(self) -> np.ndarray | None:
        """Per tier, its p95's weight in the planner's bottleneck (cascade/optimizer/slo.py); None: seconds."""
        bounds = self.slo_bounds
        return None if bounds is None else bounds.weights

    @property
    def latency_model(self) -> str:
        """"roofline", "profile" (every candidate shape of every tier measured) or "mixed"."""
        measured = {isinstance(c, ProfileCost) for costs in self.costs for c in costs.values()}
        return "mixed" if len(measured) == 2 else "profile" if True in measured else "roofline"

    @property
    def shipped_profiles(self) -> dict[str, str]:
        """Tiers that plan a shape with a profile shipped in models/gpu/profiles/: the file, repo-relative."""
        out = {}
        for name, model, costs in zip(self.names, self.models, self.costs, strict=True):
            path = shipped_profile(self.gpu.name, model.name) if model and self.gpu else None
            if path is not None and any(isinstance(c, ProfileCost) for c in costs.values()):
                out[name] = recorded_path(path)
        return out

    def fractions(self, ks: tuple[int, ...]) -> np.ndarray:
        """Share of requests each tier processes under thresholds ks."""
        final = routing.final_tier(self.data, ks)
        return routing.reach(self.data, final).mean(axis=0)

    def tables(self, ks: tuple[int, ...]) -> list[TierTable]:
        """Each tier's l(f) table for the request mix that reaches it under ks."""
        return self.routed_tables(routing.final_tier(self.data, ks))

    def routed_tables(self, final: np.ndarray) -> list[TierTable]:
        """Each tier's l(f) table for the request mix that reaches it when `final` gives each row's last tier."""
        reach = routing.reach(self.data, final)
        return [self._tier_table(i, reach[:, i]) for i in range(len(self.names))]

    def decode_lengths(self, tier: int, rows: np.ndarray) -> np.ndarray:
        """What the tier's engine decodes for these rows: (rows,) lengths, or (rows, N) with branches."""
        branches = self.branch_tokens[tier] if self.branch_tokens else None
        return self.output_tokens[rows, tier] if branches is None else branches[rows]

    def first_wave(self, tier: int) -> int:
        """The tier's adaptive first wave (0: its branches start together)."""
        return self.first_waves[tier] if tier < len(self.first_waves) else 0

    def _tier_table(self, tier: int, rows_mask: np.ndarray) -> TierTable:
        rows = np.flatnonzero(rows_mask)
        if len(rows) == 0:  # no traffic: keep the tier's full mix so that its table stays defined
            rows = np.arange(len(rows_mask))
        key = hashlib.sha256(rows.tobytes()).hexdigest()
        inputs, outputs = self.input_tokens[rows], self.decode_lengths(tier, rows)
        curves = []
        for shape, cost in self.costs[tier].items():
            cache_key = (tier, shape, key)
            if cache_key not in self.curves:
                self.curves[cache_key] = replica_curve(cost, inputs, outputs, self.settings[tier])
            curves.append(self.curves[cache_key])
        return TierTable(curves, self.total_gpus)


def load_instance(problem: Problem, base_dir: Path, lengths: workload.LengthScale | None = None,
                  widths: list[Width] | None = None) -> Instance:
    """`lengths` rescales the workload's token counts (a re-plan from observed traffic). `widths`: each
    tier's reasoning width (default: its first candidate); a tier's outcomes are then its width's
    (cascade/optimizer/widths.py)."""
    chosen = widths or [t.candidate_widths[0] for t in problem.tiers]
    if len(chosen) != len(problem.tiers):
        raise ConfigError(f"{len(chosen)} widths for {len(problem.tiers)} tiers")
    names = [t.name for t in problem.tiers]
    profiled = [[_profile(i, path, base_dir) for path in t.profiles] for i, t in enumerate(problem.tiers)]
    gpu = cards.load_gpu(problem.cluster.gpu) if not all(profiled) else None
    models = [None if profiled[i] else cards.load_model(t.model) for i, t in enumerate(problem.tiers)]
    outcomes, results = _with_widths(_outcomes(problem, base_dir), chosen)
    rng = np.random.default_rng(problem.search.seed)
    inputs, outputs, rate = workload.resolve(problem.workload, outcomes, base_dir,
                                             isinstance(problem.outcomes, SyntheticOutcomes), rng)
    if lengths is not None:
        inputs, outputs = lengths.apply(inputs, outputs)
    branch_tokens = [None if r is None else _branch_lengths(r, outputs[:, i]) for i, r in enumerate(results)]
    data = _routing_data(problem, outcomes)
    settings = [SimSettings(requests=problem.search.sim_requests, percentile=problem.slo.percentile,
                            max_batch=t.max_batch, max_prefill_tokens=t.max_prefill_tokens,
                            seed=problem.search.seed + i, first_wave=chosen[i].first)
                for i, t in enumerate(problem.tiers)]
    costs, served = [], []
    for i, tier in enumerate(problem.tiers):
        model = models[i]
        if model is None:
            candidates = _profile_costs(problem, i, profiled[i])
            served.append(tier.model or profiled[i][0].profile.model)
        else:
            assert gpu is not None  # loaded whenever a tier has no profile
            candidates = _card_costs(problem, tier, gpu, model)
            served.append(model.hf_id)
        costs.append(_keep_fitting(problem, tier, candidates, inputs, outputs[:, i], settings[i]))
    return Instance(problem=problem, names=names, gpu=gpu, models=models, served_models=served, data=data,
                    input_tokens=inputs, output_tokens=outputs, costs=costs, settings=settings, rate_rps=rate,
                    widths=list(chosen), branch_tokens=branch_tokens, first_waves=[w.first for w in chosen])


def _outcomes(problem: Problem, base_dir: Path) -> Outcomes:
    keys = [t.outcome_key for t in problem.tiers]
    spec = problem.outcomes
    if isinstance(spec, FileOutcomes):
        path = Path(spec.path)
        found = load_outcomes(path if path.is_absolute() else base_dir / path, keys)
    else:
        widest = max(w.n for t in problem.tiers for w in t.candidate_widths)
        found = synthetic.gsm8k_like(keys, n=spec.n, seed=spec.seed, skills=spec.skills,
                                     output_medians=spec.output_medians, branches=widest,
                                     correlation=spec.branch_correlation)
    return found


def _with_widths(outcomes: Outcomes, chosen: list[Width]) -> tuple[Outcomes, list[WidthResult | None]]:
    """The outcomes as each tier's width answers them: its voted answer's correctness and score, and the
    M-th finisher's length as the request's output length."""
    results: list[WidthResult | None] = []
    correct, score, output = outcomes.correct.copy(), outcomes.score.copy(), outcomes.output_tokens.copy()
    for i, width in enumerate(chosen):
        if width == SINGLE:
            results.append(None)
            continue
        draws = outcomes.branches[i] if i < len(outcomes.branches) else None
        if draws is None:
            raise ConfigError(f"tier `{outcomes.tiers[i]}`: width {width} needs reasoning branches per prompt; "
                              f"these outcomes hold one answer per tier (synthetic outcomes draw branches; "
                              f"benchmarks/reasoning/branch_outcomes.py turns `cascade bench branches --save-branches` "
                              f"into rows with `branches`)")
        result = vote(draws, width)
        correct[:, i], score[:, i], output[:, i] = result.correct, result.score, result.finish_tokens
        results.append(result)
    return replace(outcomes, correct=correct, score=score, output_tokens=output), results


def _branch_lengths(result: WidthResult, outputs: np.ndarray) -> np.ndarray:
    """Branch lengths scaled as the workload scaled the request's own (M-th finisher's) length; a branch never
    launched (0, a settled first wave's second wave) stays 0."""
    scale = outputs / np.maximum(result.finish_tokens, 1.0)
    scaled = np.maximum(1, np.round(result.branch_tokens * scale[:, None]))
    return np.where(result.branch_tokens > 0, scaled, 0).astype(np.int64)


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


def _profile(tier: int, path: str, base_dir: Path) -> ProfileCost:
    p = Path(path)
    try:
        return ProfileCost(load_profile(p if p.is_absolute() else base_dir / p))
    except ConfigError as exc:
        raise ConfigError(f"`tiers[{tier}].profile`: {exc.message}") from None


def _profile_costs(problem: Problem, index: int, profiled: list[ProfileCost]) -> dict[Shape, ReplicaCost]:
    cluster = problem.cluster
    costs: dict[Shape, ReplicaCost] = {}
    for cost in profiled:
        if cost.shape in costs:
            raise ConfigError(f"`tiers[{index}].profile`: two profiles of shape {cost.shape}; keep one per shape")
        if cost.shape.gpus > min(cluster.gpus, cluster.max_replica_gpus):
            raise ConfigError(f"`tiers[{index}].profile`: a {cost.shape} replica needs {cost.shape.gpus} GPUs; "
                              f"the cluster allows {min(cluster.gpus, cluster.max_replica_gpus)} per replica")
        costs[cost.shape] = cost
    return costs


def _card_costs(problem: Problem, tier: TierSpec, gpu: cards.GpuSpec, model: cards.ModelCard
                ) -> dict[Shape, ReplicaCost]:
    cluster = problem.cluster
    return {shape: card_cost(problem, tier, gpu, model, shape)
            for shape in enumerate_shapes(min(cluster.gpus, cluster.max_replica_gpus))
            if valid_shape(model, shape, cluster.gpus_per_node)}


def card_cost(problem: Problem, tier: TierSpec, gpu: cards.GpuSpec, model: cards.ModelCard, shape: Shape
              ) -> ReplicaCost:
    """A `shape` replica of a card's tier: the profile of `model` measured on `gpu` when one of that shape ships
    (and the tier keeps `shipped_profile`), else the roofline."""
    path = shipped_profile(gpu.name, model.name) if tier.shipped_profile else None
    if path is not None:
        profile = load_profile(path)
        if profile.shape == shape:
            return ProfileCost(profile)
    cluster = problem.cluster
    return RooflineCost(model, gpu, shape, gpus_per_node=cluster.gpus_per_node, internode_gb_s=cluster.internode_gb_s,
                        efficiency=problem.efficiency)


def _keep_fitting(problem: Problem, tier: TierSpec, costs: dict[Shape, ReplicaCost], inputs: np.ndarray,
                  outputs: np.ndarray, settings: SimSettings) -> dict[Shape, ReplicaCost]:
    """The shapes whose KV cache holds the longest request, minus those another shape dominates."""
    longest = int((inputs + outputs).max())
    fitting = {shape: cost for shape, cost in costs.items() if cost.fits(longest)}
    if not fitting and tier.profiles:
        raise ConfigError(f"tier `{tier.name}`: no profiled shape ({', '.join(str(s) for s in costs)}) holds a "
                          f"{longest}-token request in its KV cache (the profiles' kv_capacity_tokens)")
    if not fitting:
        cluster = problem.cluster
        raise ConfigError(f"model `{tier.model}` does not fit on up to {min(cluster.gpus, cluster.max_replica_gpus)} "
                          f"{cluster.gpu} GPUs with a {longest}-token request in its KV cache")
    keep = candidate_shapes(fitting, float(inputs.mean()), float(outputs.mean()), settings)
    return {s: fitting[s] for s in keep}
