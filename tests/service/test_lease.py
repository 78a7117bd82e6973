"""A request's lease (cascade/service/lease.py) over every way a request ends, and its bill.

ChatService is called directly, with an API key as its caller, in front of the fake engine over real HTTP on
127.0.0.1. After each way out (an answer, whole or streamed; a fault; a cancel; a client that leaves mid-stream; a
full tier, a full key, a rate limit) every place is counted back: the gateway's, each tier's, the upstream streams,
the branch slots and the key's in-flight places. The bill counts every token the engines decoded for the request:
every branch, every escalated draft, a retried attempt, a stream up to where it was cut; and the key's budget is
settled to the bill's cost on each way out (its worst case where the answer was cut while under way).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

import msgspec
import pytest

from cascade.config import decode_config
from cascade.errors import BackendError, Overloaded, RateLimited
from cascade.schemas import ChatCompletionRequest
from cascade.service.chat import ChatService, StreamReply, WholeReply
from cascade.service.keys.budget import Budget
from cascade.service.keys.budgets import LocalLedger
from cascade.service.keys.reservation import estimate_prompt_tokens
from cascade.service.keys.tenant import Tenant
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript
from cascade.testing.servers import TIERS, ladder_toml
from tests.gateway.gateway_setup import on_service, user
from tests.service.pricing import last_chunk, priced

T = TypeVar("T")
TOKENS = 8  # the fake engine's answer length


def key(name: str = "acme", **limits: object) -> Tenant:
    return Tenant(name, hashlib.sha256(name.encode()).digest(), **limits)  # type: ignore[arg-type]


def request(**fields: object) -> ChatCompletionRequest:
    body = {"model": "cascade", "messages": user(), **fields}
    return msgspec.json.decode(msgspec.json.encode(body), type=ChatCompletionRequest)


def with_service(work: Callable[[ChatService], Awaitable[T]], *, mode: str = "route", extra: str = "",
                 engines: int = 1, rewrite: Callable[[str], str] = lambda toml: toml) -> T:
    """`work` on a service over three tiers on one fake engine (`engines` = 2: the first tier has two replicas, the
    first of which cuts every answer short, so a whole answer is retried on the second); `rewrite` changes the config
    (prices, tests/service/keys/test_costs.py)."""
    engine = FakeEngine(FakeScript(tokens=TOKENS))
    faulty = FakeEngine(FakeScript(tokens=TOKENS, fault="truncated", stall_after=3))
    with serve_asgi(engine) as url, serve_asgi(faulty) as bad_url:
        toml = rewrite(ladder_toml(url, extra))
        if engines == 2:
            first = f'backends = [{{ kind = "openai", url = "{url}", model = "fake-0"'
            toml = toml.replace(first, f'backends = [{{ kind = "openai", url = "{bad_url}", model = "fake-0" }}, '
                                       + first[len("backends = ["):], 1)
        return on_service(decode_config(toml), mode, work)


def nothing_held(service: ChatService) -> bool:
    admission = service.admission
    slots = [t.slots.free == t.slots.capacity for t in service.tiers if t.slots is not None]
    return (admission.in_flight == 0 and admission.streams_open == 0 and not any(admission.tier_load)
            and service.tenants.in_flight == {} and all(slots))


def key_tokens(service: ChatService, tenant: Tenant, tier: str, direction: str) -> float:
    return service.metrics.key_tokens.labels(tenant.name, tier, direction)._value.get()


def token_level(service: ChatService, tenant: Tenant) -> float:
    """The key's token bucket as the last settle left it (read without the refill since)."""
    return service.tenants.limiter._buckets[(tenant.name, "tokens")].level  # type: ignore[attr-defined]


class Left:
    gone = True


# --- every way out gives everything back ----------------------------------------------------------------------


def test_a_whole_answer_gives_everything_back_and_bills_what_was_decoded() -> None:
    caller = key(max_in_flight=2)

    async def work(service: ChatService) -> tuple[bool, int, int, float]:
        reply = await service.chat(request(model=TIERS[0]), caller=caller)
        assert isinstance(reply, WholeReply)
        info = reply.completion.cascade
        assert info is not None and info.billed is not None and reply.completion.usage is not None
        assert info.billed.completion_tokens == reply.completion.usage.completion_tokens == TOKENS
        return (nothing_held(service), info.billed.prompt_tokens, reply.completion.usage.prompt_tokens,
                key_tokens(service, caller, TIERS[0], "out"))

    held_nothing, billed_prompt, usage_prompt, out = with_service(work)
    assert held_nothing and billed_prompt == usage_prompt > 0 and out == TOKENS


