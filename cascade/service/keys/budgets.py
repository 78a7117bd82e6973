"""Spend budgets per API key (`[[gateway.keys]] budget`): a key spends at most its budget per period, in the tiers'
price currency (cascade/service/keys/costs.py), and may be served more cheaply near it (`downgrade_at`).

    reserve   before dispatch (the lease's `take`, after the key's token bucket): the request's worst case (its token
              reservation priced at the dearest tier it may reach) is added to what the key spent this period. A key
              whose spent-and-reserved amount has reached its budget is refused: QuotaExceeded, a 429 with OpenAI's
              `insufficient_quota` body, naming the budget and when it resets.
    settle    when the request ends, on every way out (the lease's `aclose`): the reservation is corrected to the
              request's cost (its bill priced; an answer cut while under way, whose tokens are unknown, keeps its
              worst case).
    downgrade before routing, for a key with `downgrade_at`: past that fraction of its budget, the request is served
              as `downgrade_to` asks (a quality hint, or a tier) instead, with a `cascade.note` saying so.

A key is admitted while what it spent and reserved is below its budget, so N requests in flight at once reserve
their worst cases one after another (atomically, in Redis across gateways) and the budget is overspent by one
request at most: the last one admitted, by at most its worst case (more only when its bill exceeds its reservation,
which counts the prompt once while an escalation processes it on each tier it climbs).

Periods are windows of UTC time: a calendar month, or `period_s` seconds counted from the Unix epoch ("hour" is
3600 and "day" 86400, so they start on the hour and at midnight UTC). What a key spent belongs to the window it was
reserved in: a new window starts from zero, and a request still in flight when its window ended settles nothing
(its window is gone).

`BudgetLedger` is the seam: this process's (`LocalLedger`), or Redis's, shared by every gateway
(cascade/service/redis/ledger.py `RedisLedger`), with `[gateway.redis] failure`'s rules while Redis is away.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from datetime import UTC, datetime
from typing import Protocol

import msgspec

from cascade.errors import QuotaExceeded
from cascade.router.policy import ROUTED_MODEL
from cascade.schemas import ChatCompletionRequest
from cascade.service.keys.bill import Bill
from cascade.service.keys.budget import Budget, Standing, window
from cascade.service.keys.claims import Charge
from cascade.service.keys.costs import Prices, plain
from cascade.service.keys.ratelimit import duration
from cascade.service.keys.tenant import Tenant
from cascade.service.metrics import GatewayMetrics


class BudgetLedger(Protocol):
    async def reserve(self, key: str, budget: float, period_s: int, amount: float) -> Standing:
        """Add `amount` to `key`'s spending in the current window if it is below `budget`, else nothing."""
        ...

    def settle(self, key: str, standing: Standing, correction: float) -> None:
        """Add `correction` (cost - reservation: a refund < 0) to the window of `standing`, if it is still the
        key's window (without waiting)."""
        ...

    async def standing(self, key: str, period_s: int) -> Standing:
        """`key`'s current window."""
        ...


