"""Load-reactive operating points: quality that gives way to live load before requests queue or get a 429.

`Headroom` watches each tier two ways:

* full, read live per request: its requests in flight have reached what it holds (`[routing.load]
  max_in_flight`, or its branch slots / branches). Exact and instantaneous, so the tier is kept busy at its
  capacity and only the excess moves: the signal to configure when the engine's batch size is known.
* pressed, with hysteresis: the `percentile` of its TTFT or E2E over the last `window_s` is at `enter_at` x the
  SLO (`ttft_ms`, `e2el_ms`) or above; it is free again once below `exit_at` x the SLO after at least `hold_s`
  pressed. Latency lags load, so this is the backstop for a capacity nobody configured: while pressed, every
  movable request moves off the tier.

Where a tier's engines publish their own load (SGLang's /metrics, read by the gateway: an `EngineView`), it counts
too, whoever sent it (another gateway, another tier on the same engine): the tier is also full while its engines
queue (every one of them, for `[routing.engine_load] queue_for_s`) or hold its capacity x its branches, and
pressed by the engines' own TTFT percentile. Without a fresh view, the gateway's own counters are all there is.

The router (cascade/router/router.py) moves a request with a named hint (`balanced`, and `best` when
`degrade_best`) whose itinerary would load a full or pressed tier to the next cheaper operating point (`best` ->
`balanced` -> `fast`) whose first tier is neither, and says why; when no cheaper point helps, the request keeps its
own (and a reasoning tier runs fewer branches). Numeric hints are never moved: they keep their accuracy target,
and admission answers 429 when the tier is at its limit. Plain data, the live load read through one small
protocol (`TierLoad`, with a fake: `StaticLoad`), a clock passed in: every rule is tested without a server.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

import msgspec
import numpy as np

from cascade.config import LoadReactiveConfig

_REFRESH_S = 0.1  # pressure is recomputed at most this often (a percentile per tier is not free per request)


class EngineView(msgspec.Struct, frozen=True, kw_only=True):
    """A tier's engines as they report themselves (every replica's, read recently), in engine requests (one per
    branch)."""

    running: int
    queued: int
    saturated: bool  # every engine has had requests waiting for at least `queue_for_s`
    ttft_s: float | None = None  # the engines' TTFT `percentile` over `window_s` (None: too few answers)


class TierShape(msgspec.Struct, frozen=True):
    """A tier as load-reactive routing sees it: its name, its branch slots (0: none), its branches per request."""

    name: str
    branch_slots: int = 0
    branches: int = 1


class TierLoad(Protocol):
    """The live load view, read per request: the gateway's requests in flight on each tier, and each tier's
    engines' own report where they publish one."""

    def requests(self, tier: int) -> int:
        """This gateway's requests in flight on `tier` now."""
        ...

    def engine(self, tier: int) -> EngineView | None:
        """Tier `tier`'s engines as they report themselves (None: not known now)."""
        ...


class StaticLoad:
    """A `TierLoad` read from lists a caller sets (tests, tools): `load[i]` requests in flight on tier i, and its
    engines' view `views[i]`."""

    def __init__(self, load: list[int], views: list[EngineView | None] | None = None) -> None:
        self.load = load
        self.views = views if views is not None else [None] * len(load)

    def requests(self, tier: int) -> int:
        return self.load[tier]

    def engine(self, tier: int) -> EngineView | None:
        return self.views[tier]


class TierPressure(msgspec.Struct, frozen=True, kw_only=True):
    tier: str
    pressure: float  # latency / SLO (the larger of TTFT's and E2E's; 0 without enough answers)
    pressed: bool
    why: str  # the latency that sets the pressure


class _Window:
    """Observations (seconds) of the last `span_s`."""

    def __init__(self) -> None:
        self.samples: deque[tuple[float, float]] = deque()

    def add(self, now: float, value: float) -> None:
        self.samples.append((now, value))

    def percentile(self, now: float, span_s: float, q: float, min_samples: int) -> float | None:
        while self.samples and self.samples[0][0] < now - span_s:
            self.samples.popleft()
        if len(self.samples) < min_samples:
            return None
        return float(np.percentile([v for _, v in self.samples], q))