def test_a_stream_read_to_its_end_gives_everything_back_and_its_last_chunk_carries_the_bill() -> None:
    caller = key(max_in_flight=1)

    async def work(service: ChatService) -> tuple[bool, bytes, float]:
        reply = await service.chat(request(model=TIERS[0], stream=True), caller=caller)
        assert isinstance(reply, StreamReply)
        frames = [reply.first, *[frame async for frame in reply.frames]]
        await reply.frames.aclose()
        return nothing_held(service), frames[-1], key_tokens(service, caller, TIERS[0], "out")

    held_nothing, last, out = with_service(work)
    assert held_nothing and b'"billed":{"prompt_tokens"' in last and out == TOKENS


def test_a_stream_the_client_cuts_is_billed_up_to_the_cut_and_gives_everything_back() -> None:
    caller = key(max_in_flight=1)

    async def work(service: ChatService) -> tuple[bool, bool, float]:
        req = request(model=TIERS[0], stream=True, messages=user("[fake@fake-0 tokens=2000 itl_ms=2] hi"))
        reply = await service.chat(req, caller=caller, client=Left())
        assert isinstance(reply, StreamReply)
        for _ in range(5):
            await anext(reply.frames)
        held_while_open = not nothing_held(service)
        await reply.frames.aclose()  # what the route does when the client leaves
        return held_while_open, nothing_held(service), key_tokens(service, caller, TIERS[0], "out")

    held_while_open, held_nothing, out = with_service(work)
    assert held_while_open and held_nothing and 4 <= out < 2000  # the tokens relayed, not the reservation


def test_a_fault_before_any_answer_gives_everything_back_and_bills_nothing() -> None:
    caller = key(max_in_flight=1, tokens_per_minute=100_000)

    async def work(service: ChatService) -> tuple[bool, float]:
        for stream in (False, True):
            req = request(model=TIERS[1], stream=stream, messages=user("[fake@fake-1 status=500] hi"))
            with pytest.raises(BackendError):
                await service.chat(req, caller=caller)
        return nothing_held(service), key_tokens(service, caller, TIERS[1], "out")

    held_nothing, out = with_service(work)
    assert held_nothing and out == 0


def test_a_whole_answer_cancelled_mid_way_gives_everything_back_and_bills_its_reservation() -> None:
    caller = key(max_in_flight=1, tokens_per_minute=100_000)

    async def work(service: ChatService) -> tuple[bool, float]:
        req = request(model=TIERS[0], max_tokens=32, messages=user("[fake@fake-0 itl_ms=50] hi"))
        task = asyncio.create_task(service.chat(req, caller=caller, client=Left()))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return nothing_held(service), token_level(service, caller)

    held_nothing, level = with_service(work)
    # The answer's count is unknown when it is cut mid-way: the reservation (prompt + 32 tokens) stands.
    assert held_nothing and level < 100_000 - 32


@pytest.mark.parametrize("stream", [False, True])
def test_refusals_after_the_lease_was_taken_give_back_what_was_taken(stream: bool) -> None:
    caller = key(max_in_flight=1, requests_per_minute=2)

    async def work(service: ChatService) -> list[str]:
        refused = []
        slow = request(model=TIERS[0], stream=stream, messages=user("[fake@fake-0 itl_ms=30] hi"))
        first = asyncio.create_task(service.chat(slow, caller=caller))
        await asyncio.sleep(0.1)
        with pytest.raises(Overloaded) as full:  # the key's one in-flight place is held by `first`
            await service.chat(request(model=TIERS[0], stream=stream), caller=caller)
        refused.append(str(full.value))
        reply = await first
        if isinstance(reply, StreamReply):
            [frame async for frame in reply.frames]
            await reply.frames.aclose()
        await service.chat(request(model=TIERS[0]), caller=caller)  # the second of 2 requests per minute
        with pytest.raises(RateLimited):
            await service.chat(request(model=TIERS[0], stream=stream), caller=caller)
        assert nothing_held(service)
        return refused

    refused = with_service(work)
    assert "API key `acme` has 1 requests in flight" in refused[0]


