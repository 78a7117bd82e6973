"""Routing policy: a routing signal's score plus an operating point's thresholds pick a tier.

Thresholds are ascending, one fewer than tiers: a request of score s goes to tier
``#{t in thresholds : s >= t}``, so a low score stays on the cheapest tier. An operating point
is named by a quality hint: `fast`, `balanced`, `best`, or a numeric accuracy target in (0, 1].

Three signals sit behind the `RoutingSignal` seam: the documented heuristic (score = its difficulty),
the learned router (`cascade.router.learned`: score = route score, see `cascade.router.operating`), and the
random-route null (`cascade.router.random_split`: score = a keyed hash of the prompt, uniform in [0, 1)).
Thresholds come, first match wins, from: the plan file or config (`operating_points`), the signal's
own calibration (learned router; the random split's from the tiers' accuracies), then
`default_operating_points` / `thresholds_for_target`.

A prompt the learned router flags as out of its training domain is routed by the heuristic with the default
thresholds instead (its calibrated thresholds are in another signal's units); the `Route` says so.
"""

from __future__ import annotations

import bisect
import itertools
import math
from typing import Protocol

import msgspec

from cascade.errors import ConfigError, InvalidRequest

NAMED_HINTS = ("fast", "balanced", "best")
# The model name that asks for routing (`cascade`, or `cascade:<hint>`); a tier's name bypasses the router.
ROUTED_MODEL = "cascade"


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
            raise InvalidRequest(f"`{param}` must be one of {', '.join(NAMED_HINTS)} or a number in (0, 1], "
                                 f"got {_shown(str(raw))}", param) from None
    value = float(raw)
    if not (0.0 < value <= 1.0) or math.isnan(value):
        raise InvalidRequest(f"`{param}` as a number must be an accuracy target in (0, 1], got {value:g}", param)
    return QualityHint(target=value)


def _shown(raw: str, limit: int = 40) -> str:
    """A client's value quoted in an error, cut to `limit` characters (a header may be megabytes)."""
    return repr(raw[:limit]) + ("..." if len(raw) > limit else "")


class Assessment(msgspec.Struct, frozen=True, kw_only=True):
    """What a routing signal says about one prompt."""

    difficulty: float  # p_fail of tier 0 (learned) or the heuristic's difficulty
    score: float  # what the thresholds compare against
    p_fail: tuple[float, ...] | None = None  # per tier, cheapest first (learned router only)
    # The learned router's domain check (cascade/router/domain.py): the prompt is unlike its training prompts.
    out_of_domain: bool = False


class Route(msgspec.Struct, frozen=True, kw_only=True):
    """A routing decision: the tier, what the deciding signal said, the thresholds it was compared with."""

    tier: int
    assessment: Assessment
    thresholds: list[float]
    router: str  # the signal that decided: the configured one, or "heuristic" for an out-of-domain prompt


class Assessed(msgspec.Struct, frozen=True, kw_only=True):
    """A prompt's assessment and the signal that made it (the configured one, or "heuristic" out of domain)."""

    assessment: Assessment
    router: str


class RoutingSignal(Protocol):
    name: str  # reported as `cascade.router`

    def assess(self, text: str) -> Assessment: ...

    def operating_points(self) -> dict[str, list[float]]:
        """Calibrated thresholds per named hint (empty: use the defaults)."""
        ...

    def thresholds_for_target(self, target: float) -> list[float] | None:
        """Calibrated thresholds for a numeric accuracy target (None: use the default rule; InvalidRequest: the
        signal can meet no target, and the default rule would pretend it does)."""
        ...


class HeuristicSignal:
    name = "heuristic"

    def assess(self, text: str) -> Assessment:
        from cascade.router.heuristic import heuristic_difficulty

        difficulty = heuristic_difficulty(text)
        return Assessment(difficulty=difficulty, score=difficulty)

    def operating_points(self) -> dict[str, list[float]]:
        return {}

    def thresholds_for_target(self, target: float) -> list[float] | None:
        return None


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
    """Resolves a hint to thresholds (plan/config, then the signal's calibration, then defaults) and
    a score plus thresholds to a tier."""

    def __init__(self, n_tiers: int, operating_points: dict[str, list[float]] | None = None,
                 signal: RoutingSignal | None = None) -> None:
        self.n_tiers = n_tiers
        self.signal: RoutingSignal = signal or HeuristicSignal()
        self.operating_points = (default_operating_points(n_tiers) | self.signal.operating_points()
                                 | (operating_points or {}))
        for hint, thresholds in self.operating_points.items():
            if len(thresholds) != n_tiers - 1 or any(b < a for a, b in itertools.pairwise(thresholds)):
                raise ConfigError(f"operating point `{hint}` needs {n_tiers - 1} ascending thresholds, "
                                  f"got {thresholds}")

    def thresholds(self, hint: QualityHint) -> list[float]:
        if hint.name is not None:
            return self.operating_points[hint.name]
        assert hint.target is not None
        return (self.operating_points.get(hint.label) or self.signal.thresholds_for_target(hint.target)
                or thresholds_for_target(hint.target, self.n_tiers))

    def route(self, text: str, hint: QualityHint) -> Route:
        return self.place(self.assess(text), hint)

    def assess(self, text: str) -> Assessed:
        """What the signal says of `text`, and which signal decides: the costly, pure part of routing (no hint, no
        state), which the gateway may run in a worker thread."""
        assessment = self.signal.assess(text)
        if not assessment.out_of_domain:
            return Assessed(assessment=assessment, router=self.signal.name)
        fallback = HeuristicSignal().assess(text)
        # The learned p_fail stays in the answer (what the router said), marked as out of domain.
        return Assessed(assessment=msgspec.structs.replace(fallback, p_fail=assessment.p_fail, out_of_domain=True),
                        router=HeuristicSignal.name)

    def place(self, assessed: Assessed, hint: QualityHint) -> Route:
        """The tier an assessed prompt goes to under `hint`'s operating point."""
        return self._place(assessed.assessment, hint, assessed.router)

    def reroute(self, route: Route, hint: QualityHint) -> Route:
        """`route`'s prompt under another hint's operating point (the assessment is kept: no second featurizing)."""
        return self._place(route.assessment, hint, route.router)

    def _place(self, assessment: Assessment, hint: QualityHint, router: str) -> Route:
        if not assessment.out_of_domain:
            thresholds = self.thresholds(hint)
        elif hint.name is not None:  # the heuristic's score: the default thresholds, in its units
            thresholds = default_operating_points(self.n_tiers)[hint.name]
        else:
            assert hint.target is not None
            thresholds = thresholds_for_target(hint.target, self.n_tiers)
        return Route(tier=tier_for(assessment.score, thresholds), assessment=assessment, thresholds=thresholds,
                     router=router)


def out_of_domain_note(route: Route | None, tier_names: list[str]) -> str | None:
    """What `cascade.note` says of a prompt the learned router flagged as unlike its training prompts (None: it did
    not): its p_fail is still reported, and for the tier the heuristic picked it may be near 1, so the note says that
    the heuristic's difficulty against the default thresholds decided, not that p_fail."""
    if route is None or not route.assessment.out_of_domain:
        return None
    thresholds = ", ".join(f"{t:.2f}" if math.isfinite(t) else "never" for t in route.thresholds)
    return (f"out of domain: the prompt is unlike the learned router's training prompts, so its p_fail (reported) "
            f"was not used; the heuristic's difficulty {route.assessment.score:.2f} against the default thresholds "
            f"[{thresholds}] chose `{tier_names[route.tier]}`")
