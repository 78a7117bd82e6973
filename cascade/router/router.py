"""The router: one object that owns the routing policy, the serving mode and load-reactive routing, so that the
gateway asks one question per request and gets plain data back.

    router = Router(shapes, routing_config, signal, load)       # built once, from plain data
    routing = router.itinerary(prompt, hint)                    # per request: a frozen `Routing`
    # or, with the costly part apart (the gateway runs it in a worker thread for a long prompt):
    routing = router.decide(router.assess(prompt), hint)
    served = await routing.itinerary.serve(answerer)            # the gateway's `TierAnswerer`: the only way back up

Plan (issue 32, item 1), in the manner of branches/sart.py and router/escalation.py:

* Built from plain data only: each tier's name and what it holds (`TierShape`), the `[routing]` config with a
  plan's mode and thresholds already in, the routing signal (heuristic or learned), the tier-fallback switch, and
  the live load as the one small protocol `TierLoad` (requests in flight per tier, the engines' own report; the
  gateway's admission implements it). Nothing of the gateway: no tiers, no requests, no callbacks into it.
* `itinerary(prompt, hint)`: the signal's route under the hint's operating point (policy.py), the serving mode's
  way along the ladder (escalation.py), then load (load.py): a movable request whose way would load a full or
  pressed tier moves to the first cheaper operating point that avoids it (`CHEAPER`), and the reachable tiers that
  are still full or pressed are named so that it runs only the branches that must finish there (`Routing.shed`).
  `pinned(tier)`: the client named the tier; nothing is routed or moved.
* `Routing` is frozen: the itinerary, the hint, and what load changed. The gateway's decision
  (cascade/service/decision.py) is built from it once, and never changed after.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

import msgspec

from cascade.config import RoutingConfig
from cascade.router.escalation import Itinerary, Pinned, serving_mode
from cascade.router.load import Headroom, TierLoad, TierShape, capacities
from cascade.router.policy import Assessed, QualityHint, Route, RoutingPolicy, RoutingSignal
from cascade.schemas import Degradation

CHEAPER = {"best": "balanced", "balanced": "fast"}


class Routing(msgspec.Struct, frozen=True, kw_only=True):
    """The router's answer for one request: its way along the ladder, and what live load changed."""

    itinerary: Itinerary
    hint: QualityHint | None = None  # None: the client named the tier
    degraded: Degradation | None = None  # moved to a cheaper operating point than the hint's
    # Reachable tiers that are full or pressed, where this (movable) request runs only the branches that must
    # finish: what the client is told for each.
    pressed: dict[int, Degradation] = msgspec.field(default_factory=dict)

    @property
    def label(self) -> str:
        """The hint's label, or "bypass" when the client named a tier."""
        return "bypass" if self.hint is None else self.hint.label

    def shed(self, branches: Mapping[int, tuple[int, int]]) -> tuple[dict[int, int], Degradation | None]:
        """Given the branches (N to run, M that must finish) the request runs on each reachable tier: the tiers
        where it runs only M (full or pressed), and what the client is told."""
        degraded, cut = self.degraded, {}
        for tier, (n, m) in branches.items():
            pressed = self.pressed.get(tier)
            if pressed is None or n <= m:
                continue
            cut[tier] = m
            degraded = msgspec.structs.replace(pressed if degraded is None else degraded, branches=m)
        return cut, degraded


class Router:
    def __init__(self, tiers: Sequence[TierShape], config: RoutingConfig | None = None,
                 signal: RoutingSignal | None = None, load: TierLoad | None = None, *, fallback: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        config = config or RoutingConfig()
        self.names = [t.name for t in tiers]
        self.max_prompt_chars = config.max_prompt_chars
        self.policy = RoutingPolicy(len(tiers), config.operating_points, signal)
        self.mode = serving_mode(config.mode, len(tiers), config.accept, fallback)
        self.load = config.load
        # Load-reactive routing watches each tier's headroom (None: off, or no live load to read).
        self.headroom = None if not config.load.enabled or load is None else Headroom(
            self.names, config.load, capacities(config.load, tiers), load, clock, streams=[t.branches for t in tiers])

    def pinned(self, tier: int) -> Routing:
        """The client named `tier`: it answers, or the request fails."""
        return Routing(itinerary=Pinned(tier))

    def itinerary(self, prompt: str, hint: QualityHint) -> Routing:
        """Where `prompt` goes under `hint`, given the tiers' load now."""
        return self.decide(self.assess(prompt), hint)

    def assess(self, prompt: str) -> Assessed:
        """The routing signal's verdict on `prompt` (at most `max_prompt_chars` of it: `routed_text`). Pure and
        thread-safe: it reads no load and changes nothing, so a caller may run it off its event loop."""
        return self.policy.assess(routed_text(prompt, self.max_prompt_chars))

    def routed(self, prompt: str) -> str:
        """What `assess` reads of `prompt` (`routed_text`)."""
        return routed_text(prompt, self.max_prompt_chars)

    def decide(self, assessed: Assessed, hint: QualityHint) -> Routing:
        """Where an assessed prompt goes under `hint`, given the tiers' load now (cheap; on the caller's loop)."""
        route = self.policy.place(assessed, hint)
        itinerary = self.mode.itinerary(route, hint)
        headroom = self.headroom
        if headroom is None or not self._movable(hint):
            return Routing(itinerary=itinerary, hint=hint)
        itinerary, degraded = self._moved(route, hint, itinerary, headroom)
        pressed = {}
        if self.load.shed_branches:
            assert hint.name is not None
            pressed = {i: Degradation(requested=hint.name, served=hint.name, tier=self.names[i], reason=why)
                       for i in itinerary.reachable() if (why := headroom.hot(i)) is not None}
        return Routing(itinerary=itinerary, hint=hint, degraded=degraded, pressed=pressed)

    def _movable(self, hint: QualityHint) -> bool:
        """Named hints give way to load; `best` only when configured; numeric targets never."""
        if hint.name is None:
            return False
        return hint.name != "best" or self.load.degrade_best

    def _moved(self, route: Route, hint: QualityHint, itinerary: Itinerary, headroom: Headroom
               ) -> tuple[Itinerary, Degradation | None]:
        """`itinerary`, or the first cheaper operating point's whose first tier is free (and that changes
        something) when `itinerary` would load a full or pressed tier."""
        hot = next(((i, why) for i in itinerary.reachable() if (why := headroom.hot(i)) is not None), None)
        if hot is None:
            return itinerary, None
        assert hint.name is not None
        name = hint.name
        while name in CHEAPER:
            name = CHEAPER[name]
            cheaper = QualityHint(name=name)
            candidate = self.mode.itinerary(self.policy.reroute(route, cheaper), cheaper)
            if headroom.hot(candidate.first) is not None:
                continue
            if candidate.first == itinerary.first and candidate.thresholds == itinerary.thresholds:
                continue  # the same way along the ladder: nothing gained, nothing to report
            return candidate, Degradation(requested=hint.name, served=name, tier=self.names[hot[0]], reason=hot[1])
        return itinerary, None


def routed_text(prompt: str, limit: int) -> str:
    """What the router reads of `prompt`: all of it up to `limit` characters, else its first and last halves (a
    question's setting comes first and what it asks last), joined by a newline."""
    if len(prompt) <= limit:
        return prompt
    half = (limit - 1) // 2
    return f"{prompt[:half]}\n{prompt[-half:]}"
