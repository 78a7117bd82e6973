"""Spend budgets per API key (cascade/service/keys/budgets.py): UTC windows (hypothesis), the in-process ledger on a fake
clock (reserve, settle, the period's reset), a key over its budget refused with OpenAI's 429 `insufficient_quota`
(in-process and over HTTP), at most one request's worst case overspent by concurrent requests, and the downgrade
past `downgrade_at`.

ChatService runs in front of the fake engine over real HTTP on 127.0.0.1 (tests/service/test_lease.py's setup);
the budgets in Redis, across gateways: tests/gateway/test_redis_budgets.py."""

from __future__ import annotations

import asyncio
import hashlib
from datetime import UTC, datetime

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cascade.errors import QuotaExceeded
from cascade.service.chat import ChatService, WholeReply
from cascade.service.keys.budget import PERIOD_S, Budget, Standing, window
from cascade.service.keys.budgets import Budgets, LocalLedger
from cascade.service.keys.reservation import estimate_prompt_tokens, estimate_tokens
from cascade.service.keys.tenant import Tenant
from cascade.testing.servers import TIERS, ladder_toml
from tests.gateway.test_tenants import bearer, entry
from tests.service.keys.test_costs import PROPERTY
from tests.service.pricing import priced, running_priced_gateway
from tests.service.test_lease import request, with_service

NOW = 1_764_000_000.0  # 2025-11-24T16:00:00Z


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def key(amount: float, period_s: int = 3600, **budget: object) -> Tenant:
    return Tenant("acme", hashlib.sha256(b"acme").digest(), budget=Budget(amount, period_s, **budget))  # type: ignore[arg-type]


def on_clock(service: ChatService, clock: Clock) -> LocalLedger:
    """The service's budgets on `clock` (its ledger and its messages)."""
    ledger = LocalLedger(clock)
    service.budgets = Budgets(ledger, service.metrics, service.budgets.prices, clock)
    return ledger


def cost(reply: object) -> float:
    assert isinstance(reply, WholeReply) and reply.completion.cascade is not None
    assert reply.completion.cascade.cost is not None
    return reply.completion.cascade.cost.total


# --- windows ------------------------------------------------------------------------------------------------------


@PROPERTY
@given(now=st.floats(min_value=0, max_value=2**34, allow_nan=False),
       period_s=st.one_of(st.sampled_from(sorted(PERIOD_S.values())), st.integers(min_value=1, max_value=31_622_400)))
def test_a_window_holds_its_moment_and_starts_on_its_boundary(now: float, period_s: int) -> None:
    start, end = window(period_s, now)
    assert start <= now < end and isinstance(start, int) and isinstance(end, int)
    if period_s:
        assert end - start == period_s and start % period_s == 0
    else:
        first, following = datetime.fromtimestamp(start, UTC), datetime.fromtimestamp(end, UTC)
        assert (first.day, first.hour, first.minute, first.second) == (1, 0, 0, 0) and following.day == 1
        assert (following.year * 12 + following.month) - (first.year * 12 + first.month) == 1


def test_named_periods_are_utc_hours_days_and_calendar_months() -> None:
    assert window(PERIOD_S["hour"], NOW) == (1_764_000_000, 1_764_003_600)
    assert window(PERIOD_S["day"], NOW) == (1_763_942_400, 1_764_028_800)  # 2025-11-24T00:00Z, the 25th
    assert window(PERIOD_S["month"], NOW) == (1_761_955_200, 1_764_547_200)  # 2025-11-01T00:00Z, 12-01
    assert window(0, 1_735_689_599) == (1_733_011_200, 1_735_689_600)  # the last second of 2024: December


# --- the ledger ---------------------------------------------------------------------------------------------------


