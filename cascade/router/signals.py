"""The routing signal a config names: its learned router (`[routing] policy = "learned"`), the random-route null
(`"random"`), or the heuristic."""

from __future__ import annotations

from cascade.config import RoutingConfig
from cascade.router.policy import HeuristicSignal, RoutingSignal
from cascade.router.random_split import RandomSignal


def routing_signal(routing: RoutingConfig, tier_names: list[str]) -> RoutingSignal:
    """The routing signal `routing` names, for tiers `tier_names`: its learned router (loaded now, checked against
    the tiers), the random split of `[routing.random]`, or the heuristic."""
    match routing.policy:
        case "learned":
            from cascade.router.learned import LearnedSignal  # sklearn/skops only when a router is used

            return LearnedSignal.load(routing.router, tier_names)
        case "random":
            split = routing.random
            return RandomSignal(split.seed, split.accuracies, split.costs)
    return HeuristicSignal()
