"""A request's decision: its way along the ladder (the router's `Routing`, router/router.py), the branches it runs
on each tier it may reach and, once served, what answered it. Frozen: the service makes it once, `served` a copy."""

from __future__ import annotations

from typing import Any

import msgspec

from cascade.branches.runner import BranchSettings
from cascade.router.escalation import Itinerary, Served
from cascade.router.policy import Assessment
from cascade.schemas import Degradation, Effort
from cascade.tiers.build import Tier


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    itinerary: Itinerary
    tier: Tier  # the tier asked first; once served, the tier that answered
    hint: str  # the quality hint's label, or "bypass" when the client named a tier
    escalations: int = 0
    confidence: float | None = None  # cascade mode: the accepted answer's confidence
    fallback_from: str | None = None  # route mode: the tier that failed before this one answered
    note: str | None = None  # shown as cascade.note
    degraded: Degradation | None = None  # load-reactive routing served it below what it asked for
    # The request's branch settings per reachable tier index, checked once before anything is sent (a route-mode
    # fallback tier, checked only when needed, is not among them).
    branches: dict[int, BranchSettings | None] = msgspec.field(default_factory=dict)
    # The tiers that may serve it (its API key's permits; None: all): a fallback goes only to these.
    allowed: frozenset[int] | None = None
    # Its reasoning effort, as every tier's engines are told it (cascade/tiers/thinking.py; None: it set none).
    effort: Effort | None = None
    # The request's fields not sent to its engines (cascade/service/dropped.py): the x-cascade-dropped-params header.
    dropped: tuple[str, ...] = ()

    @property
    def router(self) -> str:
        """The routing signal's name, or "bypass" when the client named a tier."""
        route = self.itinerary.route
        return "bypass" if route is None else route.router

    @property
    def assessment(self) -> Assessment | None:
        route = self.itinerary.route
        return None if route is None else route.assessment

    def served(self, served: Served[Any], tiers: list[Tier]) -> Decision:
        """This decision once `served` answered it."""
        return msgspec.structs.replace(
            self, tier=tiers[served.tier], escalations=served.escalations, confidence=served.confidence,
            fallback_from=None if served.fallback_from is None else tiers[served.fallback_from].name)
