"""Where a request goes along the ladder once routed: route mode and cascade mode, two policies behind one protocol.

A `ServingMode` (`RouteMode`, `CascadeMode`, from `[routing] mode` or the plan) turns a routing decision into an
`Itinerary`, and the itinerary serves the request through a `TierAnswerer`, the gateway's side of the seam:
answer on tier i, whether tier i can take the request now, what an answer says about itself. Plain data both ways:
no branches, no HTTP, so each rule is tested with a few lines of fake answerer.

* `Pinned` (the client named a tier): that tier answers, or the request fails.
* `Routed` (route mode): the routed tier answers; if it fails, the nearest other tier that can take the request
  answers instead (higher first at equal distance, so quality is kept where it can be), once.
* `Cascaded` (cascade mode, cascade/router/acceptance.py): the cheapest tier that can accept answers first; while
  the answer's confidence is below that tier's acceptance threshold, or the tier fails, the next tier answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Generic, Literal, Protocol, TypeVar

import msgspec

from cascade.errors import BackendError
from cascade.router.acceptance import (
    NEVER,
    accept_for_target,
    accepts,
    answer_confidence,
    default_accept_points,
    first_tier,
    next_tier,
)
from cascade.router.policy import QualityHint, Route

T = TypeVar("T")
Move = Literal["escalated", "fell_back"]


class Evidence(msgspec.Struct, frozen=True, kw_only=True):
    """What one choice of an answer says about itself (cascade mode's confidence reads it)."""

    finish_reason: str | None
    text: str
    tool_calls: bool = False  # an answer that calls tools is complete without text
    agreement: float | None = None  # share of the finished branches that voted for it (two or more finished)
    # The answer's token confidence as a probability (calibrated), when the gateway reads it from token logprobs.
    token_confidence: float | None = None


class TierAnswerer(Protocol[T]):
    """The gateway's side: answering on a tier (raising BackendError when the tier fails), and what a policy
    may ask about tiers and answers."""

    async def answer(self, tier: int) -> T: ...

    def evidence(self, answer: T) -> Sequence[Evidence]:
        """One per choice of `answer`."""
        ...

    def can_take(self, tier: int) -> bool:
        """Whether `tier` could answer this request now (a replica is up, its engine supports the request)."""
        ...

    def moved(self, from_tier: int, to_tier: int, why: Move) -> None:
        """Told before the request moves on (the gateway counts it)."""
        ...


@dataclass(frozen=True)
class Served(Generic[T]):
    answer: T
    tier: int  # the tier that answered
    escalations: int = 0
    confidence: float | None = None  # cascade mode: the accepted answer's confidence
    fallback_from: int | None = None  # route mode: the tier that failed before this one answered


class Itinerary(Protocol):
    """One request's way along the ladder, decided before any tier answers."""

    @property
    def first(self) -> int:
        """The tier asked first."""
        ...

    @property
    def route(self) -> Route | None:
        """What the routing signal said (None when the client named the tier)."""
        ...

    @property
    def thresholds(self) -> list[float] | None:
        """Shown to the client: the routing thresholds (route mode) or acceptance thresholds (cascade mode)."""
        ...

    @property
    def judges_answers(self) -> bool:
        """True when a whole answer must be read before it is accepted: a stream can then start only after."""
        ...

    def reachable(self) -> range:
        """Every tier that may answer (checked for the request before anything is sent)."""
        ...

    async def serve(self, answerer: TierAnswerer[T]) -> Served[T]: ...


@dataclass(frozen=True)
class Pinned:
    first: int
    route: Route | None = None
    thresholds: list[float] | None = None
    judges_answers: bool = False

    def reachable(self) -> range:
        return range(self.first, self.first + 1)

    async def serve(self, answerer: TierAnswerer[T]) -> Served[T]:
        return Served(await answerer.answer(self.first), self.first)


@dataclass(frozen=True)
class Routed:
    route: Route
    n_tiers: int
    fallback: bool = True
    judges_answers: bool = False

    @property
    def first(self) -> int:
        return self.route.tier

    @property
    def thresholds(self) -> list[float] | None:
        return self.route.thresholds

    def reachable(self) -> range:
        return range(self.first, self.first + 1)  # a fallback tier is checked by `can_take` when it is needed

    async def serve(self, answerer: TierAnswerer[T]) -> Served[T]:
        try:
            return Served(await answerer.answer(self.first), self.first)
        except BackendError:
            other = self._fallback(answerer) if self.fallback else None
            if other is None:
                raise
        answerer.moved(self.first, other, "fell_back")
        return Served(await answerer.answer(other), other, fallback_from=self.first)

    def _fallback(self, answerer: TierAnswerer[T]) -> int | None:
        here = self.first
        for distance in range(1, self.n_tiers):
            for index in (here + distance, here - distance):
                if 0 <= index < self.n_tiers and answerer.can_take(index):
                    return index
        return None


@dataclass(frozen=True)
class Cascaded:
    route: Route
    accept: list[float]  # one acceptance threshold per tier but the last (acceptance.NEVER: skipped)
    # Per tier, the router's prior that the tier answers correctly (None: no learned prior, or out of domain).
    prior: tuple[float, ...] | None = None
    judges_answers: bool = True

    @property
    def first(self) -> int:
        return first_tier(self.accept)

    @property
    def thresholds(self) -> list[float] | None:
        return self.accept

    def reachable(self) -> range:
        return range(self.first, len(self.accept) + 1)

    async def serve(self, answerer: TierAnswerer[T]) -> Served[T]:
        last = len(self.accept)
        index, escalations = self.first, 0
        while True:
            try:
                answer = await answerer.answer(index)
            except BackendError:
                if index == last:
                    raise
            else:
                prior = None if self.prior is None else self.prior[index]
                confidence = min(answer_confidence(prior, e.finish_reason, e.text, e.agreement, e.tool_calls,
                                                   e.token_confidence) for e in answerer.evidence(answer))
                if accepts(index, confidence, self.accept):
                    return Served(answer, index, escalations, confidence)
            following = next_tier(index, self.accept)
            answerer.moved(index, following, "escalated")
            index, escalations = following, escalations + 1


def within(itinerary: Itinerary, allowed: frozenset[int]) -> Itinerary:
    """`itinerary` kept to the tiers in `allowed` (an API key's permits; not empty): a routed request goes to the
    nearest allowed tier, cheaper first (the key asked for no more than it may use), and falls back only to allowed
    ones (the answerer's `can_take`); a cascade climbs only allowed tiers and stops at the highest, which then accepts
    what it answers. A pinned tier is checked before routing (a 403), so it is left as it is."""
    if isinstance(itinerary, Routed):
        here = itinerary.first
        if here in allowed:
            return itinerary
        below = [t for t in allowed if t < here]
        tier = max(below) if below else min(allowed)
        return replace(itinerary, route=msgspec.structs.replace(itinerary.route, tier=tier))
    if isinstance(itinerary, Cascaded):
        top = min(max(allowed), len(itinerary.accept))
        accept = [a if t in allowed else NEVER for t, a in enumerate(itinerary.accept[:top])]
        return replace(itinerary, accept=accept)
    return itinerary


class ServingMode(Protocol):
    name: str  # `[routing] mode`

    def itinerary(self, route: Route, hint: QualityHint) -> Itinerary: ...


class RouteMode:
    """Route mode: one tier per request, chosen by the routing signal against the hint's thresholds."""

    name = "route"

    def __init__(self, n_tiers: int, fallback: bool = True) -> None:
        self.n_tiers = n_tiers
        self.fallback = fallback

    def itinerary(self, route: Route, hint: QualityHint) -> Routed:
        return Routed(route, self.n_tiers, self.fallback)


class CascadeMode:
    """Cascade mode: climb from the cheapest tier that can accept until a tier accepts its answer."""

    name = "cascade"

    def __init__(self, n_tiers: int, accept_points: dict[str, list[float]] | None = None) -> None:
        self.n_tiers = n_tiers
        self.accept_points = default_accept_points(n_tiers) | (accept_points or {})

    def accept(self, hint: QualityHint) -> list[float]:
        """The hint's acceptance thresholds, one per tier but the last."""
        if hint.name is not None:
            return self.accept_points[hint.name]
        assert hint.target is not None
        return self.accept_points.get(hint.label) or accept_for_target(hint.target, self.n_tiers)

    def itinerary(self, route: Route, hint: QualityHint) -> Cascaded:
        assessment = route.assessment
        # An out-of-domain prompt's p_fail is the router's extrapolation: no prior, as without a learned router.
        prior = None if assessment.p_fail is None or assessment.out_of_domain \
            else tuple(1.0 - p for p in assessment.p_fail)
        return Cascaded(route, self.accept(hint), prior)


def serving_mode(name: str, n_tiers: int, accept_points: dict[str, list[float]] | None = None,
                 fallback: bool = True) -> ServingMode:
    match name:
        case "route":
            return RouteMode(n_tiers, fallback)
        case "cascade":
            return CascadeMode(n_tiers, accept_points)
    raise ValueError(f"unknown routing mode {name!r}")
