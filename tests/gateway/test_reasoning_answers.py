"""An answer's reasoning as a client gets it (issue 64, item 2), over real HTTP in front of fake engines: under both
`reasoning_content` and `reasoning` (or the names `[gateway] reasoning_fields` lists), whichever the engine sent,
in whole answers and stream deltas, with `usage.completion_tokens_details.reasoning_tokens` (the engine's count where
it reports one, the strict SGLang fake; counted otherwise, the vLLM-style fake that sends `reasoning` and no count);
and a history's reasoning, under either name, sent to each engine under the one it reads."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cascade.config import decode_config
from cascade.gateway.server import Gateway
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript
from cascade.testing.fakes.sglang import FakeSGLang
from tests.gateway.gateway_setup import post_chat, user
from tests.servers import Recorder

THOUGHT = "Let me add the two numbers first."  # 7 words: 7 reasoning tokens on either fake
WORDS = len(THOUGHT.split())
ANSWER_TOKENS = 4


@contextmanager
def gateway(engine: Any, kind: str, head: str = "", tier: str = "") -> Iterator[tuple[str, Recorder]]:
    """A gateway whose tiers `direct` (one branch) and `thinker` (two branches voting) sit on `engine` (backends of
    `kind`); yields its URL and the recorder in front of the engine."""
    recorder = Recorder(engine)
    with ExitStack() as stack:
        url = stack.enter_context(serve_asgi(recorder))
        backend = f'backends = [{{ kind = "{kind}", url = "{url}", model = "m" }}]'
        toml = (f'{head}\n[[tiers]]\nname = "direct"\n{backend}\n{tier}\n'
                f'[[tiers]]\nname = "thinker"\nscorer = "none"\nbranches = {{ n = 2, m = 2 }}\n{backend}\n{tier}\n')
        base = stack.enter_context(serve_asgi(Gateway(decode_config(toml)).app, lifespan="on"))
        yield base, recorder


def sglang() -> FakeSGLang:
    return FakeSGLang(FakeScript(tokens=ANSWER_TOKENS), reasoning=THOUGHT, disconnect_abort_s=30)


def vllm() -> FakeEngine:
    return FakeEngine(FakeScript(tokens=ANSWER_TOKENS), reasoning=THOUGHT, reasoning_field="reasoning")


ENGINES = [pytest.param(sglang, "sglang", id="sglang-reasoning_content"),
           pytest.param(vllm, "openai", id="vllm-reasoning")]


def streamed(base: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=20) as response:
        assert response.status_code == 200
        return [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]


def joined(chunks: list[dict[str, Any]], name: str) -> str:
    return "".join(c["delta"].get(name) or "" for chunk in chunks for c in chunk["choices"])


@pytest.mark.parametrize(("make", "kind"), ENGINES)
@pytest.mark.parametrize("model", ["direct", "thinker"])
def test_reasoning_comes_back_under_both_names_with_its_token_count(make: Any, kind: str, model: str) -> None:
    with gateway(make(), kind) as (base, _):
        whole = post_chat(base, {"model": model, "messages": user()})
        chunks = streamed(base, {"model": model, "messages": user()})
    assert whole.status_code == 200, whole.text
    message = whole.json()["choices"][0]["message"]
    assert message["reasoning_content"] == message["reasoning"] == THOUGHT
    usage = whole.json()["usage"]
    assert usage["completion_tokens_details"] == {"reasoning_tokens": WORDS}
    assert usage["completion_tokens"] == WORDS + ANSWER_TOKENS
    assert joined(chunks, "reasoning_content") == joined(chunks, "reasoning") == THOUGHT
    assert chunks[-1]["usage"]["completion_tokens_details"] == {"reasoning_tokens": WORDS}
    # Every delta that carries reasoning carries it under both names, the same piece.
    pieces = [c["delta"] for chunk in chunks for c in chunk["choices"] if "reasoning" in c["delta"]]
    assert pieces and all(d["reasoning"] == d["reasoning_content"] for d in pieces)


@pytest.mark.parametrize(("names", "absent"), [(["reasoning"], "reasoning_content"),
                                               (["reasoning_content"], "reasoning")])
def test_the_gateway_names_reasoning_as_configured(names: list[str], absent: str) -> None:
    head = f"[gateway]\nreasoning_fields = {json.dumps(names)}"
    with gateway(vllm(), "openai", head) as (base, _):
        whole = post_chat(base, {"model": "direct", "messages": user()})
        chunks = streamed(base, {"model": "direct", "messages": user()})
    message = whole.json()["choices"][0]["message"]
    assert message[names[0]] == THOUGHT and absent not in message
    assert joined(chunks, names[0]) == THOUGHT and joined(chunks, absent) == ""


def test_no_names_hides_the_reasoning_but_not_its_tokens() -> None:
    with gateway(sglang(), "sglang", "[gateway]\nreasoning_fields = []") as (base, _):
        whole = post_chat(base, {"model": "direct", "messages": user()})
        chunks = streamed(base, {"model": "direct", "messages": user()})
    message = whole.json()["choices"][0]["message"]
    assert "reasoning" not in message and "reasoning_content" not in message
    assert whole.json()["usage"]["completion_tokens_details"] == {"reasoning_tokens": WORDS}
    assert not any(c["delta"].get("reasoning") or c["delta"].get("reasoning_content")
                   for chunk in chunks for c in chunk["choices"])
    assert joined(chunks, "content") == whole.json()["choices"][0]["message"]["content"]


def test_an_answer_without_reasoning_reports_none() -> None:
    with gateway(FakeEngine(FakeScript(tokens=3)), "openai") as (base, _):
        whole = post_chat(base, {"model": "direct", "messages": user()})
    message = whole.json()["choices"][0]["message"]
    assert (message["reasoning"], message["reasoning_content"]) == (None, None)
    assert whole.json()["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}


HISTORY = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4", "reasoning": "Two and two."},
           {"role": "assistant", "content": "5", "reasoning_content": "Off by one.", "reasoning": "ignored"},
           {"role": "user", "content": "3+3?"}]


@pytest.mark.parametrize(("kind", "tier", "field"), [
    ("sglang", "", "reasoning_content"), ("openai", "", "reasoning_content"),
    ("openai", 'thinking = { history_field = "reasoning" }', "reasoning"),
])
def test_the_historys_reasoning_reaches_each_engine_under_the_name_it_reads(kind: str, tier: str,
                                                                           field: str) -> None:
    engine = sglang() if kind == "sglang" else vllm()
    with gateway(engine, kind, tier=tier) as (base, recorder):
        assert post_chat(base, {"model": "direct", "messages": HISTORY}).status_code == 200
    sent = recorder.bodies[0]["messages"]
    other = "reasoning" if field == "reasoning_content" else "reasoning_content"
    # A turn with both keeps `reasoning_content` (SGLang's name, the one OpenAI-compatible servers wrote first).
    assert [m.get(field) for m in sent] == [None, "Two and two.", "Off by one.", None]
    assert not any(other in m for m in sent)


def test_only_the_two_names_may_be_configured() -> None:
    from cascade.errors import ConfigError

    tier = '[[tiers]]\nname = "a"\nbackends = [{ kind = "openai", url = "http://127.0.0.1:9", model = "m" }]\n'
    assert decode_config(tier).gateway.reasoning_fields == ("reasoning_content", "reasoning")
    with pytest.raises(ConfigError, match="reasoning_fields"):
        decode_config('[gateway]\nreasoning_fields = ["thoughts"]\n' + tier)


TURN_TEXT = st.one_of(st.none(), st.text(max_size=30), st.integers(1, 50_000).map(lambda n: "think " * n))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(turns=st.lists(st.tuples(TURN_TEXT, TURN_TEXT), min_size=1, max_size=8))
def test_a_historys_reasoning_is_kept_under_one_name_whatever_each_turn_sends(
        turns: list[tuple[str | None, str | None]]) -> None:
    from cascade.service.bodies import decode_chat_request

    messages = [{"role": "assistant", "content": "a", **({} if rc is None else {"reasoning_content": rc}),
                 **({} if r is None else {"reasoning": r})} for rc, r in turns]
    raw = json.dumps({"model": "cascade", "messages": messages}).encode()
    req = decode_chat_request(raw, max_depth=64)
    assert [(m.reasoning_content, m.reasoning) for m in req.messages] == [
        (rc if rc is not None else r, None) for rc, r in turns]
