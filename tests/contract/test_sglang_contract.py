"""cascade against SGLang's own request and response models (the pinned wheel: tests/contract/sglang_protocol.py).

Every chat body cascade sends to an SGLang backend, through its real path (the gateway over HTTP, its tiers,
choices and reasoning branches, SGLangBackend), is recorded on its way to the fake SGLang server and validated
with SGLang's `ChatCompletionRequest`, which must also declare every field of it (SGLang ignores unknown fields
without a word). SGLang's `to_sampling_params` must then read the sampling fields back. Every response the fake
sends, streamed (what cascade asks for) and whole (the same bodies sent with `"stream": false`), must be what
SGLang's own serializers write for the same content (tests/contract/sglang_wire.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import pytest

from cascade.config import decode_config
from cascade.gateway.server import Gateway
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.script import FakeScript
from cascade.testing.fakes.sglang import FakeSGLang
from tests.contract.sglang_protocol import SGLangProtocol
from tests.contract.sglang_wire import (
    FIXTURES,
    REQUEST_FIXTURES,
    canonical_fixtures,
    sglang_completion,
    sglang_event,
    sse_events,
    validate_request,
)
from tests.servers import Exchange, Recorder

MODEL = "Qwen/Qwen3-8B"
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                       "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                      "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]
# An agent's earlier turn: the assistant called a tool, the tool answered.
TOOL_HISTORY = [
    {"role": "system", "content": "You are a weather bot."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    {"role": "user", "content": [{"type": "text", "text": "And in Rome?"}]},
]
SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
STREAM = {"stream": True, "stream_options": {"include_usage": True}}

# What the gateway is asked for: each case of issue 30, item 4, streamed to the client or not.
CASES: dict[str, dict[str, Any]] = {
    "plain": {},
    "streamed_with_usage": STREAM,
    "n_3": {"n": 3, "seed": 11},
    "branches": {"model": "thinker"},
    "branches_override": {"model": "thinker", "branches": {"n": 2, "m": 1}, "seed": 5},
    "logprobs": {"logprobs": True, "top_logprobs": 3},
    "logprobs_streamed": {"logprobs": True, "top_logprobs": 2, **STREAM},
    "logprobs_without_top": {"logprobs": True},
    "tools_named": {"messages": TOOL_HISTORY, "tools": TOOLS, "parallel_tool_calls": False,
                    "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
    "tools_auto_streamed": {"messages": TOOL_HISTORY, "tools": TOOLS, "tool_choice": "auto", **STREAM},
    "tools_required": {"tools": TOOLS, "tool_choice": "required"},
    "tools_none": {"tools": TOOLS, "tool_choice": "none"},
    "response_format_json_schema": {"response_format": {"type": "json_schema", "json_schema": {
        "name": "answer", "schema": SCHEMA, "strict": True}}},
    "response_format_json_object": {"response_format": {"type": "json_object"}, **STREAM},
    "sampling": {"seed": 7, "stop": ["END", "</answer>"], "top_p": 0.9, "temperature": 0.5, "max_tokens": 12},
    "stop_string": {"stop": "END", "max_completion_tokens": 9},
    "engine_extras": {"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, "presence_penalty": 0.5,
                      "frequency_penalty": 0.25, "logit_bias": {"42": -100}, "reasoning_effort": "low",
                      "chat_template_kwargs": {"enable_thinking": False}, "user": "u-1", "metadata": {"k": "v"}},
    # Issue 64: the effort, the thinking switch and budget (the `direct` tier sets one for `high`), the history's
    # reasoning under either name.
    "effort_high": {"reasoning_effort": "high", "max_completion_tokens": 12},
    "effort_nested_none": {"reasoning": {"effort": "none"}, **STREAM},
    "effort_number": {"reasoning_effort": 0.3, "chat_template_kwargs": {"enable_thinking": True}},
    "effort_routed_branches": {"model": "cascade", "reasoning_effort": "xhigh"},
    # Issue 65: the engine extras SGLang takes, and OpenAI's own fields it does not (never sent).
    "engine_length_extras": {"ignore_eos": True, "min_tokens": 2, "stop_token_ids": [7, 2**31 - 1],
                             "skip_special_tokens": False, "store": True, "service_tier": "flex", "verbosity": "low"},
    "openai_only_streamed": {"stream": True, "stream_options": {"include_usage": True, "include_obfuscation": True},
                             "store": False, "service_tier": "auto", "verbosity": "medium", "min_tokens": 0},
    "history_reasoning": {"messages": [{"role": "user", "content": "2+2?"},
                                       {"role": "assistant", "content": "4", "reasoning": "Two and two."},
                                       {"role": "user", "content": "And 3+3?"}], "reasoning_effort": "low"},
}
BUDGET = 64  # the `direct` tier's thinking budget for `high` (`ladder`)


def ladder(url: str) -> str:
    backend = f'backends = [{{ kind = "sglang", url = "{url}", model = "{MODEL}" }}]'
    return (f'[[tiers]]\nname = "direct"\ndefault_max_tokens = 16\n{backend}\n'
            f'thinking = {{ budget_tokens = {{ high = {BUDGET} }} }}\n'
            f'[[tiers]]\nname = "thinker"\ndefault_max_tokens = 24\nbranches = {{ n = 3, m = 2 }}\n'
            f'scorer = "none"\n{backend}\n')


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, str, Recorder]]:
    """(gateway URL, fake SGLang URL, the recorder in front of the fake)."""
    recorder = Recorder(FakeSGLang(FakeScript(tokens=6, model=MODEL), reasoning="Let me think.",
                                   disconnect_abort_s=30))
    with ExitStack() as stack:
        engine_url = stack.enter_context(serve_asgi(recorder))
        gateway = Gateway(decode_config(ladder(engine_url)))
        yield stack.enter_context(serve_asgi(gateway.app, lifespan="on")), engine_url, recorder


def ask(base: str, case: dict[str, Any]) -> tuple[int, Any]:
    """The gateway's answer to `case`: (status, the JSON body, or the stream's chunks)."""
    body = {"model": "direct", "messages": [{"role": "user", "content": "What is 17*23?"}], **case}
    if not body.get("stream"):
        response = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=20, trust_env=False)
        return response.status_code, response.json()
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=20, trust_env=False) as r:
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: {")]
        return r.status_code, [json.loads(line) for line in lines]


def check_stream(sglang: SGLangProtocol, exchange: Exchange) -> list[dict[str, Any]]:
    """The chunks of a streamed response, each checked to be exactly what SGLang would write."""
    assert (exchange.status, exchange.content_type) == (200, "text/event-stream")
    events = sse_events(exchange.response)
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    for chunk in chunks:
        assert chunk == json.loads(sglang_event(sglang, chunk)[6:]), f"not SGLang's chunk shape: {chunk}"
    return chunks


@pytest.mark.parametrize("name", list(CASES))
def test_every_body_cascade_sends_is_an_sglang_request_and_every_answer_an_sglang_response(
    sglang: SGLangProtocol, served: tuple[str, str, Recorder], name: str,
) -> None:
    base, engine_url, recorder = served
    recorder.exchanges.clear()
    status, answer = ask(base, CASES[name])
    assert status == 200, answer
    sent = list(recorder.exchanges)  # the whole completions asked for below go through the recorder too
    assert sent, "the gateway sent SGLang nothing"
    for exchange in sent:
        request = validate_request(sglang, exchange.body)
        assert request.n == 1 and request.rid  # choices and branches are requests of their own, each with its rid
        body = exchange.body
        sampling = request.to_sampling_params(stop=[], model_generation_config={})
        assert sampling["max_new_tokens"] == body["max_completion_tokens"] == body["max_tokens"]
        assert sampling["sampling_seed"] == body.get("seed")
        for field in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "ignore_eos",
                      "skip_special_tokens", "stop_token_ids"):
            if field in body:
                assert sampling[field] == body[field]
        assert sampling["min_new_tokens"] == body.get("min_tokens", 0)
        if "response_format" in body:
            assert json.loads(sampling["json_schema"]) == (SCHEMA if "json_schema" in body["response_format"]
                                                           else {"type": "object"})
        chunks = check_stream(sglang, exchange)
        if body["stream_options"]["include_usage"] and chunks[-1]["choices"][0:1] != [{}]:
            assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 0
        # The same body, not streamed: SGLang's whole-completion shape.
        whole = httpx.post(f"{engine_url}/v1/chat/completions", json={**body, "stream": False}, timeout=20,
                           trust_env=False)
        assert whole.status_code == 200, whole.text
        assert whole.json() == json.loads(sglang_completion(sglang, whole.json())), "not SGLang's completion shape"


def test_the_thinking_fields_cascade_sends_are_sglangs_own(sglang: SGLangProtocol,
                                                           served: tuple[str, str, Recorder]) -> None:
    """SGLang declares each (validate_request), and reads them where its engine acts on them: the budget in the
    sampling params (strict thinking reads `custom_params.thinking_budget`), the switch in the template kwargs, the
    history's reasoning as `reasoning_content`."""
    base, _, recorder = served
    expected = {"effort_high": ("high", True, BUDGET), "effort_nested_none": ("none", False, None),
                "effort_number": (0.3, True, None), "history_reasoning": ("low", True, None)}
    for name, (effort, thinking, budget) in expected.items():
        recorder.exchanges.clear()
        status, _ = ask(base, CASES[name])
        assert status == 200
        [exchange] = recorder.exchanges
        request = validate_request(sglang, exchange.body)
        assert request.reasoning_effort == effort and "reasoning" not in exchange.body
        kwargs = request.chat_template_kwargs
        # The client's own key comes first (effort_number asked for thinking itself).
        assert kwargs["thinking"] is thinking and kwargs["enable_thinking"] is (thinking or name == "effort_number")
        sampling = request.to_sampling_params(stop=[], model_generation_config={})
        assert sampling["custom_params"] == (None if budget is None else {"thinking_budget": budget})
    sent = recorder.exchanges[0].body["messages"]
    assert sent[1] == {"role": "assistant", "content": "4", "reasoning_content": "Two and two."}


