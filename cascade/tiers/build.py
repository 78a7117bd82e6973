"""The ladder as live objects: config tiers → backends (replica pools), embedded workers, scorers. Shared by
the gateway and by offline commands (`cascade label`), so that both talk to the tiers the same way (what a tier
sends upstream: cascade/tiers/upstream.py)."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

import msgspec

from cascade.branches.backend import Backend
from cascade.branches.confidence import LOGPROBS_REQUEST
from cascade.branches.cpu_scorer import CPUScorer
from cascade.branches.openai_client import OpenAIBackend
from cascade.branches.pool import ReplicaPool
from cascade.branches.scoring import Scorer
from cascade.branches.sglang_client import SGLangBackend
from cascade.branches.slots import BranchSlots
from cascade.config import (
    BackendConfig,
    CascadeConfig,
    OpenAIBackendConfig,
    PRMScorerConfig,
    SGLangBackendConfig,
    TierConfig,
    WorkerBackendConfig,
    WorkerConfig,
)
from cascade.engines.supervisor import Worker, free_port, sampling_fields
from cascade.errors import ConfigError


class Tier(msgspec.Struct, kw_only=True):
    index: int
    config: TierConfig
    backend: ReplicaPool  # the tier's replicas, with failover and circuit breakers
    # Branch-aware admission (config.branches.slots > 0) and the partial-branch scorer (SART).
    slots: BranchSlots | None = None
    scorer: Scorer | None = None
    # Forwarded request fields some replica's engine would ignore (refused with a 400 on this tier).
    unsupported: frozenset[str] = frozenset()
    # Some replica decodes every request greedily whatever it asks (an embedded worker at temperature 0):
    # branches there would be one answer repeated, so a request asking for them is refused.
    greedy_only: bool = False
    # Each replica's model directory, where every replica is an embedded worker: the tokenizer and chat template its
    # engine counts prompts with (cascade/service/keys/counting.py); empty when some replica's engine is a URL.
    model_dirs: tuple[Path, ...] = ()

    name: str = ""  # the config's: a plain attribute, read on every request's hot path (set by __post_init__)

    def __post_init__(self) -> None:
        self.name = self.config.name

    @property
    def returns_logprobs(self) -> bool:
        """Whether every replica's engine returns token logprobs when asked as cascade asks (LOGPROBS_REQUEST)."""
        return self.unsupported.isdisjoint(LOGPROBS_REQUEST)


def make_backend(name: str, config: BackendConfig, workers: dict[str, Worker]) -> Backend:
    match config:
        case OpenAIBackendConfig():
            return OpenAIBackend(name, config.url, config.model, config.timeouts, config.api_key)
        case SGLangBackendConfig():
            return SGLangBackend(name, config.url, config.model, config.timeouts, config.api_key)
        case WorkerBackendConfig():
            worker = workers[config.worker]
            # A sampling worker gets its generation config with every request, not only at start-up: continuous
            # batching keeps the first request's, and after a restart a user's request may come first.
            fixed = {} if worker.config.temperature == 0 else sampling_fields(worker.model_dir, worker.config)
            # transformers serve with a preloaded model answers any model id with that model.
            return OpenAIBackend(name, worker.url, str(worker.model_dir), config.timeouts, fixed_fields=fixed,
                                 provider="transformers")
    raise TypeError(f"unknown backend config {type(config).__name__}")


def ring_id(config: BackendConfig) -> str:
    """A replica's name on the hash ring of choice by prefix: what every gateway's config says of it alike (its
    URL, or its worker's name), never its place in the list or a port picked at start-up."""
    return f"worker:{config.worker}" if isinstance(config, WorkerBackendConfig) else config.url


def make_workers(config: CascadeConfig, log_dir: Path, tier_names: Collection[str] | None = None) -> dict[str, Worker]:
    """Workers for the config's [[workers]] (not started), preparing their models if needed; with
    ``tier_names``, only the workers those tiers' backends run on (labelling one tier need not load the rest)."""
    used = None if tier_names is None else workers_of(config, tier_names)
    return {w.name: make_worker(w, log_dir) for w in config.workers if used is None or w.name in used}


def make_worker(config: WorkerConfig, log_dir: Path) -> Worker:
    """A chat worker (`transformers serve`) or a scorer worker (`cascade scorer-server`), not started."""
    from cascade.engines.models import load_card, prepare

    model_dir = prepare(load_card(config.model))
    if config.role == "scorer":
        from cascade.engines.scorer_server import scorer_command

        config = msgspec.structs.replace(config, port=config.port or free_port())
        return Worker(config, model_dir, log_dir, command=scorer_command(model_dir, config.port, config.threads),
                      first_generation=False)
    return Worker(config, model_dir, log_dir)


def workers_of(config: CascadeConfig, tier_names: Collection[str]) -> set[str]:
    """Names of the [[workers]] that the named tiers' backends (and scorers) run on."""
    return ({b.worker for t in config.tiers if t.name in tier_names
             for b in t.backends if isinstance(b, WorkerBackendConfig)}
            | {t.scorer.worker for t in config.tiers if t.name in tier_names
               and isinstance(t.scorer, PRMScorerConfig) and t.scorer.worker})


def make_scorer(config: TierConfig, workers: dict[str, Worker] | None = None) -> Scorer | None:
    if isinstance(config.scorer, PRMScorerConfig):
        from cascade.branches.prm_client import SGLangPRMScorer

        prm = config.scorer
        if prm.worker:  # an embedded scorer worker: the same client, at the worker's loopback URL
            if workers is None or prm.worker not in workers:
                raise ConfigError(f"tier `{config.name}`'s scorer worker `{prm.worker}` is not running")
            worker = workers[prm.worker]
            prm = msgspec.structs.replace(prm, url=worker.url, model=prm.model or str(worker.model_dir))
            return SGLangPRMScorer.from_config(prm, name=f"{config.name}/verifier")
        return SGLangPRMScorer.from_config(prm, name=f"{config.name}/prm")
    return CPUScorer() if config.scorer == "cpu" else None


def build_tiers(config: CascadeConfig, workers: dict[str, Worker], tier_names: Collection[str] | None = None
                ) -> list[Tier]:
    """The config's tiers (with ``tier_names``, only those; each keeps its index in the full ladder)."""
    tiers = []
    workers_by_name = {w.name: w for w in config.workers}
    for index, tier_config in enumerate(config.tiers):
        if tier_names is not None and tier_config.name not in tier_names:
            continue
        replicas = [make_backend(f"{tier_config.name}/{j}", b, workers) for j, b in enumerate(tier_config.backends)]
        slots = BranchSlots(tier_config.name, tier_config.branches.slots) if tier_config.branches.slots else None
        scorer = make_scorer(tier_config, workers)
        pool = ReplicaPool(tier_config.name, replicas, config.gateway.failover, tier_config.replicas,
                           [ring_id(b) for b in tier_config.backends])
        unsupported = frozenset(p for b in tier_config.backends for p in b.unsupported_params)
        greedy_only = any(isinstance(b, WorkerBackendConfig) and workers_by_name[b.worker].temperature == 0
                          for b in tier_config.backends)
        model_dirs = tuple(workers[b.worker].model_dir for b in tier_config.backends
                           if isinstance(b, WorkerBackendConfig))
        tiers.append(Tier(index=index, config=tier_config, backend=pool, slots=slots, scorer=scorer,
                          unsupported=unsupported, greedy_only=greedy_only,
                          model_dirs=model_dirs if len(model_dirs) == len(tier_config.backends) else ()))
    return tiers
