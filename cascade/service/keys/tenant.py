"""An API key as the gateway knows it: its name, digest, limits, permits and budget (`[[gateway.keys]]`)."""

from __future__ import annotations

from dataclasses import dataclass

from cascade.service.keys.budget import Budget


@dataclass(frozen=True)
class Tenant:
    name: str  # the metrics label
    digest: bytes
    requests_per_minute: int = 0
    tokens_per_minute: int = 0
    hints: frozenset[str] = frozenset()  # empty: all
    tiers: frozenset[str] = frozenset()  # empty: all
    max_in_flight: int = 0  # 0: unlimited
    budget: Budget | None = None  # spend per period (cascade/service/keys/budgets.py); None: none
