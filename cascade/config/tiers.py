"""`[[tiers]]` of `cascade.toml`: the ladder's rungs, cheapest first, each a model (its backends) plus a reasoning
setting (its scorer and `[tiers.branches]`, cascade/config/branches.py), and the checks that need more than one key of
a tier."""

from __future__ import annotations

from typing import Literal

from cascade.config.backends import BackendConfig, SGLangBackendConfig, Timeouts, WorkerBackendConfig
from cascade.config.base import Name, NonNegativeInt, PositiveInt, Strict
from cascade.config.branches import BranchSettings, BrokenRule, check_branches
from cascade.config.effort import ThinkingConfig, check_thinking
from cascade.config.prices import TierPrice
from cascade.config.replicas import ReplicasConfig
from cascade.config.workers import WorkerConfig
from cascade.errors import ConfigError
from cascade.schemas import DROPPED_WHERE_UNTAKEN, PASSTHROUGH, SENT_WHERE_TAKEN

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
    # Phase 2 pruning and partial-branch scoring (SART) are on unless scorer = "none"; "cpu" is the embedded scorer,
    # a table ({ url = ..., model = ... }) a PRM served by SGLang, and { worker = ... } a scorer worker (an embedded
    # model judging the steps; cascade/branches/verifier.py). A tier's component like its backends (a client the
    # TierFleet opens and closes, maybe a [[workers]] process), so it stays here while the numbers are [tiers.branches].
    scorer: Literal["cpu", "none"] | PRMScorerConfig = "cpu"
    # Reasoning branches (SART): N per request, M to finish, pruning, waves, slots (cascade/config/branches.py).
    branches: BranchSettings = BranchSettings()
    # Requests in flight on this tier at most (0: gateway.limits.max_in_flight_per_tier); beyond it, 429.
    max_in_flight: NonNegativeInt = 0
    # What its tokens cost ([tiers.price]: per million input and output tokens, or per GPU-hour; cascade/config/
    # prices.py). Every tier or none: None everywhere, and responses carry no cost.
    price: TierPrice | None = None
    # How a request picks one of the tier's replicas: least outstanding, or by prefix (cascade/config/replicas.py).
    replicas: ReplicasConfig = ReplicasConfig()
    # Let a request's `chat_template_kwargs.chat_template` (and any key naming a template: cascade/tiers/upstream.py
    # TEMPLATE_MARKS) reach this tier's engines. Off: dropped before they are sent, and `cascade.note` says so; an
    # engine renders a template as Jinja, so only for engines that sandbox it and clients trusted with the prompt
    # format (SGLang needs --trust-request-chat-template as well).
    trust_request_chat_template: bool = False
    # How a request's `reasoning_effort` reaches its engines: the thinking switch, budgets, the history's reasoning
    # field (cascade/config/effort.py).
    thinking: ThinkingConfig = ThinkingConfig()

    @property
    def kinds(self) -> set[str]:
        """Its backends' kinds ("openai", "sglang", "worker")."""
        return {"sglang" if isinstance(b, SGLangBackendConfig) else "worker" if isinstance(b, WorkerBackendConfig)
                else "openai" for b in self.backends}

    @property
    def untaken(self) -> frozenset[str]:
        """The length and rendering extras (schemas.DROPPED_WHERE_UNTAKEN) some backend's engine does not take: not
        sent to any (cascade/tiers/upstream.py), and the response says so (cascade/service/dropped.py)."""
        return frozenset(p for b in self.backends for p in b.unsupported_params if p in DROPPED_WHERE_UNTAKEN)


def check_tier(tier: TierConfig, i: int, workers: dict[str, WorkerConfig]) -> None:
    """What the types cannot say about `tiers[i]`, given the [[workers]] by name."""
    if not tier.backends:
        raise ConfigError(f"`tiers[{i}].backends` is empty: tier `{tier.name}` needs a backend")
    branches = tier.branches
    try:
        check_branches(branches)
    except BrokenRule as broken:
        raise ConfigError(f"`tiers[{i}].branches.{broken.key}` {broken.rule}") from None
    if branches.slots and branches.slots < branches.n:
        raise ConfigError(f"`tiers[{i}].branches.slots` ({branches.slots}) must be 0 (no limit) or at least n "
                          f"({branches.n})")
    refused = sorted({"logprobs", "top_logprobs"} & {p for b in tier.backends for p in b.unsupported_params})
    reading = next((key for key, on in (("prune_confidence", branches.prune_confidence > 0),
                                         ("confidence_keep", branches.confidence_keep > 0),
                                         ("vote_keep", branches.vote_keep < 1.0),
                                         ("aggregation", branches.aggregation == "confidence")) if on), None)
    if reading and refused:
        raise ConfigError(f"`tiers[{i}].branches.{reading}` needs token logprobs, which a backend of tier "
                          f"`{tier.name}` does not return (it lists `{refused[0]}` in unsupported_params)")
    for j, backend in enumerate(tier.backends):
        where = f"tiers[{i}].backends[{j}]"
        named = (*PASSTHROUGH, *SENT_WHERE_TAKEN, *DROPPED_WHERE_UNTAKEN)
        unknown = sorted(set(backend.unsupported_params) - set(named))
        if unknown:
            raise ConfigError(f"`{where}.unsupported_params` names {unknown}, which cascade does not forward "
                              f"(it forwards: {', '.join(named)})")
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
    check_thinking(tier.thinking, f"tiers[{i}].thinking", tier.kinds)


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
    branches = tier.branches
    if branches.n == 1:
        return
    if worker.temperature == 0:
        raise ConfigError(f"`tiers[{i}]` (`{tier.name}`) runs {branches.n} branches on worker `{worker.name}`, "
                          f"which decodes greedily: every branch would be the same answer. Give the worker "
                          f"`temperature = {branches.temperature:g}` (a worker of its own: a direct tier wants "
                          f"a greedy one)")
    if worker.temperature != branches.temperature:
        raise ConfigError(f"`tiers[{i}].branches.temperature` ({branches.temperature:g}) differs from worker "
                          f"`{worker.name}`'s temperature ({worker.temperature:g}), which is what its engine "
                          f"samples every request at: make them equal")
