"""The routing signal a config names: its learned router (`[routing] policy = "learned"`), or the heuristic."""

from __future__ import annotations

from cascade.config import RoutingConfig
from cascade.router.policy import HeuristicSignal, RoutingSignal


def routing_signal(routing: RoutingConfig, tier_names: list[str]) -> RoutingSignal:
    """The routing signal `routing` names, for tiers `tier_names`: its learned router (loaded now, checked against
    the tiers), or the heuristic."""
    if routing.policy == "learned":
        from cascade.router.learned import LearnedSignal  # sklearn/skops only when a router is used

        return LearnedSignal.load(routing.router, tier_names)
    return HeuristicSignal()
