"""What a hostile client's `/v1/responses` body does: input items of every shape and none (wrong types, unknown item
kinds, huge numbers, long runs, JSON nested deep inside them) are either the chat messages they stand for or a 400
naming where in `input` they went wrong, never anything else; nesting past `max_json_depth` is refused before decoding
and a body past `max_body_bytes` before it is read whole. And the stream translator, fed any sequence of chat deltas,
numbers its events in order and closes every item it opens with exactly the text it streamed."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cascade.config import Limits
from cascade.errors import InvalidRequest
from cascade.schemas import ChatMessage
from cascade.service.bodies import decode_body
from cascade.service.responses_api.answer import head
from cascade.service.responses_api.items import input_messages
from cascade.service.responses_api.stream import ResponseEvents
from cascade.service.responses_api.wire import ResponsesRequest
from cascade.testing.fakes.engine import FakeScript
from tests.gateway.gateway_setup import running_gateway

LIMITS = Limits()
_decode = msgspec.json.Decoder(ResponsesRequest).decode

RUN = st.tuples(st.sampled_from(["a", "1", " ", "\n", "é", "🙂", "{", "[", '"', "\\", "<|im_end|>"]),
                st.integers(1, 20_000)).map(lambda r: r[0] * r[1])
TEXT = st.one_of(st.text(max_size=20), RUN)
SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False), TEXT)
JSON = st.recursive(SCALAR, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                    st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                    max_leaves=30)
PART = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["input_text", "output_text"]), "text": TEXT}),
    st.fixed_dictionaries({"type": st.just("refusal"), "refusal": TEXT}),
    st.fixed_dictionaries({"type": st.sampled_from(["input_image", "input_file", "", "text"]), "text": JSON}),
    JSON,
)
ITEM = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "developer", "tool", "x"]),
                           "content": st.one_of(TEXT, st.lists(PART, max_size=5), JSON)},
                          optional={"type": st.sampled_from(["message", "mesage"]), "id": TEXT,
                                    "status": st.sampled_from(["completed", "done"])}),
    st.fixed_dictionaries({"type": st.just("function_call"), "call_id": TEXT, "name": TEXT, "arguments": JSON}),
    st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": TEXT,
                           "output": st.one_of(TEXT, st.lists(PART, max_size=3))}),
    st.fixed_dictionaries({"type": st.sampled_from(["reasoning", "item_reference", "web_search_call"])},
                          optional={"id": TEXT, "summary": JSON, "content": JSON}),
    st.dictionaries(st.text(max_size=10), JSON, max_size=5),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(items=st.lists(ITEM, max_size=8), depth=st.integers(0, 300))
def test_any_input_items_are_messages_or_a_400_naming_where_in_input(items: list[Any], depth: int) -> None:
    nested: Any = "leaf"
    for _ in range(depth):  # a tool schema's depth
        nested = {"k": [nested]}
    body = msgspec.json.encode({"model": "cascade", "input": items,
                                "tools": [{"type": "function", "name": "f", "parameters": {"schema": nested}}]})
    try:
        req = decode_body(body, _decode, "a request", max_depth=LIMITS.max_json_depth)
        messages = input_messages(req.input)
    except InvalidRequest as exc:
        assert (exc.param is None and exc.code == "nesting_too_deep") or (exc.param or "").startswith("input"), exc
        assert len(exc.message) < 2_000 or exc.message.startswith("`input")
        return
    assert all(isinstance(m, ChatMessage) for m in messages)
    assert sum(m.role == "tool" for m in messages) == sum(i.get("type") == "function_call_output"
                                                          for i in req.input)


@given(items=st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system"]),
                                             "content": st.one_of(TEXT, st.lists(st.fixed_dictionaries(
                                                 {"type": st.just("input_text"), "text": TEXT}), min_size=1,
                                                 max_size=4))}), min_size=1, max_size=6))
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
def test_message_items_keep_their_role_and_text(items: list[dict[str, Any]]) -> None:
    messages = input_messages(items)
    assert [m.role for m in messages] == [i["role"] for i in items]
    assert [m.text() for m in messages] == [
        i["content"] if isinstance(i["content"], str) else "".join(p["text"] for p in i["content"]) for i in items]


def test_a_body_past_the_size_limit_is_a_413_and_one_nested_past_the_depth_limit_a_400() -> None:
    with running_gateway(FakeScript(tokens=2)) as (base, _, _):
        huge = httpx.post(f"{base}/v1/responses", json={"model": "cascade", "input": "x" * LIMITS.max_body_bytes},
                          timeout=10)
        assert huge.status_code == 413 and huge.json()["error"]["code"] == "request_too_large"
        nested = '"x"'
        for _ in range(3_000):
            nested = f'[{{"role":"user","content":{nested}}}]'
        deep = httpx.post(f"{base}/v1/responses", content=f'{{"model":"cascade","input":{nested}}}'.encode(),
                          headers={"content-type": "application/json"}, timeout=10)
        assert deep.status_code == 400 and deep.json()["error"]["code"] == "nesting_too_deep"
        assert httpx.get(f"{base}/health", timeout=5).status_code == 200


# --- the stream translator ------------------------------------------------------------------------------------

DELTA = st.one_of(
    st.builds(lambda t: {"content": t}, st.text(min_size=1, max_size=5)),
    st.builds(lambda t: {"reasoning_content": t}, st.text(min_size=1, max_size=5)),
    st.builds(lambda i, new, a: {"tool_calls": [{"index": i, **({"id": f"call-{i}", "function": {
        "name": f"f{i}", "arguments": a}} if new else {"function": {"arguments": a}})}]},
        st.integers(0, 3), st.booleans(), st.text(max_size=5)),
)


def _chunk(fields: dict[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": fields, "finish_reason": finish}
    return b"data: " + msgspec.json.encode({"model": "m", "choices": [choice]}) + b"\n\n"


@settings(max_examples=200, deadline=None)
@given(deltas=st.lists(DELTA, max_size=30), cut=st.integers(1, 64), finish=st.sampled_from(["stop", "length"]))
def test_any_chat_stream_becomes_events_in_order_with_every_item_closed_on_its_text(
        deltas: list[dict[str, Any]], cut: int, finish: str) -> None:
    body = b"".join(_chunk(d) for d in deltas) + _chunk({}, finish) + b"data: [DONE]\n\n"
    frames = [body[i:i + cut] for i in range(0, len(body), cut)]  # SSE blocks cut anywhere
    start = head(msgspec.convert({"model": "m", "input": "x"}, ResponsesRequest), "resp_" + "0" * 48, "m")

    async def run() -> list[dict[str, Any]]:
        translator = ResponseEvents(start)
        out = translator.opening() + b"".join(translator.translate(f) for f in frames) + await translator.closing()
        blocks = [b for b in out.split(b"\n\n") if b]
        return [msgspec.json.decode(b.split(b"\ndata: ", 1)[1]) for b in blocks]

    events = asyncio.run(run())
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    added = {e["output_index"]: e["item"] for e in events if e["type"] == "response.output_item.added"}
    done = {e["output_index"]: e["item"] for e in events if e["type"] == "response.output_item.done"}
    assert sorted(added) == sorted(done) == list(range(len(done)))
    final = events[-1]["response"]
    assert final["output"] == [done[i] for i in range(len(done))]
    streamed = {}
    for e in events:
        if e["type"] in ("response.output_text.delta", "response.reasoning_text.delta",
                         "response.function_call_arguments.delta"):
            streamed[e["output_index"]] = streamed.get(e["output_index"], "") + e["delta"]
    for index, item in done.items():
        text = item.get("arguments") if item["type"] == "function_call" else "".join(
            c["text"] for c in item["content"])
        assert text == streamed.get(index, "")
    text = "".join(d.get("content", "") for d in deltas)
    assert "".join(c["text"] for i in final["output"] if i["type"] == "message" for c in i["content"]) == text
    assert final["status"] == ("incomplete" if finish == "length" else "completed")
