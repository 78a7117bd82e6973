"""`cascade.toml`, decoded into frozen msgspec Structs, one module per part of the file:

    base.py       Strict (the base of every config-like Struct, the optimizer's too) and the value types
    gateway.py    [gateway], [gateway.limits], [gateway.failover], [gateway.health], [gateway.redis],
                  [gateway.tracing], [gateway.responses]
    backends.py   a tier's backends (kind = "openai" | "sglang" | "worker") and their timeouts
    workers.py    [[workers]]: embedded engine processes
    branches.py   [tiers.branches]: the branch runner's settings (a request's override and the bench use its
                  names), and the one check of their rules
    effort.py     [routing.effort]: what each reasoning_effort level routes as; [tiers.thinking]: how a tier's
                  engine is told to think
    tiers.py      [[tiers]]: the ladder, and the checks within one tier
    replicas.py   [tiers.replicas]: how a request picks one of a tier's replicas (least outstanding, or by prefix)
    prices.py     [tiers.price]: what a tier's tokens cost, and the checks of prices and keys' budgets
    routing.py    [routing] and its load / engine_load / confidence tables
    moved.py      keys that moved to another table, and the error that says where
    load.py       CascadeConfig (the whole file), the checks across tables, decode_config / load_config

Every Struct forbids unknown fields, so a typo fails at start-up with the key's path instead of being silently
ignored. Config Structs are named `*Config` where a runtime class has the plain name (`OpenAIBackendConfig`
configures `cascade.branches.openai_client.OpenAIBackend`).
"""

from cascade.config.backends import (
    TRANSFORMERS_SERVE_UNSUPPORTED,
    BackendConfig,
    OpenAIBackendConfig,
    SGLangBackendConfig,
    Timeouts,
    WorkerBackendConfig,
)
from cascade.config.base import (
    Name,
    NonNegativeFloat,
    NonNegativeInt,
    Port,
    PositiveFloat,
    PositiveInt,
    Strict,
    UnitFloat,
)
from cascade.config.branches import BranchSettings, BrokenRule, check_branches, reads_confidence
from cascade.config.effort import EffortConfig, EffortRoute, ThinkingConfig
from cascade.config.gateway import (
    ApiKey,
    FailoverConfig,
    GatewayConfig,
    HealthConfig,
    Limits,
    RedisConfig,
    ResponsesConfig,
    TracingConfig,
)
from cascade.config.load import CascadeConfig, decode_config, load_config, resolve_paths
from cascade.config.replicas import ReplicaChoice, ReplicasConfig
from cascade.config.routing import (
    AnswerConfidenceConfig,
    EngineLoadConfig,
    LoadReactiveConfig,
    RandomSplitConfig,
    RoutingConfig,
    check_policy_mode,
    check_routing,
)
from cascade.config.tiers import PRM_TIMEOUTS, PRMScorerConfig, TierConfig
from cascade.config.workers import WorkerConfig

__all__ = [
    "PRM_TIMEOUTS", "TRANSFORMERS_SERVE_UNSUPPORTED", "AnswerConfidenceConfig", "ApiKey", "BackendConfig",
    "BranchSettings", "BrokenRule", "CascadeConfig", "EffortConfig", "EffortRoute", "EngineLoadConfig",
    "FailoverConfig", "GatewayConfig", "HealthConfig", "Limits",
    "LoadReactiveConfig", "Name",
    "NonNegativeFloat", "NonNegativeInt", "OpenAIBackendConfig", "PRMScorerConfig", "Port", "PositiveFloat",
    "PositiveInt", "RandomSplitConfig", "RedisConfig", "ReplicaChoice", "ReplicasConfig", "ResponsesConfig",
    "RoutingConfig", "SGLangBackendConfig", "Strict", "ThinkingConfig", "TierConfig", "Timeouts", "TracingConfig",
    "UnitFloat", "WorkerBackendConfig", "WorkerConfig",
    "check_branches", "check_policy_mode", "check_routing", "decode_config", "load_config", "reads_confidence",
    "resolve_paths",
]
