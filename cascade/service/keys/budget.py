"""A key's budget and its standing in a window: values shared by the budgets (cascade/service/keys/budgets.py), the
keys (tenant.py) and the ledgers in Redis (cascade/service/redis/ledger.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime

from cascade.config import ApiKey

PERIOD_S = {"hour": 3600, "day": 86_400, "month": 0}  # 0: the calendar month


@dataclass(frozen=True)
class Budget:
    """A key's budget: `amount` per period (`period_s` seconds; 0: the calendar month)."""

    amount: float
    period_s: int
    downgrade_at: float = 0.0  # 0: never downgraded
    downgrade_to: str = "fast"

    @classmethod
    def of(cls, key: ApiKey) -> Budget | None:
        if not key.budget:
            return None
        period = key.budget_period
        return cls(key.budget, PERIOD_S[period] if isinstance(period, str) else period, key.downgrade_at,
                   key.downgrade_to)

    @property
    def per(self) -> str:
        """The period as a message says it: "per month", "per day", "per 600 s"."""
        names = {s: name for name, s in PERIOD_S.items()}
        return f"per {names[self.period_s]}" if self.period_s in names else f"per {self.period_s} s"


def window(period_s: int, now: float) -> tuple[int, int]:
    """The UTC window holding `now` (Unix seconds): [start, end) in whole seconds. `period_s` > 0: windows of that
    length from the Unix epoch; 0: the calendar month. (cascade/service/redis/ledger.py's Lua `window` is the same
    function.)"""
    second = math.floor(now)
    if period_s:
        start = second - second % period_s
        return start, start + period_s
    day = datetime.fromtimestamp(second, UTC)
    start_at = datetime(day.year, day.month, 1, tzinfo=UTC)
    end_at = datetime(day.year + day.month // 12, day.month % 12 + 1, 1, tzinfo=UTC)
    return int(start_at.timestamp()), int(end_at.timestamp())


@dataclass(frozen=True)
class Standing:
    """A key's window: what it spent and reserved in it (requests in flight count at their worst case)."""

    spent: float
    start: int
    end: int
    admitted: bool = True  # for a reservation: whether it was taken
    shared: bool = False  # decided by Redis's ledger (its settle goes there); else this process's
