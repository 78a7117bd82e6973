"""The bound each tier is held to, and the planner's bottleneck in SLO scale (`[slo] ttft_s` / `e2e_s`).

The gateway streams a voted answer only once the vote is decided (cascade/branches/), so a tier whose width votes
(N > 1) shows the client its first token at its end: its p95 is held to the TTFT bound. A direct tier streams as it
decodes; the simulator times whole requests and not their first token, so a direct tier is held to the end-to-end
bound on the p95 it predicts (its TTFT, a prefill and a queue, is not simulated and is assumed to meet its bound).

Cascadia's measure is the smallest SLO scale met; a tier's scale is its p95 over its bound. The planner compares
tiers by weight x p95 with weight = e2e_s / the tier's bound: the scale times e2e_s, so that the bottleneck L stays
in seconds of the end-to-end bound and J = L + mu * shortfall keeps mu's meaning. A direct tier's weight is exactly 1:
a ladder without a vote plans with the keys as without them. Without the keys there are no weights and nothing is
rescaled (the planner runs as before, bit for bit).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from cascade.optimizer.problem import SloSpec
from cascade.optimizer.widths import Width

Binding = Literal["ttft", "e2e"]


@dataclass(frozen=True)
class TierBounds:
    """Per tier, the SLO that binds it and that bound in seconds."""

    binding: list[Binding]
    bound_s: list[float]
    e2e_s: float

    @property
    def weights(self) -> np.ndarray:
        """Per tier, what its p95 is multiplied by in the bottleneck (e2e_s / its bound; 1 for a direct tier)."""
        return np.array([1.0 if b == "e2e" else self.e2e_s / s for b, s in zip(self.binding, self.bound_s,
                                                                                strict=True)])

    def scale(self, tier: int, p95_s: float) -> float:
        return p95_s / self.bound_s[tier]

    def worst(self, p95_s: list[float]) -> float:
        """The worst tier's scale (Cascadia's measure: the smallest SLO scale these p95s meet)."""
        return max(self.scale(i, p) for i, p in enumerate(p95_s))


def tier_bounds(slo: SloSpec, widths: list[Width]) -> TierBounds | None:
    """The bounds of tiers at these widths; None without `ttft_s` / `e2e_s`."""
    if slo.bounds is None:
        return None
    ttft_s, e2e_s = slo.bounds
    binding: list[Binding] = ["ttft" if w.n > 1 else "e2e" for w in widths]
    return TierBounds(binding=binding, bound_s=[ttft_s if b == "ttft" else e2e_s for b in binding], e2e_s=e2e_s)


def weighted(latencies: np.ndarray, weights: np.ndarray | None) -> np.ndarray:
    """Tier latencies (one row, or an l(f) table row, per tier) as the bottleneck compares them."""
    if weights is None:
        return latencies
    return latencies * (weights[:, None] if latencies.ndim == 2 else weights)


def tier_record(bounds: TierBounds | None, tier: int, p95_s: float) -> tuple[Binding | None, float | None]:
    """The plan's `binding_slo` and `predicted_slo_scale` of a tier (None, None without the bounds)."""
    if bounds is None:
        return None, None
    return bounds.binding[tier], round(bounds.scale(tier, p95_s), 4)


class _Timed(Protocol):  # a search.Evaluation (search imports this module)
    @property
    def latency_s(self) -> float: ...
    @property
    def bottleneck_s(self) -> float: ...


def bottleneck_text(bounds: TierBounds | None, e: _Timed) -> str:
    """L for the planner's progress lines: seconds, or with the bounds the SLO scale and the slowest tier's seconds."""
    if bounds is None:
        return f"L = {e.latency_s:.2f} s"
    return f"SLO scale {e.bottleneck_s / bounds.e2e_s:.3f}, slowest tier p95 {e.latency_s:.2f} s"
