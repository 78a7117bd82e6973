"""The random-route null: a routing signal that reads nothing of the prompt's difficulty, and the cheapest random
split of traffic over the tiers that reaches an accuracy target.

A router's win means something only beside what a random split of the same traffic does at the same accuracy on
the same allocation: the router adds what it does better than sending the same shares of prompts to each tier
blind. With `[routing] policy = "random"` a prompt's route score is uniform in [0, 1), read from a keyed hash
(blake2b, the seed as its key) of the text every router reads (`routed_text`, at most `max_prompt_chars`): the
same prompt goes to the same tier under one seed, and two seeds split the traffic independently. The score meets
each hint's thresholds exactly as the other policies' do (`policy.tier_for`), so under uniform scores tier t's
share of the traffic is the gap between its two thresholds: `balanced`'s default, an even split.

A numeric hint (a target accuracy) needs each tier's accuracy on its own (`[routing.random] accuracies`, e.g.
`cascade router eval`'s "all <tier>" rows): the random split has no calibration but those. `random_thresholds`
turns them, with the tiers' costs, into the cheapest split whose expected accuracy reaches the target.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Sequence

from cascade.errors import InvalidRequest
from cascade.router.operating import NEVER
from cascade.router.policy import Assessment

_SCORE_BITS = 53  # a double's mantissa: every score k / 2**53 is exact, and below 1


def random_score(text: str, seed: int) -> float:
    """`text`'s route score under `seed`: uniform in [0, 1) over texts, the same every time for one seed."""
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8, key=seed.to_bytes(8, "big"))
    return (int.from_bytes(digest.digest(), "big") >> (64 - _SCORE_BITS)) / 2**_SCORE_BITS


def random_thresholds(accuracies: Sequence[float], costs: Sequence[float], target: float) -> list[float]:
    """Ascending thresholds, one per tier but the last, that send uniform route scores to the cheapest mixture of
    tiers whose expected accuracy reaches `target` (tier t's share: the gap between its thresholds).

    The cheapest mixture is a linear programme's optimum, so it mixes at most two tiers: the two around `target`
    on the lower convex hull of the tiers' (accuracy, cost) points, from the cheapest tier (the most accurate of
    equally cheap ones) to the most accurate (the cheapest of equally accurate ones), in the shares that give
    exactly `target`. A target the cheapest tier reaches alone sends everything there (its accuracy is then above
    the target: nothing costs less); one that no tier reaches sends everything to the most accurate. A tier that
    gets nothing above the mixed ones has the threshold `operating.NEVER`, no score reaches; below them, 0.0.
    """
    n = len(accuracies)
    if n == 0 or len(costs) != n:
        raise ValueError(f"one accuracy and one cost per tier: got {n} accuracies and {len(costs)} costs")
    if not all(math.isfinite(x) for x in (*accuracies, *costs, target)):
        raise ValueError("accuracies, costs and the target must be finite numbers")
    hull = _frontier(accuracies, costs)
    if target <= accuracies[hull[0]]:
        return _alone(hull[0], n)
    for low, high in itertools.pairwise(hull):
        if target <= accuracies[high]:  # and above `low`'s (the step before did not reach it)
            share = (target - accuracies[low]) / (accuracies[high] - accuracies[low])
            return _mixed(low, 1.0 - share, high, n)
    return _alone(hull[-1], n)


def _frontier(accuracies: Sequence[float], costs: Sequence[float]) -> list[int]:
    """Tiers on the lower convex hull of (accuracy, cost), from the cheapest (most accurate of equals) on, in
    ascending accuracy and cost; of equally accurate tiers only the cheapest (first of equals) is a candidate."""
    start = min(range(len(costs)), key=lambda t: (costs[t], -accuracies[t], t))
    cheapest: dict[float, int] = {}
    for t in sorted(range(len(costs)), key=lambda t: (accuracies[t], costs[t], t)):
        if accuracies[t] > accuracies[start]:
            cheapest.setdefault(accuracies[t], t)
    hull = [start]
    for t in cheapest.values():  # ascending accuracy
        # Drop the last vertex while it lies above the chord from the one before it to t. Collinear tiers stay (so
        # a mixture takes two neighbours), to within rounding: a tier at most 1e-12 of the turn's scale above the
        # chord costs that much more, far below any measured accuracy's error.
        while len(hull) >= 2 and _turn(accuracies, costs, hull[-2], hull[-1], t) < 0:
            hull.pop()
        hull.append(t)
    return hull


def _turn(accuracies: Sequence[float], costs: Sequence[float], o: int, a: int, b: int) -> float:
    """The cross product of o->a and o->b in (accuracy, cost): negative when a lies above the chord o->b; 0 within
    rounding of collinear."""
    left = (accuracies[a] - accuracies[o]) * (costs[b] - costs[o])
    right = (costs[a] - costs[o]) * (accuracies[b] - accuracies[o])
    return 0.0 if abs(left - right) <= 1e-12 * (abs(left) + abs(right)) else left - right


def _alone(tier: int, n: int) -> list[float]:
    """Every score to `tier` (as `operating.reference_points`' "all <tier>")."""
    return [0.0] * tier + [NEVER] * (n - 1 - tier)


def _mixed(first: int, first_share: float, second: int, n: int) -> list[float]:
    """`first_share` of the traffic to tier `first`, the rest to tier `second`; the lower of the two on the ladder
    takes the lowest scores."""
    if not 0.0 < first_share < 1.0:
        return _alone(first if first_share >= 1.0 else second, n)
    if second < first:
        first, first_share, second = second, 1.0 - first_share, first
    return [0.0] * first + [first_share] * (second - first) + [NEVER] * (n - 1 - second)


class RandomSignal:
    """The random-route null as a routing signal: a keyed hash of the prompt for its score (the difficulty it
    reports is the same number), the default thresholds for named hints, and numeric hints from the tiers'
    accuracies and costs when it has them (costs default to the tier index, as `cascade router eval`'s)."""

    name = "random"

    def __init__(self, seed: int = 0, accuracies: Sequence[float] = (), costs: Sequence[float] = ()) -> None:
        if not 0 <= seed < 2**64:
            raise ValueError(f"a random routing seed is in [0, 2**64), got {seed}")
        self.seed = seed
        self.accuracies = list(accuracies)
        self.costs = list(costs) or [float(t) for t in range(len(self.accuracies))]

    def assess(self, text: str) -> Assessment:
        score = random_score(text, self.seed)
        return Assessment(difficulty=score, score=score)

    def operating_points(self) -> dict[str, list[float]]:
        return {}

    def thresholds_for_target(self, target: float) -> list[float] | None:
        if not self.accuracies:
            raise InvalidRequest(
                f"quality hint `{target:g}` is an accuracy target, which the random routing policy meets only with "
                "each tier's accuracy (`[routing.random] accuracies` in the gateway's config); ask for fast, "
                "balanced or best", "quality")
        return random_thresholds(self.accuracies, self.costs, target)
