"""The chat service without the gateway's HTTP: ChatService called directly, in front of a real fake engine.

The same request path the HTTP tests cover, one pass each: prepare (validate, decide, check every reachable
tier), complete, open_stream. The upstream is the fake engine over real HTTP on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import msgspec
import pytest

from cascade.config import decode_config
from cascade.engines.fake_server import FakeEngine, FakeScript
from cascade.errors import BackendError, InvalidRequest, Overloaded
from cascade.gateway.metrics import GatewayMetrics
from cascade.gateway.service import ChatService, ServiceConfig
from cascade.schemas import ChatCompletionRequest
from cascade.testing import TIERS, ladder_toml, serve_asgi
from cascade.tiers import build_tiers
from tests.gateway.gateway_setup import user

T = TypeVar("T")


def request(**fields: object) -> ChatCompletionRequest:
    body = {"model": "cascade", "messages": user(), **fields}
    return msgspec.json.decode(msgspec.json.encode(body), type=ChatCompletionRequest)


SLOTTED_TOP = "branch_slots = 4\n"  # appended to the last tier of the ladder


def with_service(mode: str, work: Callable[[ChatService], Awaitable[T]], extra: str = "",
                 edit: Callable[[str], str] = lambda toml: toml) -> tuple[T, FakeEngine]:
    engine = FakeEngine(FakeScript(tokens=8))
    with serve_asgi(engine) as url:
        config = decode_config(edit(ladder_toml(url) + extra))

        async def run() -> T:
            tiers = build_tiers(config, {})
            service = ChatService(tiers, ServiceConfig.of(config, mode=mode), GatewayMetrics())
            try:
                return await work(service)
            finally:
                for tier in tiers:
                    await tier.backend.aclose()

        return asyncio.run(run()), engine


def test_route_mode_answers_on_the_routed_tier_in_one_pass() -> None:
    async def work(service: ChatService):
        req = request(model="cascade:fast")
        decision, max_tokens = service.prepare(req, None)
        return await service.complete(req, decision, max_tokens)

    completion, engine = with_service("route", work)
    assert completion.model == TIERS[0] and completion.cascade.router == "heuristic"
    assert completion.choices[0].finish_reason == "stop" and engine.stats.requests == 1


def test_cascade_mode_climbs_past_a_cut_off_answer() -> None:
    async def work(service: ChatService):
        req = request(model="cascade:balanced", messages=user("[fake@fake-0 tokens=100] What is 2 + 2?"))
        decision, max_tokens = service.prepare(req, None)
        return await service.complete(req, decision, max_tokens)

    completion, engine = with_service("cascade", work)
    assert completion.model == TIERS[1] and completion.cascade.escalations == 1
    assert engine.stats.requests == 2


def test_a_bad_branch_override_for_any_reachable_tier_fails_before_anything_is_sent() -> None:
    async def work(service: ChatService) -> InvalidRequest:
        # A streamed cascade request may reach every tier: 8 branches are fine on the first tiers, but the
        # top tier has 4 branch slots, so the request is refused before any tier is asked.
        req = request(model="cascade:balanced", stream=True, branches={"n": 8})
        with pytest.raises(InvalidRequest) as info:
            service.prepare(req, None)
        return info.value

    error, engine = with_service("cascade", work, SLOTTED_TOP)
    assert error.param == "branches.n" and "tier-large" in error.message and engine.stats.requests == 0


def test_a_named_tier_that_fails_is_not_answered_elsewhere() -> None:
    async def work(service: ChatService) -> BackendError:
        req = request(model=TIERS[1], messages=user("[fake@fake-1 status=500] hi"))
        decision, max_tokens = service.prepare(req, None)
        with pytest.raises(BackendError) as info:
            await service.complete(req, decision, max_tokens)
        return info.value

    _, engine = with_service("route", work)
    assert engine.stats.requests == 1


def test_a_stream_is_opened_before_its_frames_and_closes_its_upstream() -> None:
    async def work(service: ChatService) -> tuple[str, list[bytes], int]:
        req = request(model="cascade:fast", stream=True)
        decision, max_tokens = service.prepare(req, None)
        service.admit()
        try:
            decision, frames = await service.open_stream(req, decision, max_tokens)
            body = [frame async for frame in frames]
        finally:
            service.release()
        return decision.tier.name, body, service.admission.streams_open

    (tier, body, streams_open), engine = with_service("route", work)
    assert tier == TIERS[0] and body[-1].endswith(b"data: [DONE]\n\n") and streams_open == 0
    assert engine.stats.streams_finished == 1


def test_route_mode_falls_back_only_to_a_tier_that_can_serve_the_request_as_asked() -> None:
    # The middle tier has 4 branch slots: a request for 8 branches that falls back from the cheapest tier
    # skips it for the top tier instead of failing there with a 400 after the first tier's 502.
    slotted_middle = f'name = "{TIERS[1]}"\nbranch_slots = 4\n'

    async def work(service: ChatService):
        req = request(model="cascade:fast", messages=user("[fake@fake-0 status=500] hi"), branches={"n": 8})
        decision, max_tokens = service.prepare(req, None)
        return await service.complete(req, decision, max_tokens)

    completion, _ = with_service("route", work, edit=lambda toml: toml.replace(f'name = "{TIERS[1]}"\n', slotted_middle))
    assert completion.model == TIERS[2] and completion.cascade.fallback_from == TIERS[0]


ONE_SLOT = f'name = "{TIERS[0]}"\nbranch_slots = 1\n'  # the cheapest tier holds one upstream stream at a time


def one_slot(toml: str) -> str:
    return toml.replace(f'name = "{TIERS[0]}"\n', ONE_SLOT)


def test_a_streamed_single_branch_answer_holds_a_branch_slot_as_a_whole_answer_does() -> None:
    async def work(service: ChatService) -> tuple[int, list[str], int]:
        slots = service.tiers[0].slots
        assert slots is not None
        req = request(model=TIERS[0], stream=True, messages=user("[fake@fake-0 itl_ms=40] hi"))
        decision, max_tokens = service.prepare(req, None)
        _, frames = await service.open_stream(req, decision, max_tokens)
        try:
            body = [await anext(frames)]
            held = slots.free
            refused = []
            for stream in (True, False):  # a second request on the tier, streamed or whole: the same 429
                again = request(model=TIERS[0], stream=stream)
                decision, max_tokens = service.prepare(again, None)
                with pytest.raises(Overloaded) as info:
                    if stream:
                        await service.open_stream(again, decision, max_tokens)
                    else:
                        await service.complete(again, decision, max_tokens)
                refused.append(info.value.message)
            body += [frame async for frame in frames]
        finally:
            await frames.aclose()
        return held, refused, slots.free

    (held, refused, free), engine = with_service("route", work, "[gateway.limits]\nmax_slot_wait_s = 0.1\n",
                                                 edit=one_slot)
    assert held == 0 and free == 1 and engine.stats.requests == 1
    assert all("no 1 free branch slots within 0.1 s" in message for message in refused)


def test_a_stream_waiting_for_a_branch_slot_starts_once_the_stream_holding_it_closes() -> None:
    async def work(service: ChatService) -> tuple[bool, list[bytes], int]:
        first = request(model=TIERS[0], stream=True, messages=user("[fake@fake-0 itl_ms=20] hi"))
        decision, max_tokens = service.prepare(first, None)
        _, frames = await service.open_stream(first, decision, max_tokens)
        second = request(model=TIERS[0], stream=True)
        decision, max_tokens = service.prepare(second, None)
        waiting = asyncio.create_task(service.open_stream(second, decision, max_tokens))
        try:
            await anext(frames)
            await asyncio.sleep(0.2)
            waited = not waiting.done()
            [frame async for frame in frames]  # the first stream ends: its slot goes to the waiting one
            _, later = await waiting
            body = [frame async for frame in later]
        finally:
            await frames.aclose()
        slots = service.tiers[0].slots
        assert slots is not None
        return waited, body, slots.free

    (waited, body, free), engine = with_service("route", work, edit=one_slot)
    assert waited and body[-1].endswith(b"data: [DONE]\n\n") and free == 1
    assert engine.stats.streams_finished == 2