def test_a_full_tier_refuses_the_request_and_gives_the_key_its_place_and_tokens_back() -> None:
    caller = key(max_in_flight=10, tokens_per_minute=100_000)

    async def work(service: ChatService) -> tuple[bool, float]:
        service.admission.tier_caps[0] = 0
        with pytest.raises(Overloaded):
            await service.chat(request(model=TIERS[0], max_tokens=16), caller=caller)
        return nothing_held(service), token_level(service, caller)

    held_nothing, level = with_service(work)
    assert held_nothing and level == pytest.approx(100_000, abs=1)


# --- the bill: every token decoded -------------------------------------------------------------------------------


def test_every_branch_is_billed_pruned_and_stopped_ones_included_while_usage_is_the_answer() -> None:
    caller = key()

    async def work(service: ChatService) -> tuple[int, int, int, float]:
        req = request(model=TIERS[2], branches={"n": 4, "m": 2}, messages=user("[fake@fake-2 itl_ms=2] 2+2?"))
        reply = await service.chat(req, caller=caller)
        assert isinstance(reply, WholeReply) and reply.completion.cascade is not None
        info, usage = reply.completion.cascade, reply.completion.usage
        assert info.billed is not None and usage is not None
        assert nothing_held(service)
        return (info.billed.completion_tokens, info.branches.decode_tokens, usage.completion_tokens,
                key_tokens(service, caller, TIERS[2], "out"))

    billed, decoded, usage, out = with_service(work)
    assert billed == decoded == out and billed > usage == TOKENS