def test_choices_and_branches_go_to_sglang_as_requests_of_their_own(served: tuple[str, str, Recorder]) -> None:
    base, _, recorder = served
    recorder.exchanges.clear()
    status, answer = ask(base, CASES["n_3"])
    assert status == 200 and len(answer["choices"]) == 3
    assert sorted(e.body["seed"] for e in recorder.exchanges) == [11, 12, 13]
    recorder.exchanges.clear()
    status, answer = ask(base, CASES["branches"])
    branches = answer["cascade"]["branches"]
    assert status == 200 and branches["launched"] == 3
    # N 3, M 2: once two finish, the third is cancelled, and on a busy machine that can happen before its request
    # reached the server (seen in a full run on 2 loaded cores). Every request that did arrive is its own, with
    # its own seed.
    assert branches["finished"] >= 2 and 2 <= len(recorder.exchanges) <= 3
    assert len({e.body["seed"] for e in recorder.exchanges}) == len(recorder.exchanges)


def test_the_fakes_tool_calls_and_logprobs_reach_the_client(served: tuple[str, str, Recorder]) -> None:
    base, _, _ = served
    _, named = ask(base, CASES["tools_named"])
    choice = named["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather" and call["id"].startswith("call_")
    assert json.loads(call["function"]["arguments"]) == {"text": "t0 t1 t2 t3 t4 t5 "}
    _, chunks = ask(base, CASES["tools_auto_streamed"])
    pieces = [p for c in chunks for ch in c["choices"] for p in ch["delta"].get("tool_calls") or []]
    assert pieces[0]["function"]["name"] == "get_weather"  # auto: the first tool
    assert "".join(p["function"].get("arguments") or "" for p in pieces) == '{"text": "t0 t1 t2 t3 t4 t5 "}'
    _, plain = ask(base, CASES["tools_none"])
    assert plain["choices"][0]["message"]["content"] == "t0 t1 t2 t3 t4 t5 "
    _, with_logprobs = ask(base, CASES["logprobs"])
    entries = with_logprobs["choices"][0]["logprobs"]["content"]
    assert [len(e["top_logprobs"]) for e in entries] == [3] * len(entries) and entries[0]["token"] == "Let"
    assert all(e["top_logprobs"][0]["logprob"] >= e["top_logprobs"][-1]["logprob"] for e in entries)


def test_the_recorded_requests_are_sglang_requests(sglang: SGLangProtocol) -> None:
    for name in REQUEST_FIXTURES:
        validate_request(sglang, json.loads((FIXTURES / name).read_bytes()))


def test_the_response_fixtures_are_what_the_pinned_sglang_writes(sglang: SGLangProtocol) -> None:
    stale = [name for name, content in canonical_fixtures(sglang).items() if (FIXTURES / name).read_bytes() != content]
    assert not stale, f"{stale} differ from sglang {sglang.version}: run `.venv/bin/python -m tests.contract.sglang_wire`"


def test_sglang_declares_no_field_it_would_drop(sglang: SGLangProtocol) -> None:
    """The check itself: a field SGLang does not know is named, nested ones with their path."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi", "weight": 1}], "metadata": {"k": "v"},
            "stream_options": {"include_usage": True, "chunk_size": 2}}
    with pytest.raises(AssertionError, match=r"`messages\.0\.weight`, `metadata`, `stream_options\.chunk_size`"):
        validate_request(sglang, body)
