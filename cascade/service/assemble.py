"""One builder for the request core. The gateway (cascade/gateway/server.py) and the Envoy model picker
(cascade/extproc/picker.py) both assemble their `ChatService` here, so that both read a config the same way: its
routing signal, its API keys, and, when `[gateway.redis] url` is set, the keys' buckets and budgets (and a gateway's
admission places) in Redis, shared with every other gateway and picker on it.

    parts = assemble(config, tiers, ServiceConfig.of(config, plan), serves=True)

`serves`: a gateway that answers requests also reads its engines' load (`TierEngines`), shares its admission places,
writes the traffic log and keeps the Responses API's stored responses (in Redis with a URL, else in the process); the
picker, which only routes and charges, does none of these. The caller owns what
runs: it starts and closes `parts.redis`, `parts.places` and `parts.engines`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cascade.config import CascadeConfig
from cascade.router.policy import RoutingSignal
from cascade.router.signals import routing_signal
from cascade.service.chat import ChatService, ServiceConfig
from cascade.service.engine_load import EngineLoadCollector, TierEngines
from cascade.service.keys.keyring import Keyring
from cascade.service.metrics import GatewayMetrics
from cascade.service.redis.buckets import RedisRateLimiter
from cascade.service.redis.ledger import RedisLedger
from cascade.service.redis.places import RedisPlaces
from cascade.service.redis.responses import RedisResponseStore
from cascade.service.redis.store import RedisStore
from cascade.service.responses_api.service import ResponsesService
from cascade.service.responses_api.store import LocalResponseStore, ResponseStore
from cascade.service.traffic import TrafficLog
from cascade.tiers.build import Tier


@dataclass(frozen=True)
class Assembled:
    service: ChatService
    metrics: GatewayMetrics
    redis: RedisStore | None  # `[gateway.redis] url` set
    places: RedisPlaces | None  # shared admission places (a serving gateway with Redis)
    engines: TierEngines | None  # the engines' own load (a serving gateway)
    responses: ResponsesService | None = None  # the Responses API over `service` (a serving gateway)


def assemble(config: CascadeConfig, tiers: Sequence[Tier], service_config: ServiceConfig, *, serves: bool,
             signal: RoutingSignal | None = None) -> Assembled:
    """The service for `tiers` from `config`; `signal`: the routing signal (None: the config's, loaded now)."""
    metrics = GatewayMetrics()
    gateway = config.gateway
    redis = (RedisStore(gateway.redis.url, metrics.redis(), timeout_s=gateway.redis.timeout_s,
                        failure=gateway.redis.failure) if gateway.redis.url else None)
    places = RedisPlaces(redis) if serves and redis is not None else None
    engines = None
    if serves:  # tiers on SGLang read their engines' own load (/metrics), polled while the gateway runs
        engines = TierEngines(tiers, config.routing.engine_load, config.routing.load)
        if engines.monitor.pollers:
            metrics.registry.register(EngineLoadCollector(engines))
    service = ChatService(
        tiers, service_config, metrics,
        signal=signal or routing_signal(config.routing, [t.name for t in tiers]),
        traffic=TrafficLog(gateway.traffic_log) if serves and gateway.traffic_log else None,
        engines=engines, places=places,
        limiter=RedisRateLimiter(redis) if redis is not None else None,
        ledger=RedisLedger(redis) if redis is not None else None,
        keyring=Keyring(gateway.keys, gateway.api_keys),
    )
    responses = None
    if serves:
        kept = gateway.responses
        store: ResponseStore = RedisResponseStore(redis, kept.ttl_s) if redis is not None else LocalResponseStore(kept)
        responses = ResponsesService(service, store, kept)
    return Assembled(service, metrics, redis, places, engines, responses)
