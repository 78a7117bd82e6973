"""Admission: the gateway's request limit, each tier's request places, and the upstream stream budget.

A stalled tier fills only its own places (a 429 for that tier), so the other tiers keep answering. Where a tier's
engines report their own queue (cascade/service/engine_load.py), `[routing.engine_load] max_queue` refuses the
tier while they queue that many requests, whoever sent them; without a reading, only this gateway's places count.
`Admission` is also the router's live load view (cascade/router/load.py `TierLoad`): each tier's requests in
flight and its engines' own report.

With `[gateway.redis] url`, the gateway's limit and the tiers' places are also counted across every gateway
(`SharedPlaces`: cascade/service/redis/places.py): a request takes this process's place first, then the shared
one. This process's own limits still hold (with Redis away and `failure = "open"`, they are what is left, and
a place admitted so is given back without freeing any place in Redis); the backend stream budget and the engines'
queue stay per process. The counts in this class, and so the router's load view and the `cascade_*in_flight*`
gauges, are this process's requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from cascade.config import Limits
from cascade.errors import Overloaded
from cascade.router.load import EngineView
from cascade.service.engine_load import TierEngines
from cascade.service.metrics import GatewayMetrics
from cascade.tiers.build import Tier


class SharedPlaces(Protocol):
    """Places counted across gateways, by scope ("gateway", "tier:NAME")."""

    async def take(self, scope: str, cap: int) -> bool:
        """Take one of the scope's `cap` places; False when they are all held (by any gateway)."""
        ...

    def give(self, scope: str) -> None:
        """Give one back (without waiting). The caller names the scope, not the place: the places are
        interchangeable, and the implementation returns one admitted without the shared count (Redis away, failing
        open) first, which frees no other request's shared place."""
        ...


class Admission:
    def __init__(self, tiers: Sequence[Tier], limits: Limits, metrics: GatewayMetrics,
                 engines: TierEngines | None = None, shared: SharedPlaces | None = None) -> None:
        self.limits = limits
        self.metrics = metrics
        self.engines = engines
        self.shared = shared
        self.max_engine_queue = engines.config.max_queue if engines is not None else 0
        self.in_flight = 0
        self.tier_caps = [t.config.max_in_flight or limits.max_in_flight_per_tier for t in tiers]
        self.tier_load = [0] * len(tiers)
        self._tier_gauges = [metrics.tier_in_flight.labels(t.name) for t in tiers]  # no label lookup per request
        self.streams_open = 0

    async def admit(self) -> None:
        """Take one of the gateway's request places, or raise Overloaded (a 429)."""
        cap = self.limits.max_in_flight
        if self.in_flight >= cap:
            raise Overloaded(f"the gateway is at its limit of {cap} requests in flight")
        self.in_flight += 1  # held while the shared place is asked for, so that waiting requests count
        self.metrics.in_flight.inc()
        if self.shared is not None:
            try:
                taken = await self.shared.take("gateway", cap)
            except BaseException:
                self._release()
                raise
            if not taken:
                self._release()
                raise Overloaded(f"the gateways are at their shared limit of {cap} requests in flight")

    def release(self) -> None:
        self._release()
        if self.shared is not None:
            self.shared.give("gateway")

    def _release(self) -> None:
        self.in_flight -= 1
        self.metrics.in_flight.dec()

    async def enter(self, tier: Tier, streams: int) -> None:
        """Occupy one of the tier's request places and `streams` upstream streams, or raise Overloaded."""
        cap = self.tier_caps[tier.index]
        if self.tier_load[tier.index] >= cap:
            raise Overloaded(f"tier `{tier.name}` is at its limit of {cap} requests in flight")
        if self.max_engine_queue and self.engines is not None:
            queued = self.engines.queued(tier.index)
            if queued is not None and queued >= self.max_engine_queue:
                raise Overloaded(f"tier `{tier.name}`'s engines have {queued} requests waiting (the limit is "
                                 f"{self.max_engine_queue})")
        if self.streams_open + streams > self.limits.max_backend_streams:
            raise Overloaded(f"the gateway is at its limit of {self.limits.max_backend_streams} backend streams "
                             f"({self.streams_open} open; this request needs {streams})")
        self.tier_load[tier.index] += 1
        self.streams_open += streams
        self._tier_gauges[tier.index].inc()
        if self.shared is not None:
            try:
                taken = await self.shared.take(f"tier:{tier.name}", cap)
            except BaseException:
                self._leave(tier, streams)
                raise
            if not taken:
                self._leave(tier, streams)
                raise Overloaded(f"tier `{tier.name}` is at its limit of {cap} requests in flight across the gateways")

    def leave(self, tier: Tier, streams: int) -> None:
        self._leave(tier, streams)
        if self.shared is not None:
            self.shared.give(f"tier:{tier.name}")

    def _leave(self, tier: Tier, streams: int) -> None:
        self.tier_load[tier.index] -= 1
        self.streams_open -= streams
        self._tier_gauges[tier.index].dec()

    def requests(self, tier: int) -> int:
        return self.tier_load[tier]

    def engine(self, tier: int) -> EngineView | None:
        return None if self.engines is None else self.engines.view(tier)
