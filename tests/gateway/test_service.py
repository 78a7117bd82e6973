"""The chat service without the gateway's HTTP: ChatService called directly, in front of a real fake engine.

The same request path the HTTP tests cover, one entry each (`chat`: validate, decide, check every reachable tier,
admit, serve; `route`: the decision alone), and the request's place given back however it ends. The upstream is the
fake engine over real HTTP on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import msgspec
import pytest

from cascade.config import decode_config
from cascade.errors import BackendError, InvalidRequest, Overloaded
from cascade.schemas import ChatCompletion, ChatCompletionRequest
from cascade.service.chat import ChatService, StreamReply, WholeReply
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript
from cascade.testing.servers import TIERS, ladder_toml
from tests.gateway.gateway_setup import on_service, user

T = TypeVar("T")


def request(**fields: object) -> ChatCompletionRequest:
    body = {"model": "cascade", "messages": user(), **fields}
    return msgspec.json.decode(msgspec.json.encode(body), type=ChatCompletionRequest)


SLOTTED_TOP = "branches = { slots = 4 }\n"  # appended to the last tier of the ladder


def with_service(mode: str, work: Callable[[ChatService], Awaitable[T]], extra: str = "",
                 edit: Callable[[str], str] = lambda toml: toml) -> tuple[T, FakeEngine]:
    engine = FakeEngine(FakeScript(tokens=8))
    with serve_asgi(engine) as url:
        return on_service(decode_config(edit(ladder_toml(url) + extra)), mode, work), engine


async def whole(service: ChatService, req: ChatCompletionRequest) -> ChatCompletion:
    reply = await service.chat(req)
    assert isinstance(reply, WholeReply)
    return reply.completion


async def streamed(service: ChatService, req: ChatCompletionRequest) -> StreamReply:
    reply = await service.chat(req)
    assert isinstance(reply, StreamReply)
    return reply


class Left:
    """A client that has left."""

    gone = True


def disconnects(service: ChatService) -> float:
    return sum(sample.value for metric in service.metrics.disconnects.collect() for sample in metric.samples
               if sample.name.endswith("_total"))


def test_route_mode_answers_on_the_routed_tier_in_one_pass() -> None:
    async def work(service: ChatService):
        req = request(model="cascade:fast")
        return await whole(service, req)

    completion, engine = with_service("route", work)
    assert completion.model == TIERS[0] and completion.cascade.router == "heuristic"
    assert completion.choices[0].finish_reason == "stop" and engine.stats.requests == 1


def test_cascade_mode_climbs_past_a_cut_off_answer() -> None:
    async def work(service: ChatService):
        req = request(model="cascade:balanced", messages=user("[fake@fake-0 tokens=100] What is 2 + 2?"))
        return await whole(service, req)

    completion, engine = with_service("cascade", work)
    assert completion.model == TIERS[1] and completion.cascade.escalations == 1
    assert engine.stats.requests == 2


def test_a_bad_branch_override_for_any_reachable_tier_fails_before_anything_is_sent() -> None:
    async def work(service: ChatService) -> InvalidRequest:
        # A streamed cascade request may reach every tier: 8 branches are fine on the first tiers, but the
        # top tier has 4 branch slots, so the request is refused before any tier is asked.
        req = request(model="cascade:balanced", stream=True, branches={"n": 8})
        with pytest.raises(InvalidRequest) as info:
            await service.chat(req)
        assert service.admission.in_flight == 0
        return info.value

    error, engine = with_service("cascade", work, SLOTTED_TOP)
    assert error.param == "branches.n" and "tier-large" in error.message and engine.stats.requests == 0


def test_a_named_tier_that_fails_is_not_answered_elsewhere() -> None:
    async def work(service: ChatService) -> BackendError:
        req = request(model=TIERS[1], messages=user("[fake@fake-1 status=500] hi"))
        with pytest.raises(BackendError) as info:
            await service.chat(req)
        assert service.admission.in_flight == 0 and service.admission.streams_open == 0
        return info.value

    _, engine = with_service("route", work)
    assert engine.stats.requests == 1


def test_a_stream_is_opened_before_its_frames_and_closes_its_upstream() -> None:
    async def work(service: ChatService) -> tuple[str, list[bytes], int]:
        req = request(model="cascade:fast", stream=True)
        reply = await streamed(service, req)
        held = service.admission.in_flight
        body = [reply.first, *[frame async for frame in reply.frames]]
        return reply.tier, body, (held, service.admission.in_flight, service.admission.streams_open)

    (tier, body, admission), engine = with_service("route", work)
    assert tier == TIERS[0] and body[-1].endswith(b"data: [DONE]\n\n") and admission == (1, 0, 0)
    assert engine.stats.streams_finished == 1


def test_route_mode_falls_back_only_to_a_tier_that_can_serve_the_request_as_asked() -> None:
    # The middle tier has 4 branch slots: a request for 8 branches that falls back from the cheapest tier
    # skips it for the top tier instead of failing there with a 400 after the first tier's 502.
    slotted_middle = f'name = "{TIERS[1]}"\nbranches = {{ slots = 4 }}\n'

    async def work(service: ChatService):
        req = request(model="cascade:fast", messages=user("[fake@fake-0 status=500] hi"), branches={"n": 8})
        return await whole(service, req)

    completion, _ = with_service("route", work, edit=lambda toml: toml.replace(f'name = "{TIERS[1]}"\n', slotted_middle))
    assert completion.model == TIERS[2] and completion.cascade.fallback_from == TIERS[0]


ONE_SLOT = f'name = "{TIERS[0]}"\nbranches = {{ slots = 1 }}\n'  # the cheapest tier holds one upstream stream at a time


def one_slot(toml: str) -> str:
    return toml.replace(f'name = "{TIERS[0]}"\n', ONE_SLOT)


def test_a_streamed_single_branch_answer_holds_a_branch_slot_as_a_whole_answer_does() -> None:
    async def work(service: ChatService) -> tuple[int, list[str], int]:
        slots = service.tiers[0].slots
        assert slots is not None
        req = request(model=TIERS[0], stream=True, messages=user("[fake@fake-0 itl_ms=40] hi"))
        reply = await streamed(service, req)
        try:
            held = slots.free
            refused = []
            for stream in (True, False):  # a second request on the tier, streamed or whole: the same 429
                with pytest.raises(Overloaded) as info:
                    await service.chat(request(model=TIERS[0], stream=stream))
                refused.append(info.value.message)
            [frame async for frame in reply.frames]
        finally:
            await reply.frames.aclose()
        return held, refused, slots.free

    (held, refused, free), engine = with_service("route", work, "[gateway.limits]\nmax_slot_wait_s = 0.1\n",
                                                 edit=one_slot)
    assert held == 0 and free == 1 and engine.stats.requests == 1
    assert all("no 1 free branch slots within 0.1 s" in message for message in refused)


def test_a_stream_waiting_for_a_branch_slot_starts_once_the_stream_holding_it_closes() -> None:
    async def work(service: ChatService) -> tuple[bool, list[bytes], int]:
        first = request(model=TIERS[0], stream=True, messages=user("[fake@fake-0 itl_ms=20] hi"))
        reply = await streamed(service, first)
        waiting = asyncio.create_task(streamed(service, request(model=TIERS[0], stream=True)))
        try:
            await asyncio.sleep(0.2)
            waited = not waiting.done()
            [frame async for frame in reply.frames]  # the first stream ends: its slot goes to the waiting one
            later = await waiting
            body = [later.first, *[frame async for frame in later.frames]]
        finally:
            await reply.frames.aclose()
        slots = service.tiers[0].slots
        assert slots is not None
        return waited, body, slots.free

    (waited, body, free), engine = with_service("route", work, edit=one_slot)
    assert waited and body[-1].endswith(b"data: [DONE]\n\n") and free == 1
    assert engine.stats.streams_finished == 2


def test_a_stream_the_client_abandons_mid_way_gives_its_place_and_upstream_back() -> None:
    async def work(service: ChatService) -> tuple[int, tuple[int, int, int], float]:
        req = request(model=TIERS[0], stream=True, messages=user("[fake@fake-0 tokens=2000 itl_ms=5] hi"))
        reply = await service.chat(req, client=Left())
        assert isinstance(reply, StreamReply)
        await anext(reply.frames)
        held = service.admission.in_flight
        await reply.frames.aclose()  # what the route does when the client leaves mid-stream
        slots = service.tiers[0].slots
        assert slots is not None
        return held, (service.admission.in_flight, service.admission.streams_open, slots.free), disconnects(service)

    (held, after, gone), _ = with_service("route", work, edit=one_slot)
    assert held == 1 and after == (0, 0, 1) and gone == 1


def test_a_whole_answer_cancelled_when_the_client_leaves_gives_its_place_back_and_counts_once() -> None:
    async def work(service: ChatService) -> tuple[int, int, float]:
        req = request(model=TIERS[0], messages=user("[fake@fake-0 itl_ms=50] hi"))  # 32 tokens: 1.6 s
        task = asyncio.create_task(service.chat(req, client=Left()))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return service.admission.in_flight, service.admission.streams_open, disconnects(service)

    (in_flight, streams_open, gone), _ = with_service("route", work)
    assert (in_flight, streams_open, gone) == (0, 0, 1)


def test_a_stream_whose_upstream_fails_before_any_token_gives_its_place_back() -> None:
    async def work(service: ChatService) -> tuple[int, int, float]:
        req = request(model=TIERS[1], stream=True, messages=user("[fake@fake-1 status=500] hi"))
        with pytest.raises(BackendError):
            await service.chat(req, client=Left())
        return service.admission.in_flight, service.admission.streams_open, disconnects(service)

    assert with_service("route", work)[0] == (0, 0, 0)  # a fault is not a disconnect


def test_the_route_entry_decides_without_serving_or_admitting() -> None:
    async def work(service: ChatService) -> tuple[str, int]:
        decision = await service.route(request(model="cascade:fast"))
        return decision.tier_name, service.admission.in_flight

    (tier, in_flight), engine = with_service("route", work)
    assert tier == TIERS[0] and in_flight == 0 and engine.stats.requests == 0


def test_a_streamed_route_mode_fallback_to_a_tier_with_branches_is_voted_and_sent_whole() -> None:
    # As a stream asked of a branched tier: the fallback's branches vote, and the answer goes out as one SSE body.
    branched_middle = f'name = "{TIERS[1]}"\nbranches = {{ n = 3, m = 3 }}\n'

    async def work(service: ChatService) -> tuple[str, dict[str, object], int]:
        req = request(model="cascade:fast", stream=True, messages=user("[fake@fake-0 status=500] hi"))
        reply = await streamed(service, req)
        body = b"".join([reply.first, *[frame async for frame in reply.frames]])
        chunks = [msgspec.json.decode(line[6:]) for line in body.split(b"\n\n")
                  if line.startswith(b"data: {")]
        assert chunks[-1]["model"] == TIERS[1]
        return reply.tier, chunks[-1]["cascade"], service.admission.in_flight

    (tier, info, in_flight), engine = with_service(
        "route", work, edit=lambda toml: toml.replace(f'name = "{TIERS[1]}"\n', branched_middle))
    assert tier == TIERS[1] and info["fallback_from"] == TIERS[0]
    assert info["branches"]["launched"] == 3 and in_flight == 0  # type: ignore[index]
    assert engine.stats.requests == 4  # the failed one, then three branches


def test_a_cascaded_stream_is_admitted_to_its_first_tier_before_its_first_frame_and_a_full_tier_refuses_at_once(
) -> None:
    # Cascade mode reads answers whole: the stream keeps alive meanwhile, but its first tier admits it (n = 2: two
    # upstream streams) before anything is sent, so a second stream finds the tier full and is refused (a 429).
    async def work(service: ChatService) -> tuple[bytes, int, int, str, tuple[int, int, int]]:
        req = request(stream=True, n=2, messages=user("[fake itl_ms=200] hi"))
        first = service.by_name[(await service.route(req)).tier_name].index
        admission = service.admission
        reply = await streamed(service, req)
        try:
            load, streams = admission.tier_load[first], admission.streams_open
            with pytest.raises(Overloaded) as info:
                await service.chat(request(stream=True))
        finally:
            await reply.frames.aclose()  # the client leaves before the answer: everything goes back
        return reply.first, load, streams, info.value.message, \
            (admission.in_flight, admission.streams_open, sum(admission.tier_load))

    (first, load, streams, refused, after), _ = with_service(
        "cascade", work, "[gateway]\nkeepalive_s = 0.05\n[gateway.limits]\nmax_in_flight_per_tier = 1\n")
    assert first == b": keep-alive\n\n" and (load, streams) == (1, 2)
    assert "is at its limit of 1 requests in flight" in refused and after == (0, 0, 0)
