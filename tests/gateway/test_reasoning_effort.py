"""`reasoning_effort` the way OpenAI clients send it (issue 64, items 1 and 3), through a gateway on fake engines: it
routes as `[routing.effort]` maps it, below an explicit cascade hint and above the default, with `cascade.note`
saying which; a named tier keeps its tier; each tier's engine is told thinking on or off and its budget in the fields
it reads; a bad value is a 400 naming the field; `max_completion_tokens` is the one limit. The embedded ladder takes
it on every tier (it was a 400 there), its reasoning counted with the tier's own tokenizer."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import pytest

from cascade.config import decode_config, load_config
from cascade.engines.models import cache_root
from cascade.engines.supervisor import Worker
from cascade.gateway.server import Gateway
from cascade.schemas import ChatCompletionRequest
from cascade.service.chat import ChatService, ServiceConfig, WholeReply
from cascade.service.metrics import GatewayMetrics
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript
from cascade.testing.fakes.sglang import FakeSGLang
from cascade.testing.servers import TIERS, ladder_toml
from cascade.tiers.build import build_tiers
from tests.gateway.gateway_setup import post_chat, user
from tests.servers import Recorder

SMALL, LARGE = TIERS[0], TIERS[-1]
T = TypeVar("T")


@contextmanager
def ladder(head: str = "", engine: Any = None) -> Iterator[tuple[str, Recorder]]:
    """The three-tier heuristic ladder (cascade/testing/servers.py) on one recorded fake engine."""
    recorder = Recorder(engine or FakeEngine(FakeScript(tokens=3)))
    with ExitStack() as stack:
        url = stack.enter_context(serve_asgi(recorder))
        base = stack.enter_context(serve_asgi(Gateway(decode_config(ladder_toml(url, head))).app, lifespan="on"))
        yield base, recorder


def info(response: Any) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    return dict(response.json()["cascade"])


@pytest.mark.parametrize(("effort", "tier", "quality"), [
    ("none", SMALL, "fast"), ("minimal", SMALL, "fast"), ("low", SMALL, "fast"), ("high", LARGE, "best"),
    ("xhigh", LARGE, "best"), ("max", LARGE, "best"), (0.9, LARGE, "best"), (0.1, SMALL, "fast"),
])
def test_the_effort_routes_as_the_table_maps_it_and_the_note_says_so(effort: str | float, tier: str,
                                                                     quality: str) -> None:
    with ladder() as (base, recorder):
        served = info(post_chat(base, {"model": "cascade", "messages": user(), "reasoning_effort": effort}))
    assert (served["tier_name"], served["quality"]) == (tier, quality)
    assert f"routed as quality `{quality}`" in served["note"]
    sent = recorder.bodies[0]
    assert sent["chat_template_kwargs"] == {"enable_thinking": effort != "none", "thinking": effort != "none"}
    # An OpenAI-compatible engine gets the level (vLLM takes no number).
    level = effort if isinstance(effort, str) else {"best": "high", "fast": "minimal"}[quality]
    assert sent["reasoning_effort"] == level


@pytest.mark.parametrize(("body", "headers", "source"), [
    ({"quality": "fast"}, {}, "the body's `quality`"),
    ({}, {"X-Cascade-Quality": "fast"}, "the X-Cascade-Quality header"),
    ({"model": "cascade:fast"}, {}, "the model alias"),
])
def test_an_explicit_cascade_hint_comes_before_the_effort(body: dict[str, Any], headers: dict[str, str],
                                                          source: str) -> None:
    with ladder() as (base, recorder):
        served = info(post_chat(base, {"model": "cascade", "messages": user(), "reasoning_effort": "high", **body},
                                headers))
    assert (served["tier_name"], served["quality"]) == (SMALL, "fast")
    assert f"from {source}, which comes first" in served["note"]
    assert recorder.bodies[0]["chat_template_kwargs"]["enable_thinking"] is True  # it still sets the thinking


def test_the_effort_comes_before_the_gateways_default() -> None:
    with ladder('[gateway]\ndefault_quality = "best"') as (base, _):
        default = info(post_chat(base, {"model": "cascade", "messages": user()}))
        effort = info(post_chat(base, {"model": "cascade", "messages": user(), "reasoning": {"effort": "low"}}))
    assert (default["tier_name"], effort["tier_name"]) == (LARGE, SMALL)
    assert "`reasoning.effort` 'low': routed as quality `fast`" in effort["note"]


def test_a_named_tier_keeps_its_tier_and_the_effort_sets_only_its_thinking() -> None:
    with ladder() as (base, recorder):
        served = info(post_chat(base, {"model": SMALL, "messages": user(), "reasoning_effort": "max",
                                       "stream": False}))
    assert (served["tier_name"], served["quality"]) == (SMALL, "bypass")
    assert "a tier was named, so it sets only the engine's thinking (on)" in served["note"]
    assert recorder.bodies[0]["reasoning_effort"] == "max"


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("fields", "param"), [
    ({"reasoning_effort": "hgh"}, "reasoning_effort"), ({"reasoning_effort": 1.5}, "reasoning_effort"),
    ({"reasoning_effort": True}, "reasoning_effort"), ({"reasoning_effort": "x" * 100_000}, "reasoning_effort"),
    ({"reasoning": {"effort": "lots"}}, "reasoning.effort"), ({"reasoning": {"summary": "auto"}}, "reasoning.summary"),
    ({"reasoning_effort": "high", "reasoning": {"effort": "low"}}, "reasoning.effort"),
])
def test_a_bad_effort_is_a_400_naming_its_field_and_no_engine_is_asked(fields: dict[str, Any], param: str,
                                                                       stream: bool) -> None:
    for model in ("cascade", SMALL):  # checked even where a named tier makes the routing moot
        with ladder() as (base, recorder):
            response = post_chat(base, {"model": model, "messages": user(), "stream": stream, **fields})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert (error["param"], error["type"]) == (param, "invalid_request_error") and len(error["message"]) < 400
        assert recorder.bodies == []


def test_a_level_the_table_answers_directly_runs_one_branch_with_thinking_off() -> None:
    head = '[routing.effort]\nnone = { quality = "best", branches = 1, thinking = false }\n'
    engine = FakeEngine(FakeScript(tokens=3))
    with ExitStack() as stack:
        recorder = Recorder(engine)
        url = stack.enter_context(serve_asgi(recorder))
        toml = (f'{head}[[tiers]]\nname = "small"\nbackends = [{{ kind = "openai", url = "{url}", model = "s" }}]\n'
                f'[[tiers]]\nname = "thinker"\nbranches = {{ n = 3, m = 2 }}\nscorer = "none"\n'
                f'backends = [{{ kind = "openai", url = "{url}", model = "t" }}]\n')
        base = stack.enter_context(serve_asgi(Gateway(decode_config(toml)).app, lifespan="on"))
        served = info(post_chat(base, {"model": "cascade", "messages": user(), "reasoning_effort": "none"}))
        branched = info(post_chat(base, {"model": "cascade", "messages": user(), "reasoning_effort": "high"}))
    assert (served["tier_name"], served["branches"]["launched"]) == ("thinker", 1)
    assert "one branch, thinking off" in served["note"]
    assert recorder.bodies[0]["chat_template_kwargs"] == {"enable_thinking": False, "thinking": False}
    assert branched["branches"]["launched"] == 3  # `high`: the tier's own branches


def test_one_direct_branch_works_on_a_tier_whose_stop_is_learned_from_a_first_wave() -> None:
    """A tier's first wave, and the stopping level learned from it (`confidence_keep`), have no room in one branch:
    both are left out for the request, not refused (as for a client's own `"branches": {"n": 1}`)."""
    head = '[routing.effort]\nminimal = { quality = "best", branches = 1 }\n'
    with ExitStack() as stack:
        url = stack.enter_context(serve_asgi(FakeEngine(FakeScript(tokens=3))))
        toml = (f'{head}[[tiers]]\nname = "keeper"\nscorer = "none"\n'
                'branches = { n = 4, m = 3, first_wave = 2, confidence_keep = 0.5 }\n'
                f'backends = [{{ kind = "openai", url = "{url}", model = "k" }}]\n')
        base = stack.enter_context(serve_asgi(Gateway(decode_config(toml)).app, lifespan="on"))
        effort = info(post_chat(base, {"model": "cascade", "messages": user(), "reasoning_effort": "minimal"}))
        own = info(post_chat(base, {"model": "keeper", "messages": user(), "branches": {"n": 1}}))
    assert effort["branches"]["launched"] == own["branches"]["launched"] == 1


@pytest.mark.parametrize(("kind", "field", "value"), [
    ("sglang", "custom_params", {"thinking_budget": 256}), ("openai", "thinking_token_budget", 256)])
def test_a_tiers_thinking_budget_reaches_its_engine_in_the_field_it_reads(kind: str, field: str,
                                                                         value: object) -> None:
    engine = FakeSGLang(FakeScript(tokens=3)) if kind == "sglang" else FakeEngine(FakeScript(tokens=3))
    recorder = Recorder(engine)
    with ExitStack() as stack:
        url = stack.enter_context(serve_asgi(recorder))
        toml = (f'[[tiers]]\nname = "t"\nbackends = [{{ kind = "{kind}", url = "{url}", model = "m" }}]\n'
                '[tiers.thinking]\nbudget_tokens = { medium = 256 }\n')
        base = stack.enter_context(serve_asgi(Gateway(decode_config(toml)).app, lifespan="on"))
        for effort in ("medium", "high", "none"):
            assert post_chat(base, {"model": "t", "messages": user(), "reasoning_effort": effort}).status_code == 200
    medium, high, none = recorder.bodies
    assert medium[field] == value and field not in high and field not in none


def test_max_completion_tokens_is_the_limit_when_both_are_sent_and_the_note_says_so() -> None:
    with ladder() as (base, recorder):
        both = info(post_chat(base, {"model": SMALL, "messages": user(), "max_tokens": 2,
                                     "max_completion_tokens": 5}))
        same = info(post_chat(base, {"model": SMALL, "messages": user(), "max_tokens": 5,
                                     "max_completion_tokens": 5}))
    assert "`max_completion_tokens` (5) is the limit" in both["note"] and same["note"] is None
    assert [(b["max_tokens"], b["max_completion_tokens"]) for b in recorder.bodies] == [(5, 5), (5, 5)]


# --- the embedded ladder ------------------------------------------------------------------------------------------

EMBEDDED = Path(__file__).resolve().parents[2] / "cascade" / "engines" / "embedded.toml"
THOUGHT = "Seventeen times twenty-three: 17 * 23 = 391, since 17 * 20 = 340 and 17 * 3 = 51."


def embedded_service(url: str, log_dir: Path) -> ChatService:
    """A service on the embedded ladder's own config, every worker's URL the fake engine's (none is started), with
    the heuristic router (the learned one routes the same way for what is checked here)."""
    port = int(url.rsplit(":", 1)[1])
    config = load_config(EMBEDDED)
    workers = {w.name: Worker(msgspec.structs.replace(w, port=port), cache_root() / w.model, log_dir)
               for w in config.workers}
    routing = msgspec.structs.replace(config.routing, policy="heuristic", router="")
    config = msgspec.structs.replace(config, routing=routing)
    return ChatService(build_tiers(config, workers), ServiceConfig.of(config), GatewayMetrics())


async def closing(service: ChatService, work: Callable[[ChatService], Awaitable[T]]) -> T:
    """`work` on `service`, its tiers' backends closed after."""
    try:
        return await work(service)
    finally:
        for tier in service.tiers:
            await tier.backend.aclose()


def test_the_embedded_ladder_takes_reasoning_effort_on_every_tier(tmp_path: Path) -> None:
    recorder = Recorder(FakeEngine(FakeScript(tokens=3)))

    async def ask(service: ChatService) -> list[WholeReply]:
        replies = []
        for model in ["cascade", *(t.name for t in service.tiers)]:
            for effort in ("none", "high"):
                req = msgspec.convert({"model": model, "messages": user(), "reasoning_effort": effort},
                                      ChatCompletionRequest)
                reply = await service.chat(req)
                assert isinstance(reply, WholeReply)
                replies.append(reply)
        return replies

    with serve_asgi(recorder) as url:
        replies = asyncio.run(closing(embedded_service(url, tmp_path), ask))
    for reply in replies:
        note = reply.completion.cascade.note if reply.completion.cascade else ""
        assert "`reasoning_effort` not sent as a field to" in (note or "")
    assert all("reasoning_effort" not in body for body in recorder.bodies)  # transformers serve does not take it
    assert {json.dumps(b["chat_template_kwargs"], sort_keys=True) for b in recorder.bodies} == {
        '{"enable_thinking": false, "thinking": false}', '{"enable_thinking": true, "thinking": true}'}


@pytest.mark.skipif(not (cache_root() / "qwen2.5-coder-0.5b" / "tokenizer.json").is_file(),
                    reason="the embedded models are not prepared (`cascade models prepare`)")
@pytest.mark.parametrize("stream", [False, True])
def test_an_embedded_tiers_reasoning_is_counted_with_its_own_tokenizer(tmp_path: Path, stream: bool) -> None:
    from cascade.engines.prompt_count import TemplateCounter

    tier = "qwen2.5-coder-0.5b"
    expected = TemplateCounter.load(cache_root() / tier).tokens(THOUGHT)
    # As transformers serve sends it; enough answer tokens that the count is never cut at the completion tokens.
    engine = FakeEngine(FakeScript(tokens=64), reasoning=THOUGHT, reasoning_field="reasoning_content")
    assert expected != len(THOUGHT.split())  # the chunks would count words: this shows which counted

    async def ask(service: ChatService) -> int:
        served = [t for t in service.tiers if t.name == tier]
        assert await asyncio.to_thread(service.counter.wait_loaded, served, 60)
        req = msgspec.convert({"model": tier, "messages": user(), "stream": stream,
                               "stream_options": {"include_usage": True} if stream else None},
                              ChatCompletionRequest)
        reply = await service.chat(req)
        if isinstance(reply, WholeReply):
            assert reply.completion.choices[0].message.reasoning == THOUGHT
            usage = reply.completion.usage
        else:
            try:
                frames = [reply.first, *[frame async for frame in reply.frames]]
            finally:
                await reply.frames.aclose()
            last = [line for line in b"".join(frames).split(b"\n") if line.startswith(b"data: {")][-1]
            usage = msgspec.json.decode(last[6:], type=dict)["usage"]
            return int(usage["completion_tokens_details"]["reasoning_tokens"])
        assert usage is not None and not isinstance(usage.completion_tokens_details, msgspec.UnsetType)
        return usage.completion_tokens_details.reasoning_tokens

    with serve_asgi(engine) as url:
        assert asyncio.run(closing(embedded_service(url, tmp_path), ask)) == expected
