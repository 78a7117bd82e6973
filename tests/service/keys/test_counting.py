"""A request's prompt counted with its tiers' own tokenizers for its reservation (cascade/service/keys/counting.py):
never below what the engine reports, never above the byte bound, the byte bound wherever cascade cannot count (a
prompt over the cap, a tier without a tokenizer, tools, a tokenizer that does not load), and counted off the event
loop.

The engine's count is `CountingEngine.count` (cascade/testing/fakes/counting.py): Qwen2.5's template written out by
hand and the real tokenizer, what the worker reports (tests/engines/test_prompt_count.py checks cascade's count against
transformers' own functions)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cascade.config import decode_config
from cascade.engines.models import cache_root
from cascade.engines.supervisor import Worker
from cascade.schemas import ChatCompletionRequest, ChatMessage
from cascade.service.keys.counting import COUNT_MAX_BYTES, PromptCounter
from cascade.service.keys.reservation import Reservation, estimate_prompt_tokens, reservation
from cascade.testing.fakes.counting import CountingEngine
from cascade.testing.scripts import word_problems
from cascade.testing.servers import ladder_toml
from cascade.tiers.build import Tier, build_tiers
from cascade.tiers.upstream import engine_fields
from tests.hostile_messages import MESSAGES

QWEN = cache_root() / "qwen2.5-coder-0.5b"
pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(not (QWEN / "tokenizer.json").is_file(), reason="the embedded models are not prepared "
                                                                       "(`cascade models prepare`)"),
]
PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                           HealthCheck.data_too_large])
SYSTEM_PROMPTS = ["", "Think step by step, then give the answer after ####."]


def tiers(*model_dirs: tuple[Path, ...], system_prompt: str = "") -> list[Tier]:
    """One tier per entry of `model_dirs` (its replicas' model directories; () for a URL backend's)."""
    built = build_tiers(decode_config(ladder_toml("http://127.0.0.1:9")), {})  # never called
    return [msgspec.structs.replace(t, model_dirs=dirs, config=msgspec.structs.replace(
        t.config, system_prompt=system_prompt)) for t, dirs in zip(built, model_dirs, strict=False)]


COUNTER = PromptCounter()
QWEN_TIER = tiers((QWEN,))
ENGINE = CountingEngine(QWEN / "tokenizer.json")


@pytest.fixture(scope="module", autouse=True)
def loaded() -> None:
    assert COUNTER.wait_loaded(QWEN_TIER, timeout_s=60)


def reserve(req: ChatCompletionRequest, reachable: list[Tier], counter: PromptCounter = COUNTER) -> Reservation:
    """What ChatService reserves for `req` on `reachable` (one branch, 32 tokens out)."""
    size = len(msgspec.json.encode(req.messages))
    counted = asyncio.run(counter.count(req, reachable, size))
    return reservation(req, [1], [32], [t.config.system_prompt for t in reachable], None,
                       [t.name for t in reachable], counted, size)


def engine_count(messages: list[ChatMessage], tier: Tier) -> int:
    """What the engine reports for `messages` sent on `tier` (its system prompt first)."""
    sent = engine_fields(tier.config, messages, None)[0]
    return ENGINE.count(msgspec.json.decode(msgspec.json.encode(sent)))


def chat(messages: list[ChatMessage], **fields: object) -> ChatCompletionRequest:
    return msgspec.convert({"model": "m", "messages": msgspec.to_builtins(messages), **fields}, ChatCompletionRequest)


@PROPERTY
@given(messages=MESSAGES, system=st.sampled_from(SYSTEM_PROMPTS))
def test_a_counted_reservation_is_never_below_the_engines_count_nor_above_the_byte_bound(
        messages: list[ChatMessage], system: str) -> None:
    reachable = tiers((QWEN,), system_prompt=system)
    req = chat(messages)
    reserved = reserve(req, reachable)
    assert engine_count(messages, reachable[0]) <= reserved.prompt_tokens <= estimate_prompt_tokens(req, system)


def test_an_english_prompt_reserves_its_count_far_below_its_byte_bound() -> None:
    for text in word_problems(20, seed=1):
        req = chat([ChatMessage(role="user", content=text)])
        reserved = reserve(req, QWEN_TIER)
        actual = engine_count(req.messages, QWEN_TIER[0])
        assert reserved.counted and actual <= reserved.prompt_tokens <= actual * 1.05 + 4
        assert reserved.prompt_tokens < estimate_prompt_tokens(req) / 2


def test_a_prompt_over_the_byte_cap_reserves_its_byte_bound() -> None:
    under = chat([ChatMessage(role="user", content="a " * ((COUNT_MAX_BYTES - 64) // 2))])
    over = chat([ChatMessage(role="user", content="a " * (COUNT_MAX_BYTES // 2))])
    assert reserve(under, QWEN_TIER).counted
    reserved = reserve(over, QWEN_TIER)
    assert not reserved.counted and reserved.prompt_tokens == estimate_prompt_tokens(over)


def test_a_tier_without_a_tokenizer_tools_or_template_arguments_keep_the_byte_bound() -> None:
    req = chat([ChatMessage(role="user", content="How many apples are left?")])
    assert reserve(req, QWEN_TIER).counted
    assert not reserve(req, tiers((QWEN,), ())).counted  # one reachable tier is a URL backend
    assert not reserve(req, tiers((QWEN, Path("/nonexistent")))).counted  # one replica's model is not loaded
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert not reserve(chat(req.messages, tools=tools), QWEN_TIER).counted
    assert not reserve(chat(req.messages, chat_template_kwargs={"x": 1}), QWEN_TIER).counted


def test_a_tokenizer_that_fails_to_load_means_the_byte_bound_logged_once(tmp_path: Path,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "tokenizer.json").write_text("not a tokenizer")
    (tmp_path / "chat_template.jinja").write_text("{{ messages }}")
    counter = PromptCounter()
    broken = tiers((tmp_path,))
    assert not counter.wait_loaded(broken, timeout_s=60)
    req = chat([ChatMessage(role="user", content="hi")])
    with caplog.at_level(logging.WARNING, logger="cascade.gateway"):
        reserved = [reserve(req, broken, counter) for _ in range(3)]
    assert all(not r.counted and r.prompt_tokens == estimate_prompt_tokens(req) for r in reserved)
    assert len(caplog.records) == 1 and str(tmp_path) in caplog.records[0].getMessage()


def test_counting_a_long_prompt_leaves_the_event_loop_serving() -> None:
    """While a prompt of digits near the cap is encoded (tens of milliseconds), another coroutine keeps running: the
    count is in a worker thread, and the encoder holds no GIL (its `encode` would stall the loop even from a
    thread)."""
    req = chat([ChatMessage(role="user", content=" ".join("7" * ((COUNT_MAX_BYTES - 64) // 2)))])
    size = len(msgspec.json.encode(req.messages))

    async def work() -> tuple[int | None, int]:
        ticks, counting = 0, True

        async def other() -> None:
            nonlocal ticks
            while counting:
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(other())
        await asyncio.sleep(0)
        before = ticks
        try:
            counted = await COUNTER.count(req, QWEN_TIER, size)
        finally:
            counting = False
            await task
        return counted, ticks - before

    counted, ticks = asyncio.run(work())
    assert counted is not None and counted >= COUNT_MAX_BYTES // 2  # one token a digit
    assert ticks >= 10


def test_a_tier_on_embedded_workers_counts_with_their_models_and_one_with_a_url_replica_does_not(
        tmp_path: Path) -> None:
    config = decode_config("""
[[workers]]
name = "qwen"
model = "qwen2.5-coder-0.5b"
port = 9

[[tiers]]
name = "embedded"
backends = [{ kind = "worker", worker = "qwen" }, { kind = "worker", worker = "qwen" }]

[[tiers]]
name = "mixed"
backends = [{ kind = "worker", worker = "qwen" }, { kind = "openai", url = "http://127.0.0.1:9", model = "m" }]
""")
    workers = {w.name: Worker(w, QWEN, tmp_path, command=["true"]) for w in config.workers}
    embedded, mixed = build_tiers(config, workers)
    assert embedded.model_dirs == (QWEN, QWEN) and mixed.model_dirs == ()
    req = chat([ChatMessage(role="user", content="How many apples are left?")])
    assert COUNTER.wait_loaded([embedded], timeout_s=60)
    assert reserve(req, [embedded]).counted and not reserve(req, [embedded, mixed]).counted
