"""`/v1/responses` driven by the official `openai` SDK (`client.responses`) over real HTTP, on the fake engines: the
Response's shape and headers, the typed stream events, a two-turn conversation through `previous_response_id`,
stored responses read and deleted, the chat request each one becomes (and is billed as), and bad input refused by
name. Keys, limits and Redis: tests/gateway/test_responses_store.py; reasoning and tool calls on SGLang:
tests/gateway/test_responses_sglang.py.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import openai
import pytest

from cascade.testing.fakes.engine import FakeEngine, FakeScript
from cascade.testing.servers import TIERS
from tests.gateway.gateway_setup import running_gateway

TEXT = "".join(f"t{i} " for i in range(8))


class Recorder:
    """A fake engine's hook: the bodies it was sent, in order."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, script: FakeScript, body: dict[str, Any]) -> FakeScript:
        self.bodies.append(body)
        return script


@pytest.fixture(scope="module")
def served():
    recorder = Recorder()
    with running_gateway(engine=FakeEngine(FakeScript(tokens=8), hook=recorder)) as (base, _, _):
        yield base, recorder


@pytest.fixture
def client(served):
    sdk = openai.OpenAI(base_url=f"{served[0]}/v1", api_key="unused", max_retries=0, timeout=10)
    yield sdk
    sdk.close()


def sent(served) -> dict[str, Any]:
    """The last body the engine was sent."""
    return served[1].bodies[-1]


def test_a_whole_response_has_openai_shape_names_its_tier_and_its_bill(client) -> None:
    raw = client.responses.with_raw_response.create(model="cascade:fast", input="hello", max_output_tokens=5)
    response = raw.parse()
    assert re.fullmatch(r"resp_[0-9a-f]{48}", response.id) and response.object == "response"
    assert raw.headers["x-cascade-tier"] == response.model == TIERS[0]
    assert response.created_at > 1_700_000_000 and response.completed_at >= response.created_at
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    [message] = response.output
    assert message.type == "message" and message.role == "assistant" and message.status == "incomplete"
    assert response.output_text == "t0 t1 t2 t3 t4 " == message.content[0].text
    usage = response.usage
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (8, 5, 13)
    assert usage.output_tokens_details.reasoning_tokens == 0 and usage.input_tokens_details.cached_tokens == 0
    info = response.model_extra["cascade"]
    assert info["tier_name"] == TIERS[0] and info["quality"] == "fast"
    assert info["billed"]["total_tokens"] == int(raw.headers["x-cascade-billed-tokens"]) == 13
    assert response.max_output_tokens == 5 and response.model_extra["store"] is True


def test_a_response_is_the_chat_request_it_translates_to_and_is_billed_as_that_request(served, client) -> None:
    answer = client.responses.with_raw_response.create(model=TIERS[1], input="What is 2+2?",
                                                       instructions="Answer briefly.")
    as_responses = sent(served)
    chat = client.chat.completions.with_raw_response.create(
        model=TIERS[1], messages=[{"role": "system", "content": "Answer briefly."},
                                  {"role": "user", "content": "What is 2+2?"}])
    assert as_responses["messages"] == sent(served)["messages"]
    assert answer.headers["x-cascade-billed-tokens"] == chat.headers["x-cascade-billed-tokens"]
    assert answer.parse().output_text == chat.parse().choices[0].message.content == TEXT


