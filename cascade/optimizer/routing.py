"""From thresholds to per-tier load and overall quality, on the profiled outcomes.

Two routing signals, two semantics:

* ``cascade`` (Cascadia, judge scores): every request starts on tier 0; tier i's answer is accepted
  when its judge score >= h_i, otherwise the request moves on; the last tier always accepts. Loads
  are cumulative: an escalated request was processed by every earlier tier too (the paper's
  100% / 94% / 50% example). Thresholds need not be ordered.
* ``route`` (the gateway's router, difficulty = p_fail of tier 0): a request goes straight to tier
  #{h in thresholds : difficulty >= h} (`cascade.router.policy.tier_for`); thresholds ascend and
  each request loads exactly one tier.

Quality Q is the mean quality (judge score or correctness) of the answer finally returned.
Thresholds live on a 0.01 grid: integer k means k / 100, and NEVER (101) means 1.01, above any
score or difficulty (accept nothing / escalate nothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

Mode = Literal["cascade", "route"]
GRID = 100
NEVER = GRID + 1


@dataclass(frozen=True)
class RoutingData:
    """What routing needs from the outcomes, with missing values already resolved."""

    mode: Mode
    signal: np.ndarray  # cascade: judge score (n, tiers); route: difficulty (n,)
    quality: np.ndarray  # (n, tiers): quality of each tier's answer

    @property
    def n_tiers(self) -> int:
        return self.quality.shape[1]


def thresholds(mode: Mode, ks: tuple[int, ...]) -> list[float]:
    values = [k / GRID for k in ks]
    return sorted(values) if mode == "route" else values


def final_tier(data: RoutingData, ks: tuple[int, ...]) -> np.ndarray:
    """The tier whose answer each request returns."""
    h = np.asarray(thresholds(data.mode, ks))
    if data.mode == "route":
        return np.searchsorted(h, data.signal, side="right")
    accepted = data.signal[:, :-1] >= h[None, :]
    accepted = np.concatenate([accepted, np.ones((len(accepted), 1), dtype=bool)], axis=1)
    return np.argmax(accepted, axis=1)


def reach(data: RoutingData, final: np.ndarray) -> np.ndarray:
    """(n, tiers) bool: which tiers process each request."""
    tiers = np.arange(data.n_tiers)[None, :]
    return tiers <= final[:, None] if data.mode == "cascade" else tiers == final[:, None]


def quality(data: RoutingData, final: np.ndarray) -> float:
    return float(np.mean(data.quality[np.arange(len(final)), final]))


def quality_bounds(data: RoutingData) -> tuple[float, float]:
    """(z1, z2): quality with everything on the top tier (utopia) and on tier 0 (nadir)."""
    return float(np.mean(data.quality[:, -1])), float(np.mean(data.quality[:, 0]))


def proportional_start(data: RoutingData) -> tuple[int, ...]:
    """Cascadia's theta_0: tier i (0-based) receives 1/(i+1) of the requests. In cascade mode that is
    the share reaching tier i; in route mode the shares 1, 1/2, 1/3... are normalized."""
    c = data.n_tiers
    if data.mode == "route":
        shares = 1.0 / np.arange(1, c + 1)
        cuts = np.cumsum(shares / shares.sum())[:-1]
        return tuple(round(float(np.quantile(data.signal, q)) * GRID) for q in cuts)
    ks: list[int] = []
    alive = np.ones(len(data.signal), dtype=bool)
    for i in range(c - 1):
        target = 1.0 / (i + 2)
        options = range(NEVER + 1)
        share = [np.mean(alive & (data.signal[:, i] < k / GRID)) for k in options]
        k = int(np.argmin([abs(s - target) for s in share]))
        ks.append(k)
        alive &= data.signal[:, i] < k / GRID
    return tuple(ks)


def extremes(n_thresholds: int, mode: Mode) -> list[tuple[int, ...]]:
    """All on tier 0 and all on the top tier, in the given semantics."""
    if mode == "route":
        return [(NEVER,) * n_thresholds, (0,) * n_thresholds]
    return [(0,) * n_thresholds, (NEVER,) * n_thresholds]
