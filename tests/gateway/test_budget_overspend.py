"""The overspend promise, tested as stated (cascade/service/keys/budgets.py): N concurrent requests of one key spend
at most one request's worst case beyond its budget, on one gateway and across two gateways sharing a real Redis,
against an engine that counts prompts with the real Qwen2.5 tokenizer and reports usage only in its last chunk, as
SGLang does (cascade/testing/fakes/counting.py).

The prompts are spaced digits, which tokenize at one token per byte: a reservation at bytes / 4 let ten concurrent
requests spend about 4x a budget (a live review: 80,070 tokens spent against 20,000). And word problems, whose
reservation counted with the tier's tokenizer (cascade/service/keys/counting.py) is about a third of their byte bound:
the promise holds at the count, and the budget serves more than twice the requests.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable

import msgspec
import pytest

from cascade.config import decode_config
from cascade.engines.models import cache_root
from cascade.errors import QuotaExceeded
from cascade.schemas import ChatCompletionRequest
from cascade.service.chat import ChatService, ServiceConfig, WholeReply
from cascade.service.keys.budget import Budget
from cascade.service.keys.budgets import BudgetLedger, LocalLedger
from cascade.service.keys.reservation import reservation
from cascade.service.keys.tenant import Tenant
from cascade.service.metrics import GatewayMetrics
from cascade.service.redis.ledger import RedisLedger
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.counting import CountingEngine
from cascade.testing.scripts import word_problems
from cascade.testing.servers import TIERS, ladder_toml
from cascade.tiers.build import build_tiers
from tests.gateway.test_redis_limits import redis, run, store  # noqa: F401 (the `redis` fixture)
from tests.service.pricing import priced

TOKENIZER = cache_root() / "qwen2.5-coder-0.5b" / "tokenizer.json"
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not TOKENIZER.is_file(), reason="the embedded models are not prepared (`cascade models "
                                                       "prepare`; `make test` runs it first)"),
]

SPACED_DIGITS = " ".join(str(i % 10) for i in range(1500))  # 2,999 bytes: 2,999 tokens
ENGLISH = " ".join(word_problems(40, seed=0))[:2_999]  # 2,999 bytes of word problems: ~990 tokens
BUDGET = 0.075  # the middle tier's price: about 2.5 requests of ~3,050 tokens


def _spend(ledgers: list[BudgetLedger], concurrent: int, prompt: str = SPACED_DIGITS, counted: bool = False
           ) -> tuple[list[float], int, float, list[int]]:
    """`concurrent` requests at once, spread over one gateway per ledger: the costs of those served, how many were
    refused, one request's worst case, and the prompts the engine counted. `counted`: the tiers count prompts with
    the engine's tokenizer (as embedded workers' tiers do), else they reserve the byte bound."""
    caller = Tenant("team-a", hashlib.sha256(b"team-a").digest(), budget=Budget(BUDGET, 3600))
    body = {"model": TIERS[1], "max_tokens": 8, "messages": [{"role": "user", "content": prompt}]}
    req = msgspec.convert(body, type=ChatCompletionRequest)
    engine = CountingEngine(TOKENIZER, itl_ms=20)  # answers take a while: every request is admitted before any ends

    async def work() -> tuple[list[float], int, float]:
        with serve_asgi(engine) as url:
            config = decode_config(priced(ladder_toml(url)))
            gateways = [ChatService(build_tiers(config, {}), ServiceConfig.of(config), GatewayMetrics(), ledger=ledger)
                        for ledger in ledgers]
            for service in gateways:
                for tier in service.tiers:
                    tier.model_dirs = (TOKENIZER.parent,) if counted else ()
                assert await asyncio.to_thread(service.counter.wait_loaded, service.tiers, 60)

            async def one(i: int) -> float | None:
                try:
                    reply = await gateways[i % len(gateways)].chat(req, caller=caller)
                except QuotaExceeded:
                    return None
                assert isinstance(reply, WholeReply) and reply.completion.cascade is not None
                assert reply.completion.cascade.cost is not None
                return reply.completion.cascade.cost.total

            try:
                costs = await asyncio.gather(*(one(i) for i in range(concurrent)))
            finally:
                for service in gateways:
                    for tier in service.tiers:
                        await tier.backend.aclose()
            tier = gateways[0].tiers[1]
            size = len(msgspec.json.encode(req.messages))
            reserved = reservation(req, [1], [tier.config.default_max_tokens], [tier.config.system_prompt],
                                   gateways[0].budgets.prices, [tier.name],
                                   await gateways[0].counter.count(req, [tier], size), size)
            assert reserved.counted == (counted and prompt == ENGLISH)
            assert reserved.prompt_tokens >= max(engine.prompt_tokens)  # never below what the engine reported
            worst = reserved.cost
            return [c for c in costs if c is not None], costs.count(None), worst

    costs, refused, worst = run(work)
    return costs, refused, worst, engine.prompt_tokens


def _holds(spend: Callable[[], tuple[list[float], int, float, list[int]]], min_prompt: int = 2_999) -> None:
    costs, refused, worst, prompts = spend()
    assert min(prompts) >= min_prompt  # spaced digits: one token per byte, and the template's
    assert refused > 0 and len(costs) >= 2
    assert sum(costs) <= BUDGET + worst, f"spent {sum(costs):.4f} of a budget of {BUDGET} (worst case {worst:.4f})"


def test_ten_concurrent_requests_on_one_gateway_spend_at_most_one_worst_case_beyond_the_budget() -> None:
    _holds(lambda: _spend([LocalLedger()], 10))


def test_reservations_counted_with_the_tiers_tokenizer_keep_the_promise_and_serve_more_of_the_budget() -> None:
    counted = _spend([LocalLedger()], 20, ENGLISH, counted=True)
    _holds(lambda: counted, min_prompt=600)
    bounded = _spend([LocalLedger()], 20, ENGLISH)
    assert len(counted[0]) >= 2 * len(bounded[0])  # served within the budget: 8 against 3


def test_spaced_digits_counted_with_the_tiers_tokenizer_keep_the_promise() -> None:
    _holds(lambda: _spend([LocalLedger()], 10, counted=True))  # their count is their byte bound: reserved as bytes


def test_ten_concurrent_requests_across_two_gateways_sharing_redis_spend_at_most_one_worst_case_beyond_it(
        redis) -> None:  # noqa: F811
    _holds(lambda: _spend([RedisLedger(store(redis.url)), RedisLedger(store(redis.url))], 10))


