"""The keys' budgets in a real Redis (cascade/service/redis/ledger.py): many concurrent requests of one key through
two gateways overspend its budget by one request's worst case at most; the window is the server's (its Lua `window`
is budgets.py's, calendar months included: hypothesis); the period resets; a settle names its window; Redis away:
fail open on each gateway's own ledger or closed with a 503, and a settle Redis could not take is sent again.

Servers and helpers are tests/gateway/test_redis_limits.py's: each test starts its own redis-server on a free
loopback port and kills it at the end (skipped without the binary).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cascade.config import decode_config
from cascade.errors import LimitsUnavailable, QuotaExceeded
from cascade.schemas import ChatCompletionRequest
from cascade.service.chat import ChatService, ServiceConfig, WholeReply
from cascade.service.keys.budget import PERIOD_S, Budget, window
from cascade.service.keys.reservation import estimate_prompt_tokens, estimate_tokens
from cascade.service.keys.tenant import Tenant
from cascade.service.metrics import GatewayMetrics
from cascade.service.redis.ledger import WINDOW, RedisLedger, ledger_key
from cascade.service.redis.store import RETRY_S, lua
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript
from cascade.testing.servers import TIERS, ladder_toml
from cascade.tiers.build import build_tiers
from tests.gateway.test_redis_limits import (  # noqa: F401 (the `redis` fixture)
    FAILOVER_TIMEOUT_S,
    eventually_async,
    inspect,
    redis,
    run,
    series,
    store,
)
from tests.service.pricing import priced

pytestmark = pytest.mark.timeout(120)


def budgeted(amount: float, period_s: int = 3600) -> Tenant:
    return Tenant("team-a", hashlib.sha256(b"team-a").digest(), budget=Budget(amount, period_s))


# --- the window is the server's, and budgets.py's ----------------------------------------------------------------

_LUA_WINDOW = lua(WINDOW + "local a, b = window(tonumber(ARGV[1]), tonumber(ARGV[2])) return {num(a), num(b)}")


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(now=st.one_of(st.integers(min_value=0, max_value=2**34),
                     st.sampled_from([951_782_400, 951_868_799, 951_868_800, 4_107_542_400, 1_735_689_599])),
       period_s=st.one_of(st.sampled_from(sorted(PERIOD_S.values())), st.integers(min_value=1, max_value=31_622_400)))
def test_the_lua_window_is_the_python_window(redis, now: int, period_s: int) -> None:  # noqa: F811
    client = inspect(redis)
    start, end = client.eval(_LUA_WINDOW.source, 0, now, period_s)
    assert (int(float(start)), int(float(end))) == window(period_s, now)


# --- two gateways, one budget -----------------------------------------------------------------------------------


def test_concurrent_requests_of_one_key_through_two_gateways_overspend_by_one_worst_case_at_most(redis) -> None:  # noqa: F811
    caller = budgeted(5e-3)  # about 7 requests' worst cases on the middle tier, 19 requests' costs
    body = {"model": TIERS[1], "messages": [{"role": "user", "content": "[fake@fake-1 itl_ms=5] hi"}]}

    async def work():
        with serve_asgi(FakeEngine(FakeScript(tokens=8))) as url:
            config = decode_config(priced(ladder_toml(url)))
            ledgers = [RedisLedger(store(redis.url)) for _ in range(2)]  # two gateways: a store each
            gateways = [ChatService(build_tiers(config, {}), ServiceConfig.of(config), GatewayMetrics(), ledger=ledger)
                        for ledger in ledgers]
            req = msgspec.convert(body, type=ChatCompletionRequest)

            async def one(i: int) -> float | None:
                try:
                    reply = await gateways[i % 2].chat(req, caller=caller)
                except QuotaExceeded:
                    return None
                assert isinstance(reply, WholeReply) and reply.completion.cascade is not None
                assert reply.completion.cascade.cost is not None
                return reply.completion.cascade.cost.total

            try:
                costs: list[float | None] = []
                for _ in range(30):  # waves, each finding the last one's reservations settled, until none is served
                    wave = await asyncio.gather(*(one(i) for i in range(40)))
                    costs += wave
                    for ledger in ledgers:
                        await ledger.store.flush()
                    if not any(wave):
                        break
                spent = await ledgers[0].standing("team-a", 3600)
            finally:
                for service in gateways:
                    for tier in service.tiers:
                        await tier.backend.aclose()
            prices = gateways[0].budgets.prices
            assert prices is not None
            prompt = estimate_prompt_tokens(req)
            return costs, spent, prices.worst_case([TIERS[1]], prompt, estimate_tokens(req, 1, 32) - prompt)

    costs, spent, worst = run(work)
    served = [c for c in costs if c is not None]
    assert 1 < len(served) < len(costs) and costs[-1] is None
    assert sum(served) <= 5e-3 + worst  # the last one admitted took it over, by its cost at most
    assert sum(served) >= 5e-3  # and only then were all refused
    assert spent.spent == pytest.approx(sum(served), rel=1e-9)  # every reservation settled to its cost, in Redis


# --- windows in Redis -------------------------------------------------------------------------------------------


def test_a_budget_resets_with_its_period_and_a_settle_after_it_changes_nothing(redis) -> None:  # noqa: F811
    async def work():
        ledger = RedisLedger(store(redis.url))
        first = await ledger.reserve("k", 1.0, 2, 1.0)  # a 2-second period
        refused = await ledger.reserve("k", 1.0, 2, 0.1)
        ttl_ms = inspect(redis).pttl(ledger_key("k"))
        await asyncio.sleep(max(0.0, first.end - time.time()) + 0.05)
        fresh = await ledger.reserve("k", 1.0, 2, 0.25)
        ledger.settle("k", first, -1.0)  # the first window's refund: gone with it
        await ledger.store.flush()
        return first, refused, ttl_ms, fresh, await ledger.standing("k", 2)

    first, refused, ttl_ms, fresh, now = run(work)
    assert first.admitted and first.shared and first.end - first.start == 2
    assert not refused.admitted and refused.spent == 1.0 and refused.end == first.end
    assert 0 < ttl_ms <= 3000  # the hash expires when its window ends (and a second)
    assert fresh.admitted and fresh.start >= first.end and fresh.spent == 0.25
    assert now.spent == 0.25


def test_the_budget_hash_is_namespaced_per_key_in_a_cluster_hash_tag(redis) -> None:  # noqa: F811
    async def work():
        await RedisLedger(store(redis.url)).reserve("team-a", 1.0, 3600, 0.5)

    run(work)
    assert inspect(redis).keys("cascade:*") == ["cascade:budget:{team-a}"]


# --- Redis away -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("failure", ["open", "closed"])
def test_redis_killed_budgets_fail_open_on_the_gateways_own_ledger_or_closed(redis, failure: str) -> None:  # noqa: F811
    metrics = GatewayMetrics()

    async def work():
        ledger = RedisLedger(store(redis.url, failure, metrics, timeout_s=FAILOVER_TIMEOUT_S))
        shared = await ledger.reserve("k", 1.0, 3600, 0.5)
        redis.kill()
        try:
            local = await ledger.reserve("k", 1.0, 3600, 0.5)
        except LimitsUnavailable as exc:
            return shared, exc, ledger
        ledger.settle("k", local, -0.25)  # to the ledger that reserved it
        return shared, local, ledger

    shared, local, ledger = run(work)
    assert shared.shared and shared.spent == 0.5
    if failure == "closed":
        assert isinstance(local, LimitsUnavailable)
        assert series(metrics, "cascade_redis_fail_closed_total") == 1
    else:
        assert not local.shared and local.admitted and local.spent == 0.5  # this gateway's own count, from zero
        assert ledger.fallback.read("k", 3600).spent == 0.25
        assert series(metrics, "cascade_redis_fail_open_total") == 1


def test_a_settle_redis_could_not_take_is_sent_again_once_it_answers(redis) -> None:  # noqa: F811
    async def work():
        ledger = RedisLedger(store(redis.url, timeout_s=FAILOVER_TIMEOUT_S))
        reserved = await ledger.reserve("k", 10.0, 3600, 4.0)
        redis.pause()
        with contextlib.suppress(Exception):
            await ledger.standing("k", 3600)  # times out: for RETRY_S the store fails calls without sending them
        ledger.settle("k", reserved, -3.0)  # never sent: owed
        await asyncio.sleep(0)
        owed = ledger.owed()
        redis.resume()
        repaid = await eventually_async(lambda: ledger.standing("k", 3600), lambda s: s.spent == 1.0,
                                        within_s=10 * RETRY_S + 5)
        return owed, repaid, ledger.dropped_settles

    owed, repaid, dropped = run(work)
    assert owed == {"k": -3.0} and repaid and dropped == 0
