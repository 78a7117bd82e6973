"""`[[tiers]]` of `cascade.toml`: the ladder's rungs, cheapest first, each a model (its backends) plus a reasoning
setting (branches, pruning, scorer), and the checks that need more than one key of a tier."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from cascade.config.backends import BackendConfig, Timeouts, WorkerBackendConfig
from cascade.config.base import Name, NonNegativeInt, PositiveInt, Strict, UnitFloat
from cascade.config.workers import WorkerConfig
from cascade.errors import ConfigError
from cascade.schemas import PASSTHROUGH

# One scoring call is one short prefill: it must finish within min(read_s, total_s).
PRM_TIMEOUTS = Timeouts(connect_s=2.0, read_s=30.0, total_s=30.0)


class PRMScorerConfig(Strict, frozen=True):
    """A process reward model served by SGLang (`url` is the server root): cascade/branches/prm_client.py; or
    an embedded scorer worker (`worker`: a [[workers]] entry with role = "scorer") that speaks the same wire."""

    url: str = ""
    model: str = ""
    worker: str = ""
    aggregate: Literal["last", "min", "mean"] = "last"
    timeouts: Timeouts = PRM_TIMEOUTS
    api_key: str = ""  # SGLang's --api-key, sent as a Bearer token


class TierConfig(Strict, frozen=True):
    """One rung of the ladder: a model plus a reasoning setting. Tiers are listed cheapest first."""

    name: Name
    backends: list[BackendConfig]
    description: str = ""
    # A reasoning instruction prepended as a system message (e.g. "think step by step").
    system_prompt: str = ""
    default_max_tokens: PositiveInt = 512
    # Reasoning branches per request (N) and how many must finish (M): SART, cascade/branches/runner.py.
    branches: PositiveInt = 1
    branches_to_finish: PositiveInt = 1
    # Adaptive consistency: launch this many branches first (0: all at once); when they all finish with one
    # answer, it stands and the other branches never start. 2 or more, below branches_to_finish.
    first_wave: NonNegativeInt = 0
    # 0: two waves (the first, then all the rest). More: the waves double (W, 2W, 4W, ... N) and the first one
    # whose leading answer is this many votes ahead of the next settles the request. Needs first_wave.
    wave_margin: NonNegativeInt = 0
    # Phase-1 pruning: branches scoring below prune_alpha, at most prune_beta per request (0: off).
    prune_alpha: UnitFloat = 0.0
    prune_beta: NonNegativeInt = 0
    # Phase 2 (prune below the first finished branch's score) and scoring are on unless scorer = "none";
    # "cpu" is the embedded scorer, a table ({ url = ..., model = ... }) a PRM served by SGLang, and
    # { worker = ... } a scorer worker (an embedded model judging the steps; cascade/branches/verifier.py).
    scorer: Literal["cpu", "none"] | PRMScorerConfig = "cpu"
    score_every_steps: PositiveInt = 2  # K: score a branch every K reasoning steps (paragraphs)
    aggregation: Literal["majority", "weighted"] = "majority"
    # Confidence pruning without a scorer (DeepConf): stop a branch once its last `confidence_group` tokens'
    # confidence, exp(mean token logprob), is below this (0: off). The gateway then asks the engine for token
    # logprobs; an engine that lists `logprobs` in unsupported_params (the embedded one) cannot do it.
    prune_confidence: UnitFloat = 0.0
    confidence_group: PositiveInt = 32
    # Sampling temperature of branches when the request gives none (identical greedy branches vote alike). On an
    # embedded worker it must equal the worker's `temperature`, which is what the engine samples at.
    branch_temperature: Annotated[float, msgspec.Meta(ge=0, le=2)] = 0.7
    # Branch-aware admission: live branches on this tier at most (0: no limit). A request needs one
    # slot per branch; freed slots (finished, pruned, stopped branches) admit waiting requests.
    branch_slots: NonNegativeInt = 0
    # Requests in flight on this tier at most (0: gateway.limits.max_in_flight_per_tier); beyond it, 429.
    max_in_flight: NonNegativeInt = 0


def check_tier(tier: TierConfig, i: int, workers: dict[str, WorkerConfig]) -> None:
    """What the types cannot say about `tiers[i]`, given the [[workers]] by name."""
    if not tier.backends:
        raise ConfigError(f"`tiers[{i}].backends` is empty: tier `{tier.name}` needs a backend")
    if tier.branches_to_finish > tier.branches:
        raise ConfigError(f"`tiers[{i}].branches_to_finish` must be <= `branches` ({tier.branches})")
    if tier.first_wave and not 2 <= tier.first_wave < tier.branches_to_finish:
        raise ConfigError(f"`tiers[{i}].first_wave` must be 0 (off) or from 2 to `branches_to_finish` - 1 "
                          f"({tier.branches_to_finish - 1}): the first wave stops the request only when its "
                          "branches agree, before M of them could finish")
    if tier.wave_margin and not tier.first_wave:
        raise ConfigError(f"`tiers[{i}].wave_margin` needs `first_wave`: the margin decides after each wave, and "
                          "without a first wave every branch starts at once")
    if tier.branch_slots and tier.branch_slots < tier.branches:
        raise ConfigError(f"`tiers[{i}].branch_slots` ({tier.branch_slots}) must be 0 (no limit) or at least "
                          f"`branches` ({tier.branches})")
    refused = sorted({"logprobs", "top_logprobs"} & {p for b in tier.backends for p in b.unsupported_params})
    if tier.prune_confidence and refused:
        raise ConfigError(f"`tiers[{i}].prune_confidence` needs token logprobs, which a backend of tier "
                          f"`{tier.name}` does not return (it lists `{refused[0]}` in unsupported_params)")
    for j, backend in enumerate(tier.backends):
        where = f"tiers[{i}].backends[{j}]"
        unknown = sorted(set(backend.unsupported_params) - set(PASSTHROUGH))
        if unknown:
            raise ConfigError(f"`{where}.unsupported_params` names {unknown}, which cascade does not forward "
                              f"(it forwards: {', '.join(PASSTHROUGH)})")
        if isinstance(backend, WorkerBackendConfig):
            if backend.worker not in workers:
                raise ConfigError(f"`{where}.worker` names `{backend.worker}`, which is not in [[workers]]")
            if workers[backend.worker].role != "chat":
                raise ConfigError(f"`{where}.worker` names `{backend.worker}`, a scorer worker: it answers no chat")
            _check_worker_sampling(tier, i, workers[backend.worker])
        elif not backend.url.startswith(("http://", "https://")):
            raise ConfigError(f"`{where}.url` must start with http:// or https://, got {backend.url!r}")
    if isinstance(tier.scorer, PRMScorerConfig):
        _check_prm_scorer(tier.scorer, i, workers)


def _check_prm_scorer(scorer: PRMScorerConfig, i: int, workers: dict[str, WorkerConfig]) -> None:
    where = f"tiers[{i}].scorer"
    if bool(scorer.url) == bool(scorer.worker):
        raise ConfigError(f"`{where}` needs one of `url` (an SGLang PRM) or `worker` (a scorer worker), not "
                          f"{'both' if scorer.url else 'neither'}")
    if scorer.worker:
        worker = workers.get(scorer.worker)
        if worker is None or worker.role != "scorer":
            raise ConfigError(f"`{where}.worker` names `{scorer.worker}`, which is not a [[workers]] entry with "
                              "role = \"scorer\"")
    elif not scorer.url.startswith(("http://", "https://")):
        raise ConfigError(f"`{where}.url` must start with http:// or https://, got {scorer.url!r}")


def _check_worker_sampling(tier: TierConfig, i: int, worker: WorkerConfig) -> None:
    """A branched tier's worker must sample, at the tier's branch temperature: the embedded engine decodes every
    request as its worker is set (WorkerConfig.temperature), whatever the request asks."""
    if tier.branches == 1:
        return
    if worker.temperature == 0:
        raise ConfigError(f"`tiers[{i}]` (`{tier.name}`) runs {tier.branches} branches on worker `{worker.name}`, "
                          f"which decodes greedily: every branch would be the same answer. Give the worker "
                          f"`temperature = {tier.branch_temperature:g}` (a worker of its own: a direct tier wants "
                          f"a greedy one)")
    if worker.temperature != tier.branch_temperature:
        raise ConfigError(f"`tiers[{i}].branch_temperature` ({tier.branch_temperature:g}) differs from worker "
                          f"`{worker.name}`'s temperature ({worker.temperature:g}), which is what its engine "
                          f"samples every request at: make them equal")
