"""OpenAI fields cascade does not interpret (tools, response_format, logprobs, sampling extras) reach the
engine as sent, what the engine answers with them (tool calls, logprobs) reaches the client, and a field the
tier's engine would ignore is refused instead of silently dropped. A field past its bound is refused before any engine
is asked, and a chat template in `chat_template_kwargs` is dropped unless the tier trusts it, with a note saying so.

Engines here are `Replay` servers on 127.0.0.1 answering canned OpenAI SSE, and recording what they got.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import msgspec
import pytest

from cascade.config import decode_config, load_config
from cascade.gateway.server import Gateway
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript
from tests.gateway.gateway_setup import post_chat, user
from tests.servers import Replay, Reply


def sse(*chunks: dict) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


def piece(index: int, **function: str) -> dict:
    call: dict = {"index": index, "function": function}
    if "name" in function:
        call.update(id=f"call_{index}", type="function")
    return {"choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}]}


TOOL_CALLS = sse(
    {"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]},
    piece(0, name="get_weather", arguments='{"city": '), piece(0, arguments='"Paris"}'),
    piece(1, name="get_time", arguments="{}"),
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}],
     "usage": {"prompt_tokens": 20, "completion_tokens": 9}},
)
LOGPROBS = sse(
    {"choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None,
                  "logprobs": {"content": [{"token": "Hi", "logprob": -0.1, "bytes": [72, 105], "top_logprobs": []}]}}]},
    {"choices": [{"index": 0, "delta": {"content": "!"}, "finish_reason": None,
                  "logprobs": {"content": [{"token": "!", "logprob": -0.7, "bytes": [33], "top_logprobs": []}]}}]},
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
)
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def engine(body: bytes) -> Replay:
    return Replay({("POST", "/v1/chat/completions"): Reply(body=body, content_type="text/event-stream"),
                   ("GET", "/health"): Reply(body=b"{}")})  # the gateway's background health checks


def chats(replay: Replay) -> list[bytes]:
    """The bodies of the chat requests the engine got (health checks left out)."""
    return [r.body for r in replay.requests if r.method == "POST"]


@contextmanager
def gateway(url: str, tier: str = "", extra: str = "", backend: str = "") -> Iterator[str]:
    toml = (f'{extra}\n[[tiers]]\nname = "agent"\n{tier}\n'
            f'backends = [{{ kind = "openai", url = "{url}", model = "m" {backend} }}]\n')
    gw = Gateway(decode_config(toml))
    with serve_asgi(gw.app, lifespan="on") as base:
        yield base


def test_fields_cascade_does_not_interpret_reach_the_engine_as_sent() -> None:
    replay = engine(LOGPROBS)
    fields = {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
              "parallel_tool_calls": False, "response_format": {"type": "json_object"}, "logprobs": True,
              "top_logprobs": 2, "presence_penalty": 0.5, "frequency_penalty": 0.25, "logit_bias": {"42": -100},
              "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, "chat_template_kwargs": {"enable_thinking": False},
              "user": "u-1", "metadata": {"k": "v"}}
    with serve_asgi(replay) as url, gateway(url) as base:
        response = post_chat(base, {"model": "agent", "messages": user(), "seed": 7, "stop": ["END"], **fields})
        effort = post_chat(base, {"model": "agent", "messages": user(), "reasoning_effort": "low",
                                  "chat_template_kwargs": {"enable_thinking": False}})
    assert response.status_code == 200 and effort.status_code == 200, response.text
    sent, with_effort = (json.loads(body) for body in chats(replay))
    assert {k: sent[k] for k in fields} == fields
    assert (sent["seed"], sent["stop"]) == (7, ["END"])
    # reasoning_effort reaches an engine that takes it, with the thinking switch; the client's own key comes first.
    assert with_effort["reasoning_effort"] == "low"
    assert with_effort["chat_template_kwargs"] == {"enable_thinking": False, "thinking": True}


def test_a_tool_call_answer_reaches_the_client_whole_and_streamed() -> None:
    with serve_asgi(engine(TOOL_CALLS)) as url, gateway(url) as base:
        plain = post_chat(base, {"model": "agent", "messages": user("weather?"), "tools": TOOLS})
        with httpx.stream("POST", f"{base}/v1/chat/completions", timeout=10,
                          json={"model": "agent", "messages": user("weather?"), "tools": TOOLS, "stream": True}) as r:
            chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    choice = plain.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert choice["message"]["tool_calls"] == [
        {"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
    ]
    pieces = [c for ch in chunks for c in ch["choices"] for c in c["delta"].get("tool_calls", [])]
    assert "".join(p["function"].get("arguments", "") for p in pieces if p["index"] == 0) == '{"city": "Paris"}'
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]] \
        == ["tool_calls"]


def test_token_logprobs_reach_the_client_whole_and_streamed() -> None:
    with serve_asgi(engine(LOGPROBS)) as url, gateway(url) as base:
        plain = post_chat(base, {"model": "agent", "messages": user(), "logprobs": True})
        with httpx.stream("POST", f"{base}/v1/chat/completions", timeout=10,
                          json={"model": "agent", "messages": user(), "logprobs": True, "stream": True}) as r:
            chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert [e["token"] for e in plain.json()["choices"][0]["logprobs"]["content"]] == ["Hi", "!"]
    streamed = [e["token"] for ch in chunks for c in ch["choices"] if c.get("logprobs") for e in c["logprobs"]["content"]]
    assert streamed == ["Hi", "!"]


def test_a_branched_tier_answers_a_tool_request_with_one_branch_and_says_so() -> None:
    replay = engine(TOOL_CALLS)
    with serve_asgi(replay) as url, gateway(url, tier="branches = { n = 4, m = 2 }") as base:
        one = post_chat(base, {"model": "agent", "messages": user(), "tools": TOOLS})
        conflict = post_chat(base, {"model": "agent", "messages": user(), "tools": TOOLS, "branches": {"n": 4}})
    assert one.status_code == 200 and len(chats(replay)) == 1
    info = one.json()["cascade"]
    assert info["branches"]["launched"] == 1 and "`tools`" in info["note"]
    assert conflict.status_code == 400 and conflict.json()["error"]["param"] == "branches.n"


@pytest.mark.parametrize("model", ["agent", "cascade:best"])
def test_a_field_the_tiers_engine_would_ignore_is_refused_naming_it(model: str) -> None:
    fake = FakeEngine(FakeScript(tokens=2))
    with serve_asgi(fake) as url, gateway(url, backend=', unsupported_params = ["logprobs"]') as base:
        refused = post_chat(base, {"model": model, "messages": user(), "logprobs": True})
        fine = post_chat(base, {"model": model, "messages": user(), "logprobs": False, "top_k": 5})
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == "logprobs" and "does not support" in error["message"]
    assert fake.stats.requests == 1  # only the request without logprobs reached the engine
    assert fine.status_code == 200


def test_cascade_mode_accepts_a_tool_call_answer_without_escalating() -> None:
    replay = engine(TOOL_CALLS)
    with serve_asgi(replay) as url, serve_asgi(FakeEngine()) as other:
        toml = (f'[routing]\nmode = "cascade"\n[routing.accept]\nbalanced = [0.5]\n'
                f'[[tiers]]\nname = "small"\nbackends = [{{ kind = "openai", url = "{url}", model = "m" }}]\n'
                f'[[tiers]]\nname = "large"\nbackends = [{{ kind = "openai", url = "{other}", model = "m" }}]\n')
        gw = Gateway(decode_config(toml))
        with serve_asgi(gw.app, lifespan="on") as base:
            response = post_chat(base, {"model": "cascade:balanced", "messages": user(), "tools": TOOLS})
    info = response.json()["cascade"]
    assert (info["tier_name"], info["escalations"]) == ("small", 0)
    assert response.json()["choices"][0]["finish_reason"] == "tool_calls"


def test_the_embedded_engine_declares_what_transformers_serve_ignores() -> None:
    from importlib.resources import files

    config = load_config(str(files("cascade.engines") / "embedded.toml"))
    for tier in config.tiers:
        for backend in tier.backends:
            assert {"logprobs", "response_format", "tool_choice"} <= set(backend.unsupported_params)
    assert msgspec.json.encode(config)  # still a valid config


@pytest.mark.parametrize(("field", "value"), [
    ("top_logprobs", 10**9), ("logit_bias", {str(t): 1 for t in range(40_000)}),
    ("tools", [TOOLS[0]] * 8_000), ("metadata", {f"k{i}": "v" for i in range(17)}), ("user", "u" * 257),
    ("presence_penalty", 9.0), ("top_k", 0),
])
def test_a_field_past_its_bound_is_a_400_naming_it_and_no_engine_is_asked(field: str, value: object) -> None:
    fake = FakeEngine(FakeScript(tokens=2))
    with serve_asgi(fake) as url, gateway(url) as base:
        for stream in (False, True):
            response = post_chat(base, {"model": "agent", "messages": user(), "stream": stream, field: value})
            assert response.status_code == 400, response.text
            assert response.json()["error"]["param"] == field and response.json()["error"]["type"] == \
                "invalid_request_error"
    assert fake.stats.requests == 0


TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}"


@pytest.mark.parametrize("stream", [False, True])
def test_a_requests_chat_template_is_dropped_before_the_engine_and_the_note_says_so(stream: bool) -> None:
    replay = engine(LOGPROBS)
    kwargs = {"chat_template": TEMPLATE, "Jinja_Template_Path": "/etc/passwd", "enable_thinking": False}
    with serve_asgi(replay) as url, gateway(url) as base:
        response = post_chat(base, {"model": "agent", "messages": user(), "chat_template_kwargs": kwargs,
                                    "stream": stream})
        only = post_chat(base, {"model": "agent", "messages": user(), "chat_template_kwargs": {"chat_template": "x"}})
    assert response.status_code == 200 and only.status_code == 200
    first, second = (json.loads(body) for body in chats(replay))
    assert first["chat_template_kwargs"] == {"enable_thinking": False}
    assert "chat_template_kwargs" not in second  # nothing left to send
    if stream:
        note = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")][-1]
        note = note["cascade"]["note"]
    else:
        note = response.json()["cascade"]["note"]
    assert "`chat_template_kwargs.chat_template`" in note and "`chat_template_kwargs.Jinja_Template_Path`" in note
    assert "`agent`" in note


def test_a_tier_that_trusts_request_templates_gets_them_as_sent() -> None:
    replay = engine(LOGPROBS)
    kwargs = {"chat_template": TEMPLATE, "enable_thinking": True}
    with serve_asgi(replay) as url, gateway(url, tier="trust_request_chat_template = true") as base:
        response = post_chat(base, {"model": "agent", "messages": user(), "chat_template_kwargs": kwargs})
    assert response.status_code == 200 and response.json()["cascade"]["note"] is None
    assert json.loads(chats(replay)[0])["chat_template_kwargs"] == kwargs
