"""The fake engine's prefix cache (cascade/testing/fakes/prefix_cache.py, `cascade fake-server --prefix-cache-tokens`):
what it holds and evicts, the time to first token it scripts, and the usage it reports over HTTP."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cascade.cli import main
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript
from cascade.testing.fakes.prefix_cache import PrefixCache, message_tokens

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}


def conversation(name: str, turns: int) -> list[dict[str, Any]]:
    """A conversation's prompt at its `turns`-th turn (the earlier turns and their answers, then the new question)."""
    messages: list[dict[str, Any]] = [SYSTEM]
    for turn in range(turns):
        if turn:
            messages.append({"role": "assistant", "content": f"{name} answer {turn - 1}"})
        messages.append({"role": "user", "content": f"{name} question {turn}"})
    return messages


def tokens(messages: list[dict[str, Any]]) -> int:
    return sum(message_tokens(m["content"]) for m in messages)


def test_a_later_turn_finds_the_earlier_prompt_cached() -> None:
    cache = PrefixCache(10_000)
    first, second = conversation("a", 1), conversation("a", 2)
    assert cache.admit(first) == (tokens(first), 0)
    assert cache.admit(second) == (tokens(second), tokens(first))  # the answer and the new question are not
    other = conversation("b", 1)
    assert cache.admit(other) == (tokens(other), message_tokens(SYSTEM["content"]))  # the shared system prompt


def test_a_repeated_prompt_still_computes_its_last_token() -> None:
    cache = PrefixCache(10_000)
    prompt = conversation("a", 1)
    cache.admit(prompt)
    assert cache.admit(prompt) == (tokens(prompt), tokens(prompt) - 1)


def test_the_least_recently_used_prefixes_are_evicted_longest_first() -> None:
    a1 = conversation("a", 1)
    cache = PrefixCache(tokens(a1) + 1)  # room for one conversation's first turn, not two
    cache.admit(a1)
    cache.admit(conversation("b", 1))  # evicts a's question, never the system prompt both share
    assert cache.held_tokens <= cache.capacity_tokens
    assert cache.admit(conversation("a", 2))[1] == message_tokens(SYSTEM["content"])


def test_ttft_falls_with_the_share_of_the_prompt_cached() -> None:
    cache = PrefixCache(100, cached_ttft_ms=10.0)
    assert cache.ttft_ms(200.0, 100, 0) == 200.0
    assert cache.ttft_ms(200.0, 100, 100) == 10.0
    assert cache.ttft_ms(200.0, 100, 50) == pytest.approx(105.0)
    assert cache.ttft_ms(200.0, 0, 0) == 200.0


def test_a_bad_cache_size_is_refused() -> None:
    with pytest.raises(ValueError, match="capacity_tokens"):
        PrefixCache(0)
    assert main(["fake-server", "--prefix-cache-tokens", "100", "--cached-ttft-ms", "-1"]) == 2


JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=50),
                       lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner,
                                                                                   max_size=5), max_leaves=30)
MESSAGE = st.one_of(JSONISH, st.fixed_dictionaries({"role": st.text(max_size=10), "content": JSONISH}),
                    st.fixed_dictionaries({"role": st.just("user"), "content": st.lists(
                        st.fixed_dictionaries({"type": st.just("text"), "text": JSONISH}), max_size=5)}))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies=st.lists(st.one_of(JSONISH, st.lists(MESSAGE, max_size=20)), min_size=1, max_size=5),
       capacity=st.integers(1, 500))
def test_any_body_gets_counts_within_the_prompt_and_the_cache_within_its_capacity(bodies: list[Any],
                                                                                  capacity: int) -> None:
    cache = PrefixCache(capacity)
    for messages in bodies:
        prompt, cached = cache.admit(messages)
        assert 0 <= cached <= max(0, prompt - 1)
        assert 0 <= cache.held_tokens <= capacity


# --- over HTTP ----------------------------------------------------------------------------------------------


def chat(url: str, messages: list[dict[str, Any]], stream: bool) -> dict[str, Any]:
    body = {"model": "fake-model", "messages": messages, "stream": stream,
            "stream_options": {"include_usage": True}}
    if not stream:
        response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=10)
        return response.json()["usage"]
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=10) as response:
        lines = [line for line in response.iter_lines() if line.startswith("data: {")]
    return next(json.loads(line[6:])["usage"] for line in lines if '"usage"' in line)


@pytest.mark.parametrize("stream", [False, True])
def test_the_engine_reports_cached_tokens_in_usage(stream: bool) -> None:
    engine = FakeEngine(FakeScript(tokens=2), prefix_cache=PrefixCache(10_000, cached_ttft_ms=1.0))
    with serve_asgi(engine) as url:
        first = chat(url, conversation("a", 1), stream)
        second = chat(url, conversation("a", 2), stream)
    assert first["prompt_tokens_details"] == {"cached_tokens": 0}
    assert second == {"prompt_tokens": tokens(conversation("a", 2)), "completion_tokens": 2,
                      "total_tokens": tokens(conversation("a", 2)) + 2,
                      "prompt_tokens_details": {"cached_tokens": tokens(conversation("a", 1))}}
    assert (engine.stats.prompt_tokens, engine.stats.cached_tokens) == (
        tokens(conversation("a", 1)) + tokens(conversation("a", 2)), tokens(conversation("a", 1)))


def test_without_a_prefix_cache_usage_is_as_before() -> None:
    engine = FakeEngine(FakeScript(tokens=2))
    with serve_asgi(engine) as url:
        assert chat(url, conversation("a", 2), stream=False) == {"prompt_tokens": 8, "completion_tokens": 2,
                                                                  "total_tokens": 10}
    assert engine.stats.prompt_tokens == 0
