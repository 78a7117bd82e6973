"""The plan file: the hand-off from `cascade optimize` to `cascade serve`.

It carries operating points (thresholds and branch settings per quality hint) and, optionally,
the deployment (GPUs and parallelism per tier). The gateway reads only the operating points.
Fields after the first block of each Struct are written by `cascade optimize plan` (predictions,
the Pareto front, planner settings) and are optional for hand-written plans.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import msgspec

from cascade import files
from cascade.errors import ConfigError


class BranchSetting(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    n: int = 1
    m: int = 1


class OperatingPoint(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    hint: str
    thresholds: list[float]
    branches: dict[str, BranchSetting] = msgspec.field(default_factory=dict)
    predicted_quality: float | None = None
    predicted_p95_latency_s: float | None = None
    # Planner output: the quality target this point was chosen for, the share of requests each
    # tier processes, end-to-end p95 through the ladder, and sustainable rate within the SLO.
    quality_target: float | None = None
    tier_fractions: list[float] = msgspec.field(default_factory=list)
    predicted_e2e_p95_latency_s: float | None = None
    predicted_throughput_rps: float | None = None
    # Per tier: mean prompt / output tokens of the requests that tier answers at this point (its mean
    # over all requests when it answers none). `cascade optimize drift` compares traffic with them.
    mean_prompt_tokens: list[float] = msgspec.field(default_factory=list)
    mean_output_tokens: list[float] = msgspec.field(default_factory=list)


class ReplicaSet(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`count` identical replicas, each on tp * pp GPUs."""

    tp: int
    pp: int = 1
    count: int


class TierDeployment(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    tier: str
    gpus: int
    replicas: int
    tp: int = 1  # of the first replica set (all of them when the tier is homogeneous)
    pp: int = 1
    model: str = ""  # checkpoint to serve (Hugging Face id)
    replica_sets: list[ReplicaSet] = msgspec.field(default_factory=list)  # empty: `replicas` x (tp, pp)
    arrival_rate_rps: float | None = None
    predicted_p95_latency_s: float | None = None
    capacity_rps: float | None = None
    # The reasoning width planned for the tier (N branches, M to finish); `cascade deploy` configures it.
    branches: int = 1
    branches_to_finish: int = 1
    first_wave: int = 0  # adaptive consistency's first wave ([tiers.branches] first_wave); 0: none
    # SGLang's output parsers for `model` (`cascade deploy` passes them as --reasoning-parser and
    # --tool-call-parser): "" for none; None (left out) for those of the model card that serves `model`
    # (cascade/optimizer/cards.py `served_card`), none when no card does.
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    # Reproducible branches: SGLang runs with --enable-deterministic-inference, so that the per-branch `seed`
    # is honoured (it is ignored otherwise) and equal requests give equal answers, at a throughput cost.
    deterministic: bool = False
    # With problem.toml's `[slo] ttft_s` / `e2e_s`: the bound the tier's p95 is held to ("ttft" for a tier whose
    # width votes: its answer streams once the vote is decided; "e2e" for a direct tier) and p95 / that bound.
    binding_slo: Literal["ttft", "e2e"] | None = None
    predicted_slo_scale: float | None = None

    def sets(self) -> list[ReplicaSet]:
        return self.replica_sets or [ReplicaSet(tp=self.tp, pp=self.pp, count=self.replicas)]


class FrontPoint(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    thresholds: list[float]
    latency_s: float
    quality: float


class WidthTrial(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One combination of reasoning widths the planner tried (a full plan): [N, M] per tier."""

    widths: list[list[int]]
    objective: float
    latency_s: float
    quality: float


class PlannerInfo(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    objective: str  # "penalty" (J = L + mu * shortfall) or "tchebycheff"
    quality_target: float
    mu: float
    quality_utopia: float  # z1: everything on the top tier
    quality_nadir: float  # z2: everything on tier 0
    objective_value: float
    rounds: int
    solve_time_s: float
    rate_rps: float
    slo_percentile: float
    latency_model: str = "roofline"  # or "profile" (every tier measured), or "mixed"
    # Tiers planned (TP1) with a profile shipped in models/gpu/profiles/ for the cluster's GPU: tier -> the file.
    shipped_profiles: dict[str, str] = msgspec.field(default_factory=dict)
    width_trials: list[WidthTrial] = msgspec.field(default_factory=list)  # tiers with candidate widths
    # `[slo] ttft_s` / `e2e_s` when the problem gave them: the planner then compared tiers in SLO scale.
    ttft_slo_s: float | None = None
    e2e_slo_s: float | None = None


class PlanWorkload(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The traffic the plan was made for (written by `cascade optimize plan`; read by `drift`)."""

    rate_rps: float
    mean_prompt_tokens: float  # over all requests
    mean_output_tokens: float  # of the answer returned, at the planner's quality target
    mean_output_tokens_per_tier: list[float] = msgspec.field(default_factory=list)  # each tier, all requests


class Plan(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    version: int = 1
    tiers: list[str]
    operating_points: list[OperatingPoint]
    deployment: list[TierDeployment] = msgspec.field(default_factory=list)
    # "route": thresholds on the router's score, one tier per request; "cascade": acceptance
    # thresholds per tier (Cascadia): the gateway runs its cascade mode (cascade/router/acceptance.py).
    routing: Literal["route", "cascade"] = "route"
    gpu: str = ""
    gpus_per_node: int = 0
    pareto_front: list[FrontPoint] = msgspec.field(default_factory=list)
    planner: PlannerInfo | None = None
    workload: PlanWorkload | None = None  # absent in plans written before drift checks existed
    # The worst tier's predicted_slo_scale (Cascadia's measure: the smallest SLO scale this plan meets); None
    # without `[slo] ttft_s` / `e2e_s`.
    predicted_slo_scale: float | None = None

    def thresholds_by_hint(self, n_tiers: int) -> dict[str, list[float]]:
        """Per hint: route-mode difficulty thresholds (ascending) or, for a cascade-mode plan, the
        acceptance thresholds of every tier but the last (Cascadia's judge-score thresholds)."""
        if len(self.tiers) != n_tiers:
            tiers = ", ".join(self.tiers)
            raise ConfigError(f"plan is for {len(self.tiers)} tiers ({tiers}); the config has {n_tiers}")
        points = {}
        for point in self.operating_points:
            if len(point.thresholds) != n_tiers - 1:
                raise ConfigError(f"plan operating point `{point.hint}` needs {n_tiers - 1} thresholds")
            points[point.hint] = list(point.thresholds)
        return points


def load_plan(path: str | Path) -> Plan:
    return files.load(path, Plan, "plan")