class LocalLedger:
    """Budgets in this process (each gateway process, and each `--processes` worker, has its own)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._windows: dict[str, tuple[int, float]] = {}  # key -> (window start, spent and reserved)

    def _spent(self, key: str, start: int) -> float:
        held = self._windows.get(key)
        return held[1] if held is not None and held[0] == start else 0.0

    async def reserve(self, key: str, budget: float, period_s: int, amount: float) -> Standing:
        return self.take(key, budget, period_s, amount)

    def take(self, key: str, budget: float, period_s: int, amount: float) -> Standing:
        """`reserve`, for a caller outside the event loop."""
        start, end = window(period_s, self.clock())
        spent = self._spent(key, start)
        if spent >= budget:
            return Standing(spent, start, end, admitted=False)
        self._windows[key] = (start, spent + amount)
        return Standing(spent + amount, start, end)

    def settle(self, key: str, standing: Standing, correction: float) -> None:
        held = self._windows.get(key)
        if held is not None and held[0] == standing.start:
            self._windows[key] = (held[0], max(0.0, held[1] + correction))

    async def standing(self, key: str, period_s: int) -> Standing:
        return self.read(key, period_s)

    def read(self, key: str, period_s: int) -> Standing:
        start, end = window(period_s, self.clock())
        return Standing(self._spent(key, start), start, end)


class Budgets:
    """The keys' budgets over a ledger, with the prices that cost a request, and the cost metrics (per tier, for
    every request; per key)."""

    def __init__(self, ledger: BudgetLedger, metrics: GatewayMetrics, prices: Prices | None,
                 clock: Callable[[], float] = time.time) -> None:
        """`clock`: the time the messages and headers count to a reset from (Unix seconds)."""
        self.ledger = ledger
        self.metrics = metrics
        self.prices = prices
        self.clock = clock
        self.currency = "" if prices is None else prices.currency

    def publish(self, tenants: Collection[Tenant]) -> None:
        """Each key's budget as a metric (cascade_key_budget), beside what it spent: dashboards and alerts read the
        share spent from the two."""
        for tenant in tenants:
            if tenant.budget is not None:
                self.metrics.key_budget.labels(tenant.name).set(tenant.budget.amount)

    async def reserve(self, tenant: Tenant, worst_case: float) -> Charge | None:
        """Reserve `worst_case` from `tenant`'s budget (None: it has none); QuotaExceeded when it is spent."""
        budget = tenant.budget
        if budget is None:
            return None
        standing = await self.ledger.reserve(tenant.name, budget.amount, budget.period_s, worst_case)
        self.metrics.key_budget_spent.labels(tenant.name).set(standing.spent)
        if not standing.admitted:
            self.metrics.key_rate_limited.labels(tenant.name, "budget").inc()
            raise QuotaExceeded(self._over_budget(tenant, budget, standing), max(1.0, standing.end - self.clock()))
        return Charge(tenant, worst_case, standing)

    def settle(self, tenant: Tenant | None, bill: Bill, charge: Charge | None) -> None:
        """The request ended: count its cost (per tier; per key), and correct its key's reservation to it (an answer
        cut while under way, whose tokens are unknown: the reservation stands, or its bill if that is more)."""
        if self.prices is None:
            return
        spent = self.prices.by_tier(bill.tiers)
        for tier, amount in spent.items():
            self.metrics.cost.labels(tier).inc(amount)
            if tenant is not None:
                self.metrics.key_cost.labels(tenant.name, tier).inc(amount)
        if charge is None:
            return
        used = sum(spent.values())
        if bill.unknown:
            used = max(used, charge.reserved)
        if used != charge.reserved:
            self.ledger.settle(charge.tenant.name, charge.standing, used - charge.reserved)

    async def downgrade(self, tenant: Tenant | None) -> tuple[str, str] | None:
        """(what to serve the request as, why) when `tenant` is past its `downgrade_at`; else None."""
        budget = None if tenant is None else tenant.budget
        if tenant is None or budget is None or not budget.downgrade_at:
            return None
        standing = await self.ledger.standing(tenant.name, budget.period_s)
        self.metrics.key_budget_spent.labels(tenant.name).set(standing.spent)
        if standing.spent < budget.downgrade_at * budget.amount:
            return None
        why = (f"API key `{tenant.name}` has spent {standing.spent / budget.amount:.0%} of its budget of "
               f"{budget.amount:g} {self.currency} {budget.per} (downgrade_at {budget.downgrade_at:g})")
        return budget.downgrade_to, why

    def headers(self, charge: Charge | None) -> list[tuple[bytes, bytes]]:
        """The key's budget as its reservation left it: x-cascade-budget-limit, -remaining, -reset."""
        if charge is None or charge.tenant.budget is None:
            return []
        standing, amount = charge.standing, charge.tenant.budget.amount
        return [(b"x-cascade-budget-limit", plain(amount)),
                (b"x-cascade-budget-remaining", plain(max(0.0, amount - standing.spent))),
                (b"x-cascade-budget-reset", duration(standing.end - self.clock()).encode())]

    def _over_budget(self, tenant: Tenant, budget: Budget, standing: Standing) -> str:
        resets = datetime.fromtimestamp(standing.end, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return (f"You exceeded your current quota: API key `{tenant.name}` has spent {standing.spent:.6g} "
                f"{self.currency} of its budget of {budget.amount:g} {self.currency} {budget.per} (its requests in "
                f"flight count at their worst case). The budget resets at {resets} (in "
                f"{duration(standing.end - self.clock())}).")


def downgraded(req: ChatCompletionRequest, hint_header: str | None, found: tuple[str, str], tiers: Collection[str],
               prices: Prices | None, default_quality: str
               ) -> tuple[ChatCompletionRequest, str | None, str] | None:
    """`req` and its hint header as a key past `downgrade_at` has them served, with the note that says so, for
    `found` (`Budgets.downgrade`'s target and why); None: as asked. A routed request is routed as the target asks (a
    hint; a tier serves it); a request that names its tier keeps it unless the target is a cheaper tier; one that
    asks for the target already is left as it is."""
    target, why = found
    if req.model in tiers:
        if target not in tiers or prices is None or not prices.dearer(req.model, target):
            return None
    elif target not in tiers:
        asked = str(req.quality) if req.quality is not None else hint_header or req.model.partition(":")[2]
        if (asked or default_quality).strip().lower() == target:
            return None
    if target in tiers:
        return msgspec.structs.replace(req, model=target, quality=None), None, f"served on `{target}`: {why}"
    return (msgspec.structs.replace(req, model=ROUTED_MODEL, quality=target), None,
            f"served as `{ROUTED_MODEL}:{target}`: {why}")