def test_a_ledger_admits_while_below_the_budget_settles_and_starts_each_window_from_zero() -> None:
    clock = Clock()
    ledger = LocalLedger(clock)
    first = ledger.take("k", 10.0, 3600, 6.0)
    second = ledger.take("k", 10.0, 3600, 6.0)  # 6 < 10: admitted, and the amount reaches 12
    refused = ledger.take("k", 10.0, 3600, 0.5)
    ledger.settle("k", second, -5.0)  # it cost 1 of its 6
    after_refund = ledger.take("k", 10.0, 3600, 1.0)
    clock.now += 3600
    ledger.settle("k", first, -6.0)  # the first window is over: its settle changes nothing
    fresh = ledger.read("k", 3600)
    assert (first.admitted, second.admitted, refused.admitted) == (True, True, False)
    assert (second.spent, refused.spent, after_refund.spent) == (12.0, 12.0, 8.0)
    assert fresh == Standing(0.0, first.end, first.end + 3600)


# --- a key over its budget --------------------------------------------------------------------------------------


def test_a_key_is_served_until_its_budget_is_spent_then_refused_until_the_period_resets() -> None:
    caller = key(amount=1e-4)
    clock = Clock()

    async def work(service: ChatService):
        ledger = on_clock(service, clock)
        costs = []
        with pytest.raises(QuotaExceeded) as refused:
            for _ in range(20):
                costs.append(cost(await service.chat(request(model=TIERS[0]), caller=caller)))
        spent = ledger.read("acme", 3600).spent
        clock.now += 3600  # the next hour
        again = cost(await service.chat(request(model=TIERS[0]), caller=caller))
        return costs, spent, refused.value, again, ledger.read("acme", 3600).spent

    costs, spent, refused, again, spent_after = with_service(work, rewrite=priced)
    assert 1 < len(costs) < 20 and spent == pytest.approx(sum(costs))
    assert spent >= 1e-4 and spent - costs[-1] < 1e-4  # admitted while below it: the last one took it over
    assert refused.code == "insufficient_quota" and refused.retry_after_s == pytest.approx(3600, abs=1)
    assert "API key `acme` has spent 0.0001" in refused.message and "budget of 0.0001 USD per hour" in refused.message
    assert "resets at 2025-11-24T17:00:00Z (in 1h0m0s)" in refused.message
    assert again > 0 and spent_after == pytest.approx(again)


def test_concurrent_requests_overspend_a_budget_by_one_requests_worst_case_at_most() -> None:
    caller = key(amount=5e-3)  # about 7 requests' worst cases, 19 requests' costs

    async def work(service: ChatService):
        async def one() -> float | None:
            try:
                return cost(await service.chat(request(model=TIERS[1], messages=[
                    {"role": "user", "content": "[fake@fake-1 itl_ms=5] hi"}]), caller=caller))
            except QuotaExceeded:
                return None

        results = await asyncio.gather(*(one() for _ in range(40)))
        req, prices = request(model=TIERS[1], messages=[{"role": "user", "content": "[fake@fake-1 itl_ms=5] hi"}]), \
            service.budgets.prices
        assert prices is not None
        prompt = estimate_prompt_tokens(req)  # the reservation: the prompt and the tier's default max_tokens (32)
        return results, prices.worst_case([TIERS[1]], prompt, estimate_tokens(req, 1, 32) - prompt)

    results, worst = with_service(work, rewrite=priced)
    served = [c for c in results if c is not None]
    assert 1 < len(served) < len(results)  # some were refused
    assert sum(served) <= 5e-3 + worst and worst > max(served)


