"""Replica choice by prefix through real gateways over HTTP (`[tiers.replicas] choice = "prefix"`): two gateways send
every turn of a conversation to one engine with nothing shared, a client's `x-session-id` or `prompt_cache_key` picks
the replica (and never reaches the engine), and /metrics counts the prompt tokens the engines' prefix caches served.
Three fake engines with prefix caches, each answering its own name."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import httpx

from cascade.config import decode_config
from cascade.gateway.server import Gateway
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript
from cascade.testing.fakes.prefix_cache import PrefixCache
from tests.gateway.gateway_setup import post_chat

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
Bodies = list[dict[str, Any]]


def config(urls: list[str]) -> str:
    backends = ", ".join(f'{{ kind = "openai", url = "{u}", model = "m" }}' for u in urls)
    return (f'[[tiers]]\nname = "chat"\ndefault_max_tokens = 8\nbackends = [{backends}]\n'
            '[tiers.replicas]\nchoice = "prefix"\n')


@contextmanager
def fleet(gateways: int = 2) -> Iterator[tuple[list[str], list[FakeEngine], Bodies]]:
    """(gateway URLs, engines, the bodies the engines received): `gateways` gateways over three engines."""
    bodies: Bodies = []

    def record(script: FakeScript, body: dict[str, Any]) -> FakeScript:
        bodies.append(body)
        return script

    engines = [FakeEngine(FakeScript(answer=f"engine-{i}"), hook=record, prefix_cache=PrefixCache(100_000))
               for i in range(3)]
    with ExitStack() as stack:
        urls = [stack.enter_context(serve_asgi(e)) for e in engines]
        toml = config(urls)
        gateway_urls = [stack.enter_context(serve_asgi(Gateway(decode_config(toml)).app, lifespan="on"))
                        for _ in range(gateways)]
        yield gateway_urls, engines, bodies


def answer(gateway: str, messages: list[dict[str, Any]], **fields: Any) -> str:
    headers = fields.pop("headers", None)
    response = post_chat(gateway, {"model": "chat", "messages": messages, **fields}, headers)
    assert response.status_code == 200, response.text
    return str(response.json()["choices"][0]["message"]["content"])


def test_two_gateways_send_every_turn_of_a_conversation_to_one_engine() -> None:
    with fleet() as (gateways, engines, _):
        served: dict[int, set[str]] = {}
        for c in range(8):
            messages = [SYSTEM]
            for turn in range(3):
                messages = [*messages, {"role": "user", "content": f"conversation {c}, question {turn}"}]
                reply = answer(gateways[turn % 2], messages)  # the turns alternate between the gateways
                served.setdefault(c, set()).add(reply)
                messages = [*messages, {"role": "assistant", "content": reply}]
        cached = sum(e.stats.cached_tokens for e in engines)
    assert all(len(engines_used) == 1 for engines_used in served.values()), served
    assert len(set().union(*served.values())) >= 2  # eight conversations do not all share one engine
    assert cached > 0


def test_a_session_header_or_prompt_cache_key_picks_the_engine_and_is_not_forwarded() -> None:
    with fleet(gateways=1) as ([gateway], _, bodies):
        by_header = {answer(gateway, [{"role": "user", "content": f"unrelated {i}"}],
                            headers={"x-session-id": "session-42"}) for i in range(6)}
        by_field = {answer(gateway, [{"role": "user", "content": f"other {i}"}], prompt_cache_key="session-42")
                    for i in range(6)}
    assert len(by_header) == 1 and by_field == by_header  # the same key, by header or by field
    assert all("prompt_cache_key" not in body for body in bodies)


def test_metrics_count_the_prompt_tokens_the_engines_prefix_caches_served() -> None:
    with fleet(gateways=1) as ([gateway], engines, _):
        messages = [SYSTEM, {"role": "user", "content": "hello"}]
        for turn in range(3):
            reply = answer(gateway, messages)
            messages = [*messages, {"role": "assistant", "content": reply}, {"role": "user", "content": f"q{turn}"}]
        text = httpx.get(f"{gateway}/metrics", timeout=5).text
        cached = sum(e.stats.cached_tokens for e in engines)
        prompt = sum(e.stats.prompt_tokens for e in engines)

    def value(name: str) -> float:
        match = re.search(rf'^{name}{{tier="chat"}} (\S+)$', text, re.MULTILINE)
        assert match is not None, name
        return float(match.group(1))

    assert cached > 0
    assert value("cascade_cached_prompt_tokens_total") == cached
    assert value("cascade_upstream_prompt_tokens_total") == prompt
    assert value("cascade_replica_spills_total") == 0


def test_the_engines_cached_tokens_reach_the_client_in_usage_whole_and_streamed() -> None:
    conversation = [SYSTEM, {"role": "user", "content": "Tell me about prefix caches, at length. " * 20}]
    with fleet(gateways=1) as ([gateway], _, _):
        first = post_chat(gateway, {"model": "chat", "messages": conversation}).json()["usage"]
        again = post_chat(gateway, {"model": "chat", "messages": conversation}).json()["usage"]
        with httpx.stream("POST", f"{gateway}/v1/chat/completions", timeout=10,
                          json={"model": "chat", "messages": conversation, "stream": True,
                                "stream_options": {"include_usage": True}}) as response:
            events = [line for line in response.iter_lines() if line.startswith("data: {")]
    streamed = [e for e in (httpx.Response(200, content=line[6:]).json() for line in events) if e.get("usage")][-1]
    assert first["prompt_tokens_details"]["cached_tokens"] == 0  # a cold cache says 0, not nothing
    cached = again["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached <= again["prompt_tokens"]
    assert streamed["usage"]["prompt_tokens_details"]["cached_tokens"] == cached


def test_usage_has_no_prompt_tokens_details_when_the_engine_reports_none() -> None:
    with ExitStack() as stack:
        url = stack.enter_context(serve_asgi(FakeEngine(FakeScript(tokens=4))))
        gateway = stack.enter_context(serve_asgi(Gateway(decode_config(config([url]))).app, lifespan="on"))
        usage = post_chat(gateway, {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}).json()["usage"]
    assert set(usage) == {"prompt_tokens", "completion_tokens", "total_tokens", "completion_tokens_details"}