def test_every_setting_reaches_the_engine_under_its_chat_name(served, client) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    response = client.responses.create(
        model=TIERS[0], max_output_tokens=7, temperature=0.5, top_p=0.9, user="u-1", metadata={"k": "v"},
        input=[{"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]}],
        reasoning={"effort": "low"}, parallel_tool_calls=False,
        tools=[{"type": "function", "name": "lookup", "parameters": schema, "strict": True}],
        tool_choice={"type": "function", "name": "lookup"},
        text={"format": {"type": "json_schema", "name": "answer", "schema": schema}})
    body = sent(served)
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                              {"type": "text", "text": "b"}]}]
    assert body["reasoning_effort"] == "low" and body["parallel_tool_calls"] is False and body["user"] == "u-1"
    assert body["tools"] == [{"type": "function", "function": {"name": "lookup", "parameters": schema,
                                                                "strict": True}}]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "lookup"}}
    assert body["response_format"] == {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    assert (body["temperature"], body["top_p"], body.get("max_completion_tokens", body.get("max_tokens"))) == (
        0.5, 0.9, 7)
    assert "metadata" not in body  # the response's, not the engine's
    assert response.metadata == {"k": "v"} and response.reasoning.effort == "low"
    assert response.tools[0].name == "lookup" and response.tool_choice.name == "lookup"


def test_a_stream_is_the_typed_events_numbered_in_order_and_ends_with_the_whole_response(client) -> None:
    events = list(client.responses.create(model="cascade:fast", input="stream me", stream=True))
    kinds = [e.type for e in events]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", *[d.type for d in deltas], "response.output_text.done",
                     "response.content_part.done", "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    done = events[-1].response
    assert "".join(d.delta for d in deltas) == done.output_text == TEXT
    assert {d.item_id for d in deltas} == {done.output[0].id} and done.status == "completed"
    assert done.usage.output_tokens == 8 and done.model == TIERS[0]
    assert done.model_extra["cascade"]["billed"]["total_tokens"] == 16
    assert client.responses.retrieve(done.id).output_text == TEXT  # stored when the stream ended


def test_each_event_is_named_on_its_own_sse_line_and_the_stream_names_its_tier(served) -> None:
    body = {"model": "cascade:best", "input": "hi", "stream": True}
    with httpx.stream("POST", f"{served[0]}/v1/responses", json=body, timeout=10) as response:
        assert response.headers["content-type"] == "text/event-stream"
        assert response.headers["x-cascade-tier"] == TIERS[2]
        lines = [line for line in response.iter_lines() if line]
    names, datas = lines[0::2], lines[1::2]
    assert all(n.startswith("event: ") for n in names) and all(d.startswith("data: ") for d in datas)
    assert [n.removeprefix("event: ") for n in names] == [json.loads(d.removeprefix("data: "))["type"] for d in datas]


def test_a_second_turn_gets_the_first_turns_input_and_answer_but_not_its_instructions(served, client) -> None:
    first = client.responses.create(model=TIERS[0], input="My name is Ada.", instructions="Be terse.")
    second = client.responses.create(model=TIERS[0], input="What is my name?", previous_response_id=first.id)
    assert sent(served)["messages"] == [{"role": "user", "content": "My name is Ada."},
                                        {"role": "assistant", "content": TEXT},
                                        {"role": "user", "content": "What is my name?"}]
    assert second.previous_response_id == first.id and second.instructions is None
    stream = client.responses.create(model=TIERS[0], input="And again?", previous_response_id=second.id,
                                     instructions="Be kind.", stream=True)
    third = [e for e in stream][-1].response
    assert [m["role"] for m in sent(served)["messages"]] == ["system", "user", "assistant", "user", "assistant",
                                                             "user"]
    assert sent(served)["messages"][0] == {"role": "system", "content": "Be kind."}
    assert third.previous_response_id == second.id and third.instructions == "Be kind."


def test_a_stored_response_is_read_as_created_then_deleted_for_good(served, client) -> None:
    created = client.responses.with_raw_response.create(model=TIERS[0], input="keep me")
    response = created.parse()
    got = httpx.get(f"{served[0]}/v1/responses/{response.id}", timeout=5)
    assert got.status_code == 200 and got.json() == json.loads(created.content)
    deleted = httpx.delete(f"{served[0]}/v1/responses/{response.id}", timeout=5)
    assert deleted.status_code == 200 and deleted.json() == {"id": response.id, "object": "response.deleted",
                                                             "deleted": True}
    for attempt in (lambda: client.responses.retrieve(response.id), lambda: client.responses.delete(response.id)):
        with pytest.raises(openai.NotFoundError) as info:
            attempt()
        assert info.value.body["param"] == "response_id"


def test_a_response_not_stored_is_not_found_by_id_nor_by_a_next_turn(client) -> None:
    response = client.responses.create(model=TIERS[0], input="forget me", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(model=TIERS[0], input="hi", previous_response_id=response.id)
    assert info.value.body["param"] == "previous_response_id"
    assert info.value.body["message"] == f"Response with id '{response.id}' not found."


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"input": "x", "extra_body": {"truncation": "auto"}}, "truncation"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]},
     "input[0].content[0].type"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
    ({"input": "x", "max_output_tokens": 10**9}, "max_output_tokens"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "s"}}}, "text.format.schema"),
    ({"input": "x", "text": {"verbosity": "low"}}, "text.verbosity"),
    ({"input": "x", "temperature": 3}, "temperature"),
    ({"input": "x", "metadata": {"k" * 65: "v"}}, "metadata"),
    ({"input": "x", "reasoning": {"effort": "high", "context": "auto"}}, "reasoning.context"),
    ({"input": "x", "extra_body": {"quality": "bogus"}}, "quality"),
])
def test_bad_input_is_a_400_naming_the_field_as_this_api_names_it(client, kwargs: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="cascade", **kwargs)
    assert info.value.body["param"] == param, info.value.body
    assert info.value.body["type"] == "invalid_request_error"


def test_a_fault_after_the_headers_ends_the_stream_with_error_and_failed_and_keeps_nothing(client) -> None:
    events = list(client.responses.create(model=TIERS[0], input="[fake tokens=20 fault=kill_mid]", stream=True))
    assert [e.type for e in events[-2:]] == ["error", "response.failed"]
    failed = events[-1].response
    assert failed.status == "failed" and failed.error.code == "server_error" and events[-2].message
    assert [e.sequence_number for e in events] == list(range(len(events)))
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(failed.id)


def test_a_whole_float_where_an_int_is_meant_is_read_as_that_int_as_on_chat_completions(served) -> None:
    body = {"model": TIERS[0], "input": "x", "max_output_tokens": 3.0}
    reply = httpx.post(f"{served[0]}/v1/responses", json=body, timeout=10)
    assert reply.status_code == 200, reply.text
    assert reply.json()["max_output_tokens"] == 3 and reply.json()["usage"]["output_tokens"] == 3
    fraction = httpx.post(f"{served[0]}/v1/responses", json={**body, "max_output_tokens": 3.5}, timeout=10)
    assert fraction.status_code == 400 and fraction.json()["error"]["param"] == "max_output_tokens"


def test_reasoning_items_sent_back_are_left_out_of_the_prompt(served, client) -> None:
    client.responses.create(model=TIERS[0], input=[
        {"role": "user", "content": "q"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "a", "annotations": []}]},
        {"role": "user", "content": "q2"}])
    assert sent(served)["messages"] == [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                                        {"role": "user", "content": "q2"}]
