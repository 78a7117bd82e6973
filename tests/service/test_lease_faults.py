"""The lease under injected faults: whatever raises at whichever await point of a request (or in a settle after it),
every place, permit and reservation the request took is given back exactly once.

The service is built as the gateway builds it, over a fake engine on 127.0.0.1, with its shared places, token
buckets and budget ledger replaced by counting versions of the real ones that raise at the k-th point a request
passes (hypothesis picks k, the exception, whole or streamed, the engine's own fault and where the client reads to).
After the request every count is back where it started: no place held or given twice, every reservation settled
once (a key's tokens and budget), and the key may make its next request.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections import Counter
from collections.abc import Iterator

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cascade.config import decode_config
from cascade.errors import BackendFailed, CascadeError, LimitsUnavailable
from cascade.schemas import ChatCompletionRequest
from cascade.service.chat import ChatService, ServiceConfig, StreamReply
from cascade.service.keys.budget import Budget, Standing
from cascade.service.keys.budgets import LocalLedger
from cascade.service.keys.ratelimit import Allowance, LocalRateLimiter
from cascade.service.keys.tenant import Tenant
from cascade.service.metrics import GatewayMetrics
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript
from cascade.testing.servers import TIERS, ladder_toml
from cascade.tiers.build import build_tiers
from tests.branches.test_hostile_engines import stream_with_usage
from tests.branches.test_http_stream import read_request, with_raw_server
from tests.service.pricing import priced

CALLER = Tenant("acme", hashlib.sha256(b"acme").digest(), requests_per_minute=10_000, tokens_per_minute=10_000_000,
                max_in_flight=1, budget=Budget(1e6, 0))


class Injected(Exception):
    """The fault a test injects."""


class Faults:
    """Counts the points a request passes; raises `exc` at the `at`-th (0: the first)."""

    def __init__(self, at: int, exc: type[BaseException]) -> None:
        self.at, self.exc, self.passed = at, exc, 0

    def point(self, where: str, *, sync: bool = False) -> None:
        passed, self.passed = self.passed, self.passed + 1
        if passed == self.at:
            exc = Injected if sync and self.exc is asyncio.CancelledError else self.exc
            raise exc(f"injected at {where}")

    async def await_point(self, where: str) -> None:
        await asyncio.sleep(0)
        self.point(where)


class CountingPlaces:
    """Shared places (admission's and the key's in-flight) that count what is held per scope."""

    def __init__(self, faults: Faults) -> None:
        self.faults, self.held, self.twice = faults, Counter[str](), []

    async def take(self, scope: str, cap: int) -> bool:
        await self.faults.await_point(f"take {scope}")
        if self.held[scope] >= cap:
            return False
        self.held[scope] += 1
        return True

    def give(self, scope: str) -> None:  # the real one never raises (it is a background call)
        if self.held[scope] <= 0:
            self.twice.append(scope)
        self.held[scope] -= 1


class CountingLimiter(LocalRateLimiter):
    def __init__(self, faults: Faults) -> None:
        super().__init__(clock=lambda: 0.0)
        self.faults, self.acquired, self.settled = faults, 0, 0

    async def acquire(self, key: str, rpm: int, tpm: int, tokens: int) -> Allowance:
        await self.faults.await_point("acquire")
        allowance = self.take(key, rpm, tpm, tokens)
        self.acquired += allowance.refused is None
        return allowance

    def settle(self, key: str, tpm: int, reserved: int, used: int, admitted: Allowance | None = None) -> None:
        self.settled += 1
        super().settle(key, tpm, reserved, used, admitted)
        self.faults.point("settle tokens", sync=True)  # after its work: a metric or a log call that raised


class CountingLedger(LocalLedger):
    def __init__(self, faults: Faults) -> None:
        super().__init__(clock=lambda: 0.0)
        self.faults, self.reserved, self.settled = faults, 0, 0

    async def reserve(self, key: str, budget: float, period_s: int, amount: float) -> Standing:
        await self.faults.await_point("reserve budget")
        standing = self.take(key, budget, period_s, amount)
        self.reserved += standing.admitted
        return standing

    def settle(self, key: str, standing: Standing, correction: float) -> None:
        self.settled += 1
        super().settle(key, standing, correction)
        self.faults.point("settle budget", sync=True)

    async def standing(self, key: str, period_s: int) -> Standing:
        await self.faults.await_point("budget standing")
        return self.read(key, period_s)


@pytest.fixture(scope="module")
def engine_url() -> Iterator[str]:
    with serve_asgi(FakeEngine(FakeScript(tokens=6))) as url:
        yield url


def _request(directive: str, stream: bool) -> ChatCompletionRequest:
    body = {"model": TIERS[0], "stream": stream, "max_tokens": 32,
            "messages": [{"role": "user", "content": f"{directive} What is 2 + 2?"}]}
    return msgspec.json.decode(msgspec.json.encode(body), type=ChatCompletionRequest)


async def _one_request(service: ChatService, req: ChatCompletionRequest, read_frames: int,
                       caller: Tenant = CALLER) -> None:
    reply = await service.chat(req, caller=caller)
    if isinstance(reply, StreamReply):
        try:
            for _ in range(read_frames):
                await anext(reply.frames)
        except StopAsyncIteration:
            pass
        finally:
            await reply.frames.aclose()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(at=st.integers(0, 14), exc=st.sampled_from([Injected, BackendFailed, LimitsUnavailable, asyncio.CancelledError]),
       stream=st.booleans(), engine=st.sampled_from(["", "[fake fault=truncated]", "[fake status=500]",
                                                     "[fake fault=malformed_sse]"]),
       read_frames=st.integers(0, 12))
def test_a_fault_at_any_point_of_a_request_gives_back_every_place_and_reservation_exactly_once(
        engine_url: str, at: int, exc: type[BaseException], stream: bool, engine: str, read_frames: int) -> None:
    faults = Faults(at, exc)
    places, limiter, ledger = CountingPlaces(faults), CountingLimiter(faults), CountingLedger(faults)

    async def run() -> None:
        config = decode_config(priced(ladder_toml(engine_url)))
        tiers = build_tiers(config, {})
        service = ChatService(tiers, ServiceConfig.of(config), GatewayMetrics(), places=places, limiter=limiter,
                              ledger=ledger)
        try:
            with contextlib.suppress(Injected, CascadeError, asyncio.CancelledError):
                await _one_request(service, _request(engine, stream), read_frames)
            admission = service.admission
            assert admission.in_flight == 0 and admission.streams_open == 0 and not any(admission.tier_load)
            assert service.tenants.in_flight == {}
            assert not places.twice and all(v == 0 for v in places.held.values()), places.held
            assert limiter.settled == limiter.acquired, (limiter.acquired, limiter.settled)
            assert ledger.settled <= ledger.reserved
            # The key may ask again: its in-flight place came back (max_in_flight = 1).
            faults.at = -1
            await _one_request(service, _request("", stream), 100)
            assert service.tenants.in_flight == {} and all(v == 0 for v in places.held.values())
        finally:
            for tier in tiers:
                await tier.backend.aclose()

    asyncio.run(run())


@pytest.mark.parametrize("stream", [False, True])
def test_an_engine_that_lies_about_usage_fails_its_answer_bills_the_reservation_and_leaks_no_place(
        stream: bool) -> None:
    """A negative prompt count once made a 500 and held the key's only in-flight place for good (every later request
    was a 429); a count of 10^12 was billed as such. Now the count is an engine fault: the answer fails, the key pays
    at most its reservation, and its next request is served."""
    caller = Tenant("acme", hashlib.sha256(b"acme").digest(), tokens_per_minute=100_000, max_in_flight=1)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(stream_with_usage(-5, 1))
        await writer.drain()
        writer.close()

    levels: list[float] = []

    async def body(url: str) -> None:
        config = decode_config(ladder_toml(url))
        tiers = build_tiers(config, {})
        limiter = LocalRateLimiter(clock=lambda: 0.0)
        service = ChatService(tiers, ServiceConfig.of(config), GatewayMetrics(), limiter=limiter)
        try:
            for _ in range(2):  # the second is served like the first: nothing was left held
                with contextlib.suppress(CascadeError):
                    await _one_request(service, _request("", stream), 100, caller)
                assert service.tenants.in_flight == {} and service.admission.in_flight == 0
                levels.append(limiter.take("acme", 0, 100_000, 0).tokens.remaining)
        finally:
            for tier in tiers:
                await tier.backend.aclose()

    before = 100_000
    asyncio.run(with_raw_server(handler, body))
    reservation = before - levels[0]
    assert 0 < reservation < 2_000 and levels[1] == before - 2 * reservation  # each billed at most its reservation