def test_an_escalated_draft_is_billed_with_the_answer_that_replaced_it() -> None:
    caller = key()

    async def work(service: ChatService) -> tuple[int, int, int]:
        req = request(model="cascade:balanced", messages=user("[fake@fake-0 tokens=100] What is 2 + 2?"))
        reply = await service.chat(req, caller=caller)
        assert isinstance(reply, WholeReply)
        completion = reply.completion
        assert completion.model == TIERS[1] and completion.cascade is not None and completion.usage is not None
        assert completion.cascade.billed is not None
        return (completion.cascade.billed.completion_tokens, completion.usage.completion_tokens,
                completion.cascade.billed.prompt_tokens // completion.usage.prompt_tokens)

    billed, usage, prompts = with_service(work, mode="cascade")
    assert usage == TOKENS and billed == 32 + TOKENS and prompts == 2  # the draft was cut at max_tokens (32)


@pytest.mark.parametrize("stream", [False, True])
def test_each_choice_of_an_n_request_bills_the_prompt_its_engine_processed(stream: bool) -> None:
    """n = 3 is three upstream requests, each processing the prompt: the bill counts it three times (it counted it
    once while the engines reported three), and `usage` keeps OpenAI's meaning (the prompt once)."""

    async def work(service: ChatService) -> tuple[int, int]:
        usage = {"stream_options": {"include_usage": True}} if stream else {}
        reply = await service.chat(request(model=TIERS[0], n=3, stream=stream, **usage), caller=key())
        if isinstance(reply, StreamReply):
            frames = [reply.first, *[frame async for frame in reply.frames]]
            await reply.frames.aclose()
            last = msgspec.json.decode(frames[-1].split(b"data: ")[1].split(b"\n")[0])
            return last["cascade"]["billed"]["prompt_tokens"], last["usage"]["prompt_tokens"]
        assert isinstance(reply, WholeReply)
        completion = reply.completion
        assert completion.cascade is not None and completion.cascade.billed is not None and completion.usage
        return completion.cascade.billed.prompt_tokens, completion.usage.prompt_tokens

    billed, usage = with_service(work)
    assert usage > 0 and billed == 3 * usage


def test_a_retried_whole_answer_bills_the_tokens_its_failed_attempt_decoded() -> None:
    async def work(service: ChatService) -> list[tuple[int, int, int]]:
        seen = []
        for _ in range(4):  # the pool starts on either replica: some answers are retried
            reply = await service.chat(request(model=TIERS[0]), caller=key())
            assert isinstance(reply, WholeReply) and reply.completion.cascade is not None
            info, usage = reply.completion.cascade, reply.completion.usage
            assert info.billed is not None and usage is not None
            seen.append((info.retries, info.billed.completion_tokens, usage.completion_tokens))
        return seen

    seen = with_service(work, engines=2)
    assert any(retries for retries, _, _ in seen)
    for retries, billed, usage in seen:
        assert billed == usage + 3 * retries  # the cut attempt sent 3 tokens before it ended without a finish


# --- the key's budget: settled to the cost on every way out -------------------------------------------------------


def budgeted(name: str = "acme", amount: float = 10.0, **limits: object) -> Tenant:
    return key(name, budget=Budget(amount, 3600), **limits)


def budget_spent(service: ChatService, tenant: Tenant) -> float:
    """What the key spent and still reserves this hour (the service's own ledger)."""
    assert isinstance(service.budgets.ledger, LocalLedger)
    return service.budgets.ledger.read(tenant.name, 3600).spent


def key_cost(service: ChatService, tenant: Tenant, tier: str) -> float:
    return service.metrics.key_cost.labels(tenant.name, tier)._value.get()


@pytest.mark.parametrize("stream", [False, True])
def test_an_answer_settles_the_budget_to_its_cost(stream: bool) -> None:
    caller = budgeted(max_in_flight=1)

    async def work(service: ChatService) -> tuple[bool, float, float]:
        reply = await service.chat(request(model=TIERS[1], stream=stream), caller=caller)
        if isinstance(reply, StreamReply):
            body = b"".join([reply.first, *[frame async for frame in reply.frames]])
            await reply.frames.aclose()
            total = last_chunk(body)["cascade"]["cost"]["total"]
        else:
            assert reply.completion.cascade is not None and reply.completion.cascade.cost is not None
            total = reply.completion.cascade.cost.total
        return nothing_held(service), total, budget_spent(service, caller)

    held_nothing, total, spent = with_service(work, rewrite=priced)
    assert held_nothing and total > 0 and spent == pytest.approx(total)


def test_a_stream_the_client_cuts_settles_the_budget_to_what_was_relayed() -> None:
    caller = budgeted(max_in_flight=1)

    async def work(service: ChatService) -> tuple[bool, float, float]:
        req = request(model=TIERS[0], stream=True, messages=user("[fake@fake-0 tokens=2000 itl_ms=2] hi"))
        reply = await service.chat(req, caller=caller, client=Left())
        assert isinstance(reply, StreamReply)
        for _ in range(5):
            await anext(reply.frames)
        await reply.frames.aclose()
        return nothing_held(service), budget_spent(service, caller), key_cost(service, caller, TIERS[0])

    held_nothing, spent, relayed = with_service(work, rewrite=priced)
    assert held_nothing and spent == pytest.approx(relayed) and 0 < spent < 2000 * 2 / 1e6  # not 2000 tokens' worth


def test_a_fault_and_a_full_tier_give_the_whole_reservation_back() -> None:
    caller = budgeted(max_in_flight=1)

    async def work(service: ChatService) -> tuple[bool, float]:
        for stream in (False, True):
            req = request(model=TIERS[1], stream=stream, messages=user("[fake@fake-1 status=500] hi"))
            with pytest.raises(BackendError):
                await service.chat(req, caller=caller)
        service.admission.tier_caps[0] = 0  # refused after the budget's reservation was taken
        with pytest.raises(Overloaded):
            await service.chat(request(model=TIERS[0]), caller=caller)
        return nothing_held(service), budget_spent(service, caller)

    held_nothing, spent = with_service(work, rewrite=priced)
    assert held_nothing and spent == 0.0


def test_a_whole_answer_cancelled_mid_way_keeps_its_worst_case_on_the_budget() -> None:
    caller = budgeted(max_in_flight=1)

    async def work(service: ChatService) -> tuple[bool, float, float]:
        req = request(model=TIERS[0], max_tokens=32, messages=user("[fake@fake-0 itl_ms=50] hi"))
        task = asyncio.create_task(service.chat(req, caller=caller, client=Left()))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        prompt = estimate_prompt_tokens(req)
        return nothing_held(service), budget_spent(service, caller), (prompt * 1 + 32 * 2) / 1e6

    held_nothing, spent, worst = with_service(work, rewrite=priced)
    assert held_nothing and spent == pytest.approx(worst)  # its tokens are unknown: the reservation stands


def test_a_refusal_by_the_token_limit_reserves_nothing_from_the_budget() -> None:
    caller = budgeted(tokens_per_minute=10)

    async def work(service: ChatService) -> tuple[bool, float]:
        with pytest.raises(RateLimited):
            await service.chat(request(model=TIERS[0]), caller=caller)
        return nothing_held(service), budget_spent(service, caller)

    held_nothing, spent = with_service(work, rewrite=priced)
    assert held_nothing and spent == 0.0