def test_an_over_budget_key_gets_openais_429_with_its_retry_after_and_every_answer_its_budget_headers() -> None:
    keys = entry("team-a", budget=1e-5, budget_period="day")

    with running_priced_gateway(lambda toml: priced(keys + toml)) as base:
        def post() -> httpx.Response:
            return httpx.post(f"{base}/v1/chat/completions", json={"model": TIERS[2], "messages": [
                {"role": "user", "content": "hi"}]}, headers=bearer(), timeout=10)

        first = post()
        refused = post()
        metrics = httpx.get(f"{base}/metrics", timeout=10).text
    assert first.status_code == 200
    # The budget beside what was spent, for the dashboard's share and CascadeKeyBudgetNearlySpent.
    assert 'cascade_key_budget{key="team-a"} 1e-05' in metrics
    assert 'cascade_key_budget_spent{key="team-a"}' in metrics
    assert first.headers["x-cascade-budget-limit"] == "0.00001"
    assert float(first.headers["x-cascade-budget-remaining"]) == 0  # its worst case alone was over the budget
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert error["type"] == error["code"] == "insufficient_quota" and error["param"] is None
    assert "API key `team-a` has spent" in error["message"] and "per day" in error["message"]
    now = datetime.now(UTC)
    midnight = datetime(now.year, now.month, now.day, tzinfo=UTC).timestamp() + 86_400
    assert abs(int(refused.headers["retry-after"]) - (midnight - now.timestamp())) < 5


def test_budgets_in_config_reach_the_keys() -> None:
    from cascade.config import decode_config
    from cascade.service.keys.keyring import Keyring

    toml = priced(ladder_toml("http://127.0.0.1:9", entry("a", budget=2.5, budget_period=600, downgrade_at=0.8,
                                                         downgrade_to=TIERS[0]) + entry("b", key="other")))
    gateway = decode_config(toml).gateway
    a, b = Keyring(gateway.keys).tenants
    assert a.budget == Budget(2.5, 600, 0.8, TIERS[0]) and a.budget.per == "per 600 s" and b.budget is None


# --- downgrade ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("asked", "target", "served_on", "downgraded"), [
    ({"model": "cascade:best"}, "fast", TIERS[0], True),  # routed: served as the hint asks
    ({"model": "cascade", "quality": "fast"}, "fast", TIERS[0], False),  # asked for it already
    ({"model": TIERS[2]}, "fast", TIERS[2], False),  # a request naming its tier keeps it: a hint is for routing
    ({"model": TIERS[2]}, TIERS[0], TIERS[0], True),  # ... unless a cheaper tier is named
    ({"model": TIERS[0]}, TIERS[1], TIERS[0], False),  # never dearer
    ({"model": "cascade:best"}, TIERS[1], TIERS[1], True),
])
def test_past_downgrade_at_a_key_is_served_as_its_downgrade_target_with_a_note(
        asked: dict, target: str, served_on: str, downgraded: bool) -> None:
    caller = key(amount=1.0, downgrade_at=0.5, downgrade_to=target)
    clock = Clock()

    async def work(service: ChatService):
        ledger = on_clock(service, clock)
        before = await service.chat(request(**asked), caller=caller)
        ledger.take("acme", 1.0, 3600, 0.6)  # past half of it
        after = await service.chat(request(**asked), caller=caller)
        count = service.metrics.key_budget_downgraded.labels("acme")._value.get()
        routed = await service.route(request(**asked), caller=caller)  # /v1/route's decision
        return before, after, count, routed

    before, after, count, routed = with_service(work, rewrite=priced)
    assert isinstance(before, WholeReply) and isinstance(after, WholeReply)
    assert before.completion.cascade is not None and after.completion.cascade is not None
    assert after.completion.model == served_on and count == int(downgraded)
    note = after.completion.cascade.note or ""
    assert ("has spent 60% of its budget of 1 USD per hour (downgrade_at 0.5)" in note) == downgraded
    assert "downgrade" not in (before.completion.cascade.note or "")
    # /v1/route says the same of the same request (its note was dropped before issue 65 item 5)
    assert routed.tier_name == served_on and routed.note == after.completion.cascade.note


def test_without_prices_no_cost_is_counted_and_nothing_reserved() -> None:
    async def work(service: ChatService):
        reply = await service.chat(request(model=TIERS[0]), caller=key(amount=1.0))
        assert isinstance(reply, WholeReply) and reply.completion.cascade is not None
        assert isinstance(service.budgets.ledger, LocalLedger)
        return reply.completion.cascade.cost, service.budgets.ledger.read("acme", 3600).spent

    cost_field, spent = with_service(work)
    assert cost_field is None and spent == 0.0
