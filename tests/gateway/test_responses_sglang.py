"""`/v1/responses` on a tier served by the fake SGLang (its reasoning and tool calls in SGLang's own shapes), driven by
the official `openai` SDK: the reasoning text becomes a `reasoning` item (and `response.reasoning_text.*` events), a
tool call a `function_call` item (and `response.function_call_arguments.*` events), and a `function_call_output` sent
back after it reaches the engine as the chat turn it stands for."""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

import openai
import pytest

from cascade.config import decode_config
from cascade.gateway.server import Gateway
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.script import FakeScript
from cascade.testing.fakes.sglang import FakeSGLang

THOUGHT = "Let me think it through."
TOOLS = [{"type": "function", "name": "get_weather", "strict": False,
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]


class RecordingSGLang(FakeSGLang):
    """The fake SGLang, keeping every chat body it plans an answer for."""

    def __init__(self) -> None:
        super().__init__(FakeScript(tokens=4, model="fake-1"), reasoning=THOUGHT)
        self.bodies: list[dict[str, Any]] = []

    def plan(self, body: dict[str, Any], script: FakeScript) -> tuple[list[Any], str]:
        self.bodies.append(body)
        return super().plan(body, script)


@pytest.fixture(scope="module")
def thinker():
    engine = RecordingSGLang()
    with ExitStack() as stack:
        url = stack.enter_context(serve_asgi(engine))
        config = decode_config(f'[[tiers]]\nname = "thinker"\ndefault_max_tokens = 64\n'
                               f'backends = [{{ kind = "sglang", url = "{url}", model = "fake-1" }}]\n')
        base = stack.enter_context(serve_asgi(Gateway(config).app, lifespan="on"))
        sdk = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=10)
        stack.callback(sdk.close)
        yield sdk, engine


def test_reasoning_text_is_a_reasoning_item_before_the_message(thinker) -> None:
    client, _ = thinker
    response = client.responses.create(model="thinker", input="hi", reasoning={"effort": "high"})
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and reasoning.summary == []
    assert [(c.type, c.text) for c in reasoning.content] == [("reasoning_text", THOUGHT)]
    assert message.type == "message" and response.output_text == "t0 t1 t2 t3 "


def test_a_streamed_reasoning_item_closes_before_the_message_opens(thinker) -> None:
    client, _ = thinker
    events = list(client.responses.create(model="thinker", input="hi", stream=True))
    kinds = [e.type for e in events]
    thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert thought == THOUGHT
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")
    added = [e.item.type for e in events if e.type == "response.output_item.added"]
    assert added == ["reasoning", "message"]
    assert [e.output_index for e in events if e.type == "response.output_item.done"] == [0, 1]
    done = events[-1].response
    assert done.output[0].content[0].text == THOUGHT and done.output_text == "t0 t1 t2 t3 "
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_a_tool_call_is_a_function_call_item_and_its_output_goes_back_as_a_tool_turn(thinker) -> None:
    client, engine = thinker
    called = client.responses.create(model="thinker", input="Weather in Paris?", tools=TOOLS)
    [call] = [item for item in called.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id and call.status == "completed"
    follow = client.responses.create(model="thinker", previous_response_id=called.id, tools=TOOLS, tool_choice="none",
                                     input=[{"type": "function_call_output", "call_id": call.call_id,
                                             "output": "sunny"}])
    messages = engine.bodies[-1]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    [sent_call] = messages[1]["tool_calls"]
    assert sent_call["id"] == call.call_id and sent_call["function"] == {"name": "get_weather",
                                                                         "arguments": call.arguments}
    assert messages[2]["tool_call_id"] == call.call_id and messages[2]["content"] == "sunny"
    assert follow.output_text == "t0 t1 t2 t3 "


def test_a_streamed_tool_call_is_its_arguments_in_pieces_then_the_whole_call(thinker) -> None:
    client, _ = thinker
    events = list(client.responses.create(model="thinker", input="Weather?", tools=TOOLS, stream=True))
    [added] = [e for e in events if e.type == "response.output_item.added" and e.item.type == "function_call"]
    pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    [done] = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert added.item.name == "get_weather" and added.item.status == "in_progress"
    assert "".join(pieces) == done.arguments and done.item_id == added.item.id
    [call] = [item for item in events[-1].response.output if item.type == "function_call"]
    assert call.arguments == done.arguments and call.call_id == added.item.call_id
