"""The shared limits under Redis faults, each case with a real `redis-server` (issue 48, item 6): a place admitted
on this gateway's own count (Redis away, `failure = "open"`) is given back without freeing another request's
place; a token settle goes to the bucket that admitted the request, and a correction Redis may already have applied
is never sent twice; and `[gateway.redis] timeout_s` counts Redis's time, not the gateway's busy event loop.

Servers and helpers are those of tests/gateway/test_redis_limits.py: each test starts its own redis-server on a free
loopback port and kills it at the end.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cascade.config import Limits, decode_config
from cascade.errors import Overloaded
from cascade.service.admission import Admission
from cascade.service.metrics import GatewayMetrics
from cascade.service.redis.buckets import RedisRateLimiter, bucket
from cascade.service.redis.places import RedisPlaces, place_key
from cascade.service.redis.store import MAX_LAG_S, RETRY_S, RedisStore, StoreUnavailable, lua
from cascade.testing.servers import RedisServer, ladder_toml, redis_server
from cascade.tiers.build import build_tiers
from tests.gateway.test_redis_limits import (
    BOUND_S,
    FAILOVER_TIMEOUT_S,
    eventually_async,
    inspect,
    places,
    run,
    series,
    store,
    timed,
)

pytestmark = pytest.mark.timeout(60)
LEASE_S = 1.0  # a place nobody renews is gone this long after its last renewal


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server)")
    with redis_server(tmp_path) as server:
        yield server


def gateway(url: str, cap: int, metrics: GatewayMetrics | None = None) -> tuple[Admission, RedisPlaces]:
    """One gateway's admission on Redis, failing open within FAILOVER_TIMEOUT_S (ladder_toml's tiers, not served)."""
    tiers = build_tiers(decode_config(ladder_toml("http://127.0.0.1:9")), {})
    shared = places(store(url, "open", metrics, timeout_s=FAILOVER_TIMEOUT_S), lease_s=LEASE_S)
    return Admission(tiers, Limits(max_in_flight=cap), GatewayMetrics(), shared=shared), shared


def live_places(server: RedisServer, scope: str = "gateway") -> set[str]:
    """The members of a scope whose lease has not ended, by the Redis server's clock."""
    with inspect(server) as client:
        seconds, micros = client.time()
        return set(client.zrangebyscore(place_key(scope), seconds * 1000 + micros // 1000, "+inf"))


# --- a place admitted while Redis was away --------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["hung", "killed"])
def test_a_fail_open_place_given_back_after_redis_returns_frees_no_other_requests_place(redis, fault) -> None:
    async def work():
        a, a_places = gateway(redis.url, cap=3)
        await a.admit()
        await a.admit()  # two requests hold a place in Redis
        held = list(a_places.held["gateway"])
        if fault == "hung":
            redis.pause()  # the take is written to the socket, and runs when Redis resumes
            opened = await timed(a.admit())
            redis.resume()
        else:
            redis.kill()
            opened = await timed(a.admit())
            redis.start()  # empty: a's heartbeat adds its two places back
        back = await eventually_async(lambda: asyncio.sleep(0.05, live_places(redis)), lambda live: live >= set(held))
        await asyncio.sleep(RETRY_S)  # the store tries Redis again
        before = live_places(redis)
        a.release()  # the request admitted on the gateway's own count ends
        await a_places.store.flush()
        right_after = live_places(redis)
        await asyncio.sleep(LEASE_S + 0.3)  # past a lease: only the places renewed by a's heartbeat are left
        after = live_places(redis)
        b, _ = gateway(redis.url, cap=3)
        await b.admit()  # the third place
        refused = await timed(b.admit())
        return opened, back, held, before, right_after, after, refused

    (opened, took_s), back, held, before, right_after, after, (refused, _) = run(work)
    assert opened is None and took_s < BOUND_S and back  # admitted on the gateway's own count
    # Hung, Redis ran the take it had received when it resumed: a member nobody renews, which the give removed.
    assert len(before - set(held)) == (1 if fault == "hung" else 0)
    assert right_after == after == set(held)  # both requests' places intact, and no other
    assert isinstance(refused, Overloaded)  # 2 + 1 of 3: the shared count is exact


# --- a token settle goes to the bucket that admitted -----------------------------------------------------------


def test_a_request_admitted_on_local_buckets_settles_there_when_redis_is_back(redis) -> None:
    async def work():
        limiter = RedisRateLimiter(store(redis.url, "open", timeout_s=FAILOVER_TIMEOUT_S))
        redis.kill()
        admitted = await limiter.acquire("team-a", 0, 600, 500)  # this gateway's bucket: 100 left
        redis.start()
        await asyncio.sleep(RETRY_S)
        limiter.settle("team-a", 600, reserved=500, used=100, admitted=admitted)  # 400 back
        await limiter.store.flush()
        with inspect(redis) as client:
            in_redis = client.exists(bucket("team-a", "tokens"))
        return admitted, in_redis, limiter.fallback.take("team-a", 0, 600, 500)

    admitted, in_redis, local_after = run(work)
    assert admitted.refused is None and not admitted.shared and admitted.tokens.remaining == 100
    assert not in_redis  # Redis's bucket never reserved them: untouched
    assert local_after.refused is None  # 100 + 400 back


def test_a_settle_redis_could_not_take_is_applied_when_redis_is_back(redis) -> None:
    async def work():
        limiter = RedisRateLimiter(store(redis.url, "open", timeout_s=FAILOVER_TIMEOUT_S))
        admitted = await limiter.acquire("team-a", 0, 600, 100)  # in Redis
        redis.kill()
        probe = await limiter.acquire("team-b", 0, 600, 1)  # fails: for RETRY_S the store does not try Redis
        limiter.settle("team-a", 600, reserved=100, used=400, admitted=admitted)  # a debt of 300, never sent
        await limiter.store.flush()
        owed = limiter.owed()
        redis.start()  # empty: the bucket is full again, less the debt once it is paid
        with inspect(redis) as client:
            paid = await eventually_async(lambda: asyncio.sleep(0.1, client.hget(bucket("team-a", "tokens"), "level")),
                                          lambda level: level is not None)
            level = float(client.hget(bucket("team-a", "tokens"), "level") or 0)
        return admitted, probe, owed, paid, level, limiter.owed(), limiter.fallback.take("team-a", 0, 600, 600)

    admitted, probe, owed, paid, level, owed_after, local = run(work)
    assert admitted.shared and not probe.shared
    assert owed == {"team-a": -300} and paid and owed_after == {}
    assert level == pytest.approx(300, abs=20)  # 600 - 300, once
    assert local.refused is None  # this gateway's own bucket never saw the request


def test_a_settle_sent_to_a_hung_redis_is_dropped_and_counted_never_applied_twice(redis) -> None:
    async def work():
        limiter = RedisRateLimiter(store(redis.url, "open", timeout_s=FAILOVER_TIMEOUT_S))
        first = await limiter.acquire("team-a", 0, 600, 200)
        limiter.settle("team-a", 600, reserved=200, used=100, admitted=first)  # Redis knows the script now
        await limiter.store.flush()
        admitted = await limiter.acquire("team-a", 0, 600, 100)  # 400 left in Redis
        redis.pause()
        try:
            limiter.settle("team-a", 600, reserved=100, used=400, admitted=admitted)  # sent, no answer
            await limiter.store.flush()
        finally:
            redis.resume()  # Redis runs the settle it had received
        await asyncio.sleep(3 * RETRY_S)  # a retry would have been sent by now
        with inspect(redis) as client:
            level = float(client.hget(bucket("team-a", "tokens"), "level") or 0)
        assert limiter.store.series.settles_dropped._value.get() == limiter.dropped_settles
        return limiter.dropped_settles, limiter.owed(), level

    dropped, owed, level = run(work)
    assert dropped == 1 and owed == {}
    assert level == pytest.approx(100, abs=30)  # 400 - 300 by Redis itself (and a little refill), not twice


# --- the timeout counts Redis's time, not the gateway's loop ---------------------------------------------------

LOOP_BUSY_S = 0.8  # the gateway's loop runs CPU work this long without yielding (> 3 timeouts)


def spin(seconds: float) -> None:
    """CPU work on the event loop's thread that never yields (no sleep: the GIL is handed over as under load)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


async def call_through_a_busy_loop(shared: RedisStore) -> tuple[object, float]:
    call = asyncio.ensure_future(timed(shared.run("acquire", lua("return 1"), [], [])))
    await asyncio.sleep(0)  # the call starts (and sends), then the loop is busy
    spin(LOOP_BUSY_S)
    return await call


def test_a_busy_event_loop_does_not_time_out_redis_calls_answered_in_time(redis) -> None:
    metrics = GatewayMetrics()

    async def work():
        shared = store(redis.url, "closed", metrics, timeout_s=FAILOVER_TIMEOUT_S)
        return [await call_through_a_busy_loop(shared) for _ in range(3)]

    calls = run(work)
    assert [result for result, _ in calls] == [1, 1, 1]  # 3 timeouts of loop lag each: none counted against Redis
    assert series(metrics, "cascade_redis_errors_total") == 0


def test_a_hung_redis_still_fails_within_the_timeout_plus_the_loops_lag(redis) -> None:
    async def work():
        shared = store(redis.url, "closed", timeout_s=FAILOVER_TIMEOUT_S)
        await shared.run("ping", lua("return 1"), [], [])
        redis.pause()
        try:
            busy = await call_through_a_busy_loop(shared)
            await asyncio.sleep(RETRY_S)
            idle = await timed(shared.run("acquire", lua("return 1"), [], []))
        finally:
            redis.resume()
        return busy, idle

    (busy, busy_s), (idle, idle_s) = run(work)
    assert isinstance(busy, StoreUnavailable) and busy_s < LOOP_BUSY_S + 0.5  # failed once the loop was free
    assert isinstance(idle, StoreUnavailable) and FAILOVER_TIMEOUT_S * 0.9 < idle_s < FAILOVER_TIMEOUT_S + 0.4


def test_a_hung_redis_on_a_loop_that_stays_busy_fails_at_most_max_lag_past_the_timeout(redis) -> None:
    async def busy_loop(until_s: float) -> None:  # CPU work in 100 ms slices, yielding between them
        while time.monotonic() < until_s:
            spin(0.1)
            await asyncio.sleep(0)

    async def work():
        shared = store(redis.url, "closed", timeout_s=FAILOVER_TIMEOUT_S)
        await shared.run("ping", lua("return 1"), [], [])
        redis.pause()
        try:
            loop_busy = asyncio.ensure_future(busy_loop(time.monotonic() + FAILOVER_TIMEOUT_S + MAX_LAG_S + 1.5))
            call = await timed(shared.run("acquire", lua("return 1"), [], []))
            await loop_busy
        finally:
            redis.resume()
        return call

    result, took_s = run(work)
    assert isinstance(result, StoreUnavailable)
    assert FAILOVER_TIMEOUT_S + MAX_LAG_S <= took_s < FAILOVER_TIMEOUT_S + MAX_LAG_S + 1.0  # not when the loop frees
