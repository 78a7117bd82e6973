"""`cascade.toml`, decoded into frozen msgspec Structs.

Every Struct forbids unknown fields, so a typo fails at start-up with the key's path instead of
being silently ignored. Limits that protect the process (body size, `n`, `max_tokens`) live here
with their defaults so that each has one number and one place.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, TypeVar

import msgspec

from cascade import files
from cascade.config_routing import AnswerConfidence, EngineLoadConfig, LoadReactive, RoutingConfig, check_routing
from cascade.config_types import (
    Name,
    NonNegativeInt,
    Port,
    PositiveFloat,
    PositiveInt,
    UnitFloat,
    _Strict,
)
from cascade.errors import ConfigError
from cascade.schemas import PASSTHROUGH

# Re-exported: the routing tables are part of this module's API (`from cascade.config import LoadReactive`).
__all__ = ["AnswerConfidence", "EngineLoadConfig", "LoadReactive", "Name", "PositiveFloat", "PositiveInt",
           "RoutingConfig"]
T = TypeVar("T")
class Limits(_Strict, frozen=True):
    """Hard limits on what one request may ask for; beyond them the request gets a 400/413."""

    max_body_bytes: PositiveInt = 1_048_576
    max_messages: PositiveInt = 512
    max_n: PositiveInt = 8
    max_tokens: PositiveInt = 32_768
    max_stop_sequences: PositiveInt = 4
    # Admission: requests in flight beyond this get 429 instead of queueing without bound.
    max_in_flight: PositiveInt = 1024
    # ... and per tier (a tier's own `max_in_flight` overrides it): one stalled tier fills only its own
    # share, so the other tiers keep answering. Keep it below max_in_flight.
    max_in_flight_per_tier: PositiveInt = 512
    # Upstream streams: one request opens n x branches of them (400 beyond the first limit), and all
    # requests together at most the second (429 beyond it).
    max_streams_per_request: PositiveInt = 32
    max_backend_streams: PositiveInt = 2048
    # Reasoning branches a request may ask for (`branches.n`), and how long it may wait for a tier's
    # branch slots before a 429.
    max_branches: PositiveInt = 16
    max_slot_wait_s: PositiveFloat = 60.0
    # Connections (cascade/gateway/connections.py). A request's line and headers at most; beyond, 431.
    max_header_bytes: PositiveInt = 65_536
    # Open client connections per gateway process (lowered to half the open-file limit if that is less).
    # When full, the connection that has waited longest without a request in flight is closed to admit
    # the new one; when every one has a request in flight, the new one gets 503.
    max_connections: PositiveInt = 4096
    # A request's line and headers must arrive within this of its first byte (of the accept, for a
    # connection's first request), its body within body_timeout_s of its headers; else 408 and close.
    header_timeout_s: PositiveFloat = 10.0
    body_timeout_s: PositiveFloat = 30.0
    # Idle time allowed between requests on a connection; above the 5 s after which httpx (the OpenAI
    # SDK) stops reusing one, so that a client never sends on a connection the gateway is closing.
    keepalive_timeout_s: PositiveFloat = 15.0
    # A client that stops reading its response: once the socket's send buffer has stayed full this long, the
    # connection is dropped, which frees its request place and closes its upstream streams.
    write_timeout_s: PositiveFloat = 60.0


class Failover(_Strict, frozen=True):
    """Replica failover and circuit breaking (cascade/branches/pool.py), and tier fallback."""

    # Further attempts, each on another replica of the tier, after a fault before any byte reached the
    # client (0: none).
    retries: Annotated[int, msgspec.Meta(ge=0, le=8)] = 1
    # Consecutive faults that bench a replica (one refused connection always does).
    breaker_failures: PositiveInt = 3
    # First bench; it doubles after each failed half-open probe, up to breaker_max_open_s.
    breaker_open_s: PositiveFloat = 1.0
    breaker_max_open_s: PositiveFloat = 30.0
    # Route mode: when the chosen tier fails (every replica tried) before any byte reached the client,
    # answer on the nearest tier that can take the request (the response says so), unless the request
    # named the tier.
    tier_fallback: bool = True


class GatewayConfig(_Strict, frozen=True):
    host: str = "127.0.0.1"
    port: Port = 8000
    # Empty: no authentication (the default binds loopback only).
    api_keys: tuple[str, ...] = ()
    default_quality: str = "balanced"
    # Seconds between SSE keep-alive comments while a stream waits for its first token (cascade mode).
    keepalive_s: PositiveFloat = 2.0
    # JSONL of served requests (router outputs, tier, tokens, latency; no text) for `cascade optimize`'s
    # drift check. Empty: off. Relative to the working directory.
    traffic_log: str = ""
    # SIGTERM/SIGINT: stop accepting connections and let requests in flight finish for up to this long;
    # then streams end with an error event and other requests get 503 (cascade/gateway/drain.py).
    shutdown_grace_s: PositiveFloat = 30.0
    limits: Limits = Limits()
    failover: Failover = Failover()


class Timeouts(_Strict, frozen=True):
    connect_s: PositiveFloat = 5.0
    # Longest silence allowed between bytes of a response (first token included).
    read_s: PositiveFloat = 120.0
    # Whole request, first byte to last.
    total_s: PositiveFloat = 900.0
    # An SGLang backend's GET /health: SGLang answers it after a one-token generation, polled once a second
    # for up to SGLANG_HEALTH_CHECK_TIMEOUT (default 20 s), so 1-20 s; longer than that is a hung engine.
    health_s: PositiveFloat = 30.0


# What `transformers serve` (the embedded engine) ignores or refuses among the fields cascade forwards
# (its UNUSED_CHAT_COMPLETION_FIELDS and its params class): requests setting them get a 400, not a
# silently different answer. `user` and `metadata` it ignores too, but they change nothing in the answer.
TRANSFORMERS_SERVE_UNSUPPORTED = ("logprobs", "top_logprobs", "response_format", "tool_choice", "parallel_tool_calls",
                                  "presence_penalty", "reasoning_effort", "top_k", "min_p", "repetition_penalty")


class OpenAIBackend(_Strict, frozen=True, tag="openai", tag_field="kind"):
    """Any OpenAI-compatible server (transformers serve, vLLM, llama.cpp, SGLang's OpenAI routes)."""

    url: str
    model: str
    api_key: str = ""
    timeouts: Timeouts = Timeouts()
    # Forwarded request fields (schemas.PASSTHROUGH) this engine ignores: a request setting one is refused
    # with a 400 naming it, instead of silently getting an answer without it.
    unsupported_params: tuple[str, ...] = ()


class SGLangBackend(_Strict, frozen=True, tag="sglang", tag_field="kind"):
    """An SGLang server: OpenAI routes for chat plus its native `/abort_request`."""

    url: str
    model: str = ""
    api_key: str = ""
    timeouts: Timeouts = Timeouts()
    unsupported_params: tuple[str, ...] = ()  # as for kind = "openai"


class WorkerBackend(_Strict, frozen=True, tag="worker", tag_field="kind"):
    """A worker that `cascade serve` starts itself (see [[workers]]); resolved to an OpenAI backend."""

    worker: Name
    timeouts: Timeouts = Timeouts()
    unsupported_params: tuple[str, ...] = TRANSFORMERS_SERVE_UNSUPPORTED


BackendConfig = OpenAIBackend | SGLangBackend | WorkerBackend


class WorkerConfig(_Strict, frozen=True):
    """An embedded engine process: `transformers serve` on a model from models/ (see `cascade models`), or with
    `role = "scorer"` that model as a step scorer (`cascade scorer-server`, SGLang's PRM wire format) for tiers
    whose `scorer = { worker = ... }` names it."""

    name: Name
    model: Name
    port: Port = 0  # 0: pick a free loopback port
    role: Literal["chat", "scorer"] = "chat"
    threads: PositiveInt = 1  # a scorer worker's torch threads (a chat worker's engine picks its own)
    # Continuous-batching KV cache in blocks of 256 tokens: 128 holds 32k tokens (16 branches of 2k) and
    # bounds the worker's memory (FACTS.md: unbounded it grew to 7 GB).
    cb_num_blocks: PositiveInt = 128
    # Tokens per forward pass. transformers plans attention masks of this x the cache size before the first
    # batch and refuses to start when the plan exceeds 60% of free RAM: its default (8192) with 512 blocks
    # needed 5.9 GB, more than a 9 GB machine offers. 1024 still prefills several prompts per step.
    cb_max_batch_tokens: PositiveInt = 1024
    # How this worker decodes EVERY request: transformers serve with continuous batching builds one generation
    # config, from its first request, and ignores later requests' temperature, top_p and seed (checked: three
    # seeds at temperature 1.5 gave one text). cascade's start-up generation sets it: 0 = greedy; > 0 =
    # sampled at this temperature and top_p. A tier with reasoning branches needs a sampling worker (greedy
    # branches come out identical and vote as one); a tier answering directly, a greedy one.
    temperature: Annotated[float, msgspec.Meta(ge=0, le=2)] = 0.0
    top_p: Annotated[float, msgspec.Meta(gt=0, le=1)] = 1.0
    max_restarts: Annotated[int, msgspec.Meta(ge=0)] = 5
    startup_timeout_s: PositiveFloat = 300.0


# One scoring call is one short prefill: it must finish within min(read_s, total_s).
PRM_TIMEOUTS = Timeouts(connect_s=2.0, read_s=30.0, total_s=30.0)


class PRMScorerConfig(_Strict, frozen=True):
    """A process reward model served by SGLang (`url` is the server root): cascade/branches/prm_client.py; or
    an embedded scorer worker (`worker`: a [[workers]] entry with role = "scorer") that speaks the same wire."""

    url: str = ""
    model: str = ""
    worker: str = ""
    aggregate: Literal["last", "min", "mean"] = "last"
    timeouts: Timeouts = PRM_TIMEOUTS
    api_key: str = ""  # SGLang's --api-key, sent as a Bearer token


class TierConfig(_Strict, frozen=True):
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


class CascadeConfig(_Strict, frozen=True):
    gateway: GatewayConfig = GatewayConfig()
    workers: list[WorkerConfig] = msgspec.field(default_factory=list)
    tiers: list[TierConfig] = msgspec.field(default_factory=list)
    routing: RoutingConfig = RoutingConfig()

    def __post_init__(self) -> None:
        _check(self)


def _check(config: CascadeConfig) -> None:
    if not config.tiers:
        raise ConfigError("`tiers` is empty: define at least one [[tiers]] entry")
    for i, key in enumerate(config.gateway.api_keys):
        if not key or any(c.isspace() for c in key):
            # An empty key would admit `Authorization: Bearer ` (no key at all).
            raise ConfigError(f"`gateway.api_keys[{i}]` is empty or contains whitespace: each key must be one "
                              "non-empty token")
    names = [t.name for t in config.tiers]
    if len(set(names)) != len(names):
        raise ConfigError(f"`tiers` names must be unique, got {names}")
    workers = {w.name: w for w in config.workers}
    if len(workers) != len(config.workers):
        raise ConfigError("`workers` names must be unique")
    for i, tier in enumerate(config.tiers):
        if not tier.backends:
            raise ConfigError(f"`tiers[{i}].backends` is empty: tier `{tier.name}` needs a backend")
        if tier.branches_to_finish > tier.branches:
            raise ConfigError(f"`tiers[{i}].branches_to_finish` must be <= `branches` ({tier.branches})")
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
            if isinstance(backend, WorkerBackend):
                if backend.worker not in workers:
                    raise ConfigError(f"`{where}.worker` names `{backend.worker}`, which is not in [[workers]]")
                if workers[backend.worker].role != "chat":
                    raise ConfigError(f"`{where}.worker` names `{backend.worker}`, a scorer worker: it answers no chat")
                _check_worker_sampling(tier, i, workers[backend.worker])
            elif not backend.url.startswith(("http://", "https://")):
                raise ConfigError(f"`{where}.url` must start with http:// or https://, got {backend.url!r}")
        if isinstance(tier.scorer, PRMScorerConfig):
            _check_prm_scorer(tier.scorer, i, workers)
    check_routing(config.routing, [t.name for t in config.tiers], any(t.branch_slots for t in config.tiers),
                  any(isinstance(b, SGLangBackend) for t in config.tiers for b in t.backends))


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


def decode_config(data: bytes | str, source: str = "cascade.toml") -> CascadeConfig:
    return decode_toml(data, CascadeConfig, source)


def decode_toml(data: bytes | str, kind: type[T], source: str) -> T:
    """Decode a TOML file into `kind`; any mistake is a ConfigError naming `source` and the key."""
    return files.decode(data, kind, source, "toml")


def load_config(path: str | Path) -> CascadeConfig:
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read config {p}: {exc.strerror}") from None
    return resolve_paths(decode_config(data, source=str(p)), p.parent)


def resolve_paths(config: CascadeConfig, base: Path) -> CascadeConfig:
    """Make relative file paths in the config relative to `base` (the config file's folder)."""
    router = config.routing.router
    if router and not Path(router).is_absolute():
        routing = msgspec.structs.replace(config.routing, router=str((base / router).resolve()))
        return msgspec.structs.replace(config, routing=routing)
    return config
