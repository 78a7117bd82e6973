"""Routing policy: a difficulty score plus an operating point's thresholds pick a tier.

Thresholds are ascending, one fewer than tiers: a request of difficulty d goes to tier
``#{t in thresholds : d >= t}``, so low difficulty stays on the cheapest tier. An operating point
is named by a quality hint: `fast`, `balanced`, `best`, or a numeric accuracy target in (0, 1].
"""

from __future__ import annotations

import bisect
import math

import msgspec

from cascade.errors import InvalidRequest

NAMED_HINTS = ("fast", "balanced", "best")


class QualityHint(msgspec.Struct, frozen=True):
    """A parsed hint: exactly one of `name` or `target` is set."""

    name: str | None = None
    target: float | None = None

    @property
    def label(self) -> str:
        return self.name if self.name is not None else f"{self.target:g}"


def parse_hint(raw: str | float | None, param: str = "quality") -> QualityHint | None:
    if raw is None or raw == "":
        return None
    if isinstance(raw, bool):
        raise InvalidRequest(f"`{param}` must be one of {', '.join(NAMED_HINTS)} or a number in (0, 1]", param)
    if isinstance(raw, str):
        name = raw.strip().lower()
        if name in NAMED_HINTS:
            return QualityHint(name=name)
        try:
            raw = float(name)
        except ValueError:
            raise InvalidRequest(
                f"`{param}` must be one of {', '.join(NAMED_HINTS)} or a number in (0, 1], got {raw!r}", param
            ) from None
    value = float(raw)
    if not (0.0 < value <= 1.0) or math.isnan(value):
        raise InvalidRequest(f"`{param}` as a number must be an accuracy target in (0, 1], got {value:g}", param)
    return QualityHint(target=value)


def default_operating_points(n_tiers: int) -> dict[str, list[float]]:
    """Thresholds used when neither config nor plan gives them.

    `fast` never escalates, `best` always goes to the top tier, and `balanced` splits difficulty
    evenly between tiers (the heuristic difficulty is spread over [0, 1]).
    """
    k = n_tiers - 1
    return {
        "fast": [math.inf] * k,
        "balanced": [(i + 1) / n_tiers for i in range(k)],
        "best": [0.0] * k,
    }


def thresholds_for_target(target: float, n_tiers: int) -> list[float]:
    """A numeric accuracy target without a calibrated router: the higher the target, the lower
    the thresholds. Target 1.0 sends everything to the top tier; a target near 0 stays on tier 0.
    Replaced by calibrated operating points once a learned router is loaded (issue 3)."""
    k = n_tiers - 1
    slack = 1.0 - target
    return [min(1.0 + 1e-9, 2.0 * slack * (i + 1) / k) for i in range(k)] if k else []


def tier_for(difficulty: float, thresholds: list[float]) -> int:
    return bisect.bisect_right(thresholds, difficulty)


class RoutingPolicy:
    """Resolves a hint to thresholds (config/plan first, then defaults) and thresholds to a tier."""

    def __init__(self, n_tiers: int, operating_points: dict[str, list[float]] | None = None) -> None:
        self.n_tiers = n_tiers
        self.operating_points = default_operating_points(n_tiers) | (operating_points or {})

    def thresholds(self, hint: QualityHint) -> list[float]:
        if hint.name is not None:
            return self.operating_points[hint.name]
        assert hint.target is not None
        return self.operating_points.get(hint.label) or thresholds_for_target(hint.target, self.n_tiers)

    def choose(self, difficulty: float, hint: QualityHint) -> int:
        return tier_for(difficulty, self.thresholds(hint))
