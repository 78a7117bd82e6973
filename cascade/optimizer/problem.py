"""`problem.toml`: everything `cascade optimize plan` needs, decoded into frozen msgspec Structs.

    [cluster]   gpu = "h100-sxm", gpus = 32, gpus_per_node = 8
    [[tiers]]   name = "r1-7b", model = "deepseek-r1-distill-qwen-7b"   (cheapest first; roofline costs, and
                    the profile measured on the cluster's GPU where one ships: models/gpu/profiles/<gpu>/<model>.json)
                or  profile = "profiles/r1-7b.json"   (measured by `cascade profile`: replaces the roofline)
                widths = [[1, 1], [4, 2], [8, 5]]     (reasoning branch widths for the planner to choose)
    [workload]  rate_rps = 12.0   (+ where missing lengths come from: dataset = "gsm8k" | trace = "burstgpt.csv"
                                     | lognormal input_tokens / output_tokens; see optimizer/workload.py)
    [outcomes]  kind = "file", path = "outcomes.jsonl"   or   kind = "synthetic", n = 1000, seed = 0
    [routing]   mode = "cascade" (judge scores, Cascadia) | "route" (router difficulty, the gateway)
    [quality]   target = 0.90, mu = 100.0
    [slo]       percentile = 95   (+ ttft_s = 4.9, e2e_s = 9.8: a voting tier is held to the TTFT bound)
    [search]    seed = 0, ...

Relative paths are relative to the problem file. Unknown keys are errors, as in cascade.toml.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import msgspec

from cascade import files
from cascade.config import Name, NonNegativeFloat, PositiveFloat, PositiveInt, Strict, UnitFloat
from cascade.errors import ConfigError
from cascade.optimizer.roofline import Efficiency
from cascade.optimizer.widths import Width

MAX_BRANCHES = 32  # per request; the simulator runs every branch as a sequence
Percentile = Annotated[float, msgspec.Meta(gt=0, lt=100)]


class ClusterSpec(Strict, frozen=True):
    gpu: str
    gpus: PositiveInt
    gpus_per_node: PositiveInt = 8
    internode_gb_s: PositiveFloat = 25.0  # per GPU, per direction (200 Gb/s InfiniBand)
    # "exact": use all N GPUs (Cascadia's equality); "at_most": sum f <= N.
    allocation: Literal["exact", "at_most"] = "exact"
    max_replica_gpus: PositiveInt = 16  # the largest single replica (tp * pp) considered
    # true: every tier gets at least one GPU, so that every hint's operating point (fast, best, ...) can use every
    # tier. false: a tier no request reaches at the target's operating point may get none (a fleet sized for the
    # target's traffic alone); the other hints' points then use the deployed tiers only.
    deploy_every_tier: bool = True


class TierSpec(Strict, frozen=True):
    name: Name
    # A card in models/gpu-models/ (roofline latency model). With `profile`, only the name written to
    # the plan (default: the profile's model) and no card is read.
    model: str = ""
    # Measured profile(s) from `cascade profile`, one per replica shape: they replace the roofline.
    profile: str | list[str] = ""
    # A `model` tier on a GPU with a profile of that model in models/gpu/profiles/<gpu>/ plans that shape (TP1) with
    # it, the other shapes with the roofline; false: the roofline for every shape.
    shipped_profile: bool = True
    column: str = ""  # the tier's key in the outcomes rows; default: name
    max_batch: PositiveInt = 256  # SGLang --max-running-requests
    max_prefill_tokens: PositiveInt = 16384
    # Reasoning branch width (SART, cascade/optimizer/widths.py): N branches launched, M that must finish.
    # Fixed by `branches` / `branches_to_finish`, or chosen by the planner among `widths` ([[N, M], ...]).
    branches: PositiveInt = 1
    branches_to_finish: PositiveInt = 1
    widths: list[tuple[PositiveInt, PositiveInt]] = msgspec.field(default_factory=list)
    # Adaptive consistency as the tier serves it ([tiers.branches] first_wave): the first wave of every width whose M
    # exceeds it (the others start every branch at once). Planned from recorded branches: the second wave only where
    # the first wave's answers differ (cascade/optimizer/widths.py).
    first_wave: int = 0
    # Reproducible branches: the plan marks the tier `deterministic` and `cascade deploy` starts its SGLang
    # servers with --enable-deterministic-inference (a branch's `seed` is honoured; throughput drops 25-45%,
    # which the latency model does not include: profile such an engine to plan for it).
    deterministic: bool = False

    @property
    def candidate_widths(self) -> list[Width]:
        """The widths the planner may give this tier (one: a fixed width)."""
        pairs = self.widths or [(self.branches, self.branches_to_finish)]
        return [Width(n, m, self.first_wave if 2 <= self.first_wave < m else 0) for n, m in pairs]

    @property
    def outcome_key(self) -> str:
        return self.column or self.name

    @property
    def profiles(self) -> list[str]:
        if isinstance(self.profile, str):
            return [self.profile] if self.profile else []
        return list(self.profile)


class LengthSpec(Strict, frozen=True):
    """Lognormal token counts: median and log-standard-deviation, clipped to [1, max]."""

    median: PositiveFloat
    sigma: NonNegativeFloat = 0.5
    max: PositiveInt = 32768


class WorkloadSpec(Strict, frozen=True):
    rate_rps: PositiveFloat | None = None  # may be omitted with a trace: then the trace's mean rate
    # Request lengths the outcomes lack (synthetic outcomes: replaced) come from one of these:
    dataset: str = ""  # a loadgen dataset name (gsm8k, sharegpt, ...) or a .jsonl/.csv file
    trace: str = ""  # a BurstGPT-format CSV (Timestamp, Request tokens, Response tokens)
    # ... and, for whatever is still missing, lognormal distributions.
    input_tokens: LengthSpec = LengthSpec(median=200.0, sigma=0.6)
    output_tokens: LengthSpec = LengthSpec(median=1000.0, sigma=0.7)

    def __post_init__(self) -> None:
        if self.dataset and self.trace:
            raise ConfigError("`workload.dataset` and `workload.trace` are exclusive: give one source of lengths")
        if self.rate_rps is None and not self.trace:
            raise ConfigError("`workload.rate_rps` is missing: give the arrival rate in requests/s "
                              "(it may be omitted only with a `workload.trace`, whose mean rate is used)")


class FileOutcomes(Strict, frozen=True, tag="file", tag_field="kind"):
    path: str


class SyntheticOutcomes(Strict, frozen=True, tag="synthetic", tag_field="kind"):
    """cascade.optimizer.synthetic.gsm8k_like: for trying the planner without labelled data."""

    n: PositiveInt = 1000
    seed: int = 0
    skills: list[float] | None = None
    output_medians: list[float] | None = None
    # Reasoning branches (drawn only when a tier's width has N > 1): how often a branch repeats the tier's
    # first answer rather than being drawn afresh (errors of one model on one prompt correlate).
    branch_correlation: UnitFloat = 0.5


OutcomesSpec = FileOutcomes | SyntheticOutcomes


class RoutingSpec(Strict, frozen=True):
    mode: Literal["cascade", "route"] = "cascade"
    judge_latency_s: NonNegativeFloat = 0.27  # per escalation (Cascadia's GPT-4o judge)


class QualitySpec(Strict, frozen=True):
    target: UnitFloat
    metric: Literal["score", "correct"] = "score"
    mu: PositiveFloat = 100.0  # penalty weight of J (the paper's worked example)
    objective: Literal["penalty", "tchebycheff"] = "penalty"
    # Quality target of each named operating point; defaults: fast = nadir, balanced = target,
    # best = utopia (everything on the top tier). Numeric names ("0.85") serve numeric hints.
    hints: dict[str, UnitFloat] = msgspec.field(default_factory=dict)


class SloSpec(Strict, frozen=True):
    percentile: Percentile = 95.0
    # For the reported throughput: the highest rate at which predicted latency stays within this.
    # Default: twice the plan's predicted latency at the nominal rate.
    latency_s: PositiveFloat | None = None
    # The client's two bounds (both or neither). With them the planner compares tiers in SLO scale, each tier's p95
    # over the bound that binds it: `ttft_s` for a tier whose width votes (N > 1: the gateway streams a voted answer
    # once the vote is decided, so its first token is its end), `e2e_s` for a direct tier (cascade/optimizer/slo.py).
    ttft_s: PositiveFloat | None = None
    e2e_s: PositiveFloat | None = None

    def __post_init__(self) -> None:
        if (self.ttft_s is None) != (self.e2e_s is None):
            given, missing = ("ttft_s", "e2e_s") if self.e2e_s is None else ("e2e_s", "ttft_s")
            raise ConfigError(f"`slo.{missing}` is missing: `slo.{given}` needs it (give both bounds in seconds, "
                              "or neither)")
        if self.ttft_s is not None and self.e2e_s is not None:
            if self.ttft_s > self.e2e_s:
                raise ConfigError(f"`slo.ttft_s` ({self.ttft_s:g}) exceeds `slo.e2e_s` ({self.e2e_s:g}): the first "
                                  "token cannot come after the end")
            if self.latency_s is not None:
                raise ConfigError("`slo.latency_s` and `slo.ttft_s` / `slo.e2e_s` are exclusive: with the two bounds "
                                  "the reported throughput is the highest rate at which every tier meets the bound "
                                  "that binds it; drop `latency_s`")

    @property
    def bounds(self) -> tuple[float, float] | None:
        """(ttft_s, e2e_s), or None without them."""
        return None if self.ttft_s is None or self.e2e_s is None else (self.ttft_s, self.e2e_s)


class SearchSpec(Strict, frozen=True):
    seed: int = 0
    pop_size: PositiveInt = 24
    generations: PositiveInt = 12
    max_rounds: PositiveInt = 6
    patience: PositiveInt = 2  # rounds with J stable before stopping (Cascadia's K)
    tolerance: NonNegativeFloat = 0.01  # relative change of J counted as stable
    sim_requests: PositiveInt = 600
    # The deployment may trade this much of the bottleneck's latency L for a lower traffic-weighted
    # latency over all tiers (predictions are not more accurate than a few percent anyway).
    latency_slack: Annotated[float, msgspec.Meta(ge=0, le=0.5)] = 0.02
    front_generations: PositiveInt = 10
    # Tiers with several candidate `widths`: rounds of coordinate descent over them (each tier's widths
    # tried with the others fixed, a full plan each), stopping early once a round changes nothing.
    width_rounds: PositiveInt = 2


class Problem(Strict, frozen=True):
    cluster: ClusterSpec
    tiers: list[TierSpec]
    workload: WorkloadSpec
    outcomes: OutcomesSpec
    quality: QualitySpec
    routing: RoutingSpec = RoutingSpec()
    slo: SloSpec = SloSpec()
    search: SearchSpec = SearchSpec()
    efficiency: Efficiency = Efficiency()

    def __post_init__(self) -> None:
        if len(self.tiers) < 1:
            raise ConfigError("`tiers` is empty: define at least one [[tiers]] entry")
        names = [t.name for t in self.tiers]
        if len(set(names)) != len(names):
            raise ConfigError(f"`tiers` names must be unique, got {names}")
        for i, tier in enumerate(self.tiers):
            if not tier.model and not tier.profiles:
                raise ConfigError(f"`tiers[{i}].model` is missing: name a card in models/gpu-models/, "
                                  f"or give `tiers[{i}].profile` (a file from `cascade profile`)")
            _check_widths(i, tier)


def _check_widths(index: int, tier: TierSpec) -> None:
    where = f"`tiers[{index}]`"
    if tier.widths and (tier.branches, tier.branches_to_finish) != (1, 1):
        raise ConfigError(f"{where}: give either `widths` (the planner chooses) or `branches` / "
                          f"`branches_to_finish` (fixed), not both")
    pairs = tier.widths or [(tier.branches, tier.branches_to_finish)]
    for n, m in pairs:
        if m > n:
            raise ConfigError(f"{where}: width ({n}, {m}) has more branches to finish than it launches (M <= N)")
        if n > MAX_BRANCHES:
            raise ConfigError(f"{where}: width ({n}, {m}) launches more than {MAX_BRANCHES} branches")
    if len(set(pairs)) != len(pairs):
        raise ConfigError(f"{where}.widths lists a width twice: {pairs}")
    if tier.first_wave and not (2 <= tier.first_wave < max(m for _, m in pairs)):
        raise ConfigError(f"{where}.first_wave = {tier.first_wave}: a first wave needs 2 <= first_wave < M for some "
                          f"width (M: branches that must finish), as [tiers.branches] first_wave does")


def load_problem(path: str | Path) -> tuple[Problem, Path]:
    """The problem (TOML whatever its name) and the directory its relative paths are relative to."""
    return files.load(path, Problem, "problem", "toml"), Path(path).resolve().parent