class Headroom:
    """Each tier's live pressure and pressed flag. `load` is the live view (each tier's requests in flight now,
    its engines' own report); `capacity[i]` the requests tier i holds when full (None: load not watched), and
    `streams[i]` the engine requests one of its requests makes (its branches)."""

    def __init__(self, names: Sequence[str], config: LoadReactiveConfig, capacity: Sequence[int | None],
                 load: TierLoad, clock: Callable[[], float] = time.monotonic, streams: Sequence[int] | None = None
                 ) -> None:
        self.names = list(names)
        self.config = config
        self.capacity = list(capacity)
        self.load = load
        self.clock = clock
        self.streams = list(streams or [1] * len(self.names))
        self.ttft = [_Window() for _ in names]
        self.e2el = [_Window() for _ in names]
        self.hot_at: list[float | None] = [None] * len(names)  # last time each pressed tier was at enter_at or above
        self.states = [TierPressure(tier=n, pressure=0.0, pressed=False, why="") for n in names]
        self.refreshed = -_REFRESH_S

    def observe_ttft(self, tier: int, seconds: float) -> None:
        self.ttft[tier].add(self.clock(), seconds)

    def observe_e2el(self, tier: int, seconds: float) -> None:
        self.e2el[tier].add(self.clock(), seconds)

    def all(self) -> list[TierPressure]:
        """Every tier's latency pressure and pressed flag (recomputed at most every _REFRESH_S)."""
        now = self.clock()
        if now - self.refreshed >= _REFRESH_S:
            self.refreshed = now
            self.states = [self._update(i, now) for i in range(len(self.names))]
        return self.states

    def state(self, tier: int) -> TierPressure:
        return self.all()[tier]

    def _full(self, tier: int) -> str | None:
        """Why the tier is full now (its requests in flight reached its capacity, or its engines say so), or None."""
        cap = self.capacity[tier]
        load = self.load.requests(tier) if cap else 0
        if cap and load >= cap:
            return f"{load} in flight of {cap}"
        view = self.load.engine(tier)
        if view is None:
            return None
        if view.saturated:
            return f"its engines queue {view.queued} requests ({view.running} running)"
        held, holds = view.running + view.queued, (cap or 0) * self.streams[tier]
        return f"its engines hold {held} requests of {holds}" if cap and held >= holds else None

    def hot(self, tier: int) -> str | None:
        """Why a movable request should keep off the tier now (full, or pressed), or None."""
        if (full := self._full(tier)) is not None:
            return full
        state = self.state(tier)
        return state.why if state.pressed else None

    def _update(self, tier: int, now: float) -> TierPressure:
        pressure, why = self._pressure(tier, now)
        c = self.config
        hot_at = self.hot_at[tier]
        if pressure >= c.enter_at:
            self.hot_at[tier] = now  # pressed, and the hold counts from now
        elif hot_at is not None and pressure < c.exit_at and now - hot_at >= c.hold_s:
            self.hot_at[tier] = None
        return TierPressure(tier=self.names[tier], pressure=round(pressure, 3), pressed=self.hot_at[tier] is not None,
                            why=why)

    def _pressure(self, tier: int, now: float) -> tuple[float, str]:
        c = self.config
        signals: list[tuple[float, str]] = [(0.0, "")]
        for window, slo_ms, name in ((self.ttft[tier], c.ttft_ms, "ttft"), (self.e2el[tier], c.e2el_ms, "e2el")):
            if slo_ms:
                value = window.percentile(now, c.window_s, c.percentile, c.min_samples)
                if value is not None:
                    signals.append((value * 1000 / slo_ms,
                                    f"{name} p{c.percentile:g} {value:.2f} s against the {slo_ms / 1000:.2f} s SLO"))
        view = self.load.engine(tier) if c.ttft_ms else None
        if view is not None and view.ttft_s is not None:
            signals.append((view.ttft_s * 1000 / c.ttft_ms, f"engine ttft p{c.percentile:g} {view.ttft_s:.2f} s "
                                                            f"against the {c.ttft_ms / 1000:.2f} s SLO"))
        return max(signals, key=lambda s: s[0])


def capacities(config: LoadReactiveConfig, tiers: Sequence[TierShape]) -> list[int | None]:
    """Per tier: the requests it holds when full, or None (load not watched)."""
    return [config.max_in_flight.get(t.name) or (t.branch_slots // t.branches if t.branch_slots else None)
            for t in tiers]
