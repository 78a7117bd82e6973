"""What a client sends to `POST /v1/responses`, as msgspec Structs decoded strictly: an unknown field is a 400 naming
it (cascade/service/bodies.py), as on chat completions. Names and shapes are the official `openai` SDK's
(`openai/types/responses/`: `response_create_params.py`, `easy_input_message_param.py`, `response_input_item_param.py`,
`function_tool_param.py`, `response_text_config_param.py`; `openai/types/shared_params/reasoning.py`);
what cascade does not serve (hosted tools, images, files, prompt templates, background runs) is not here, so it is
refused by name rather than dropped.

`input` items are decoded one by one (cascade/service/responses_api/items.py): a message may leave out its `type`, and
msgspec's tagged unions need the tag.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

Status = Literal["in_progress", "completed", "incomplete"]


class _Strict(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    pass


class InputText(_Strict, tag_field="type", tag="input_text"):
    text: str


class OutputText(_Strict, tag_field="type", tag="output_text"):
    """An assistant message's text, as a client sends an earlier answer back."""

    text: str
    annotations: list[Any] = msgspec.field(default_factory=list)
    logprobs: list[Any] | None = None


class Refusal(_Strict, tag_field="type", tag="refusal"):
    refusal: str


ContentPart = InputText | OutputText | Refusal


class MessageItem(_Strict, kw_only=True):
    """A message: `EasyInputMessage` (any role, content a string or parts, `type` optional), an input `Message`, or an
    earlier answer's `ResponseOutputMessage` (`id`, `status`)."""

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]
    id: str | None = None
    status: Status | None = None
    phase: Literal["commentary", "final_answer"] | None = None


class FunctionCallItem(_Strict):
    """A tool call the model made in an earlier turn, sent back with its output."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: Status | None = None


class FunctionCallOutputItem(_Strict):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[ContentPart]
    id: str | None = None
    status: Status | None = None


class ReasoningItem(_Strict):
    """An earlier turn's reasoning sent back: accepted and left out of the prompt (chat templates drop earlier turns'
    thinking; cascade keeps none of it in a stored conversation either)."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[Any] = msgspec.field(default_factory=list)
    content: list[Any] | None = None
    encrypted_content: str | None = None
    status: Status | None = None


InputItem = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem


class FunctionTool(_Strict):
    """A function tool; any other `type` (hosted tools) is a 400 naming `tools[i].type`. (Untagged: a lone tagged
    Struct would decode without its `type`.)"""

    type: Literal["function"]
    name: str
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    description: str | None = None


class ToolChoiceFunction(_Strict):
    type: Literal["function"]
    name: str


class FormatText(_Strict, tag_field="type", tag="text"):
    pass


class FormatJsonObject(_Strict, tag_field="type", tag="json_object"):
    pass


class FormatJsonSchema(_Strict, tag_field="type", tag="json_schema"):
    name: str
    schema: dict[str, Any]
    description: str | None = None
    strict: bool | None = None


class TextConfig(_Strict):
    format: FormatText | FormatJsonObject | FormatJsonSchema | None = None


class ReasoningConfig(_Strict):
    """`effort` becomes the chat request's `reasoning_effort` (its values and meaning are that field's). `summary`:
    cascade's engines write no summaries; the reasoning text itself is the `reasoning` item's `content`."""

    effort: str | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None  # the SDK's deprecated name of `summary`


class ResponsesRequest(_Strict):
    model: str
    # A string is one user message; a list holds input items (decoded one by one: items.py).
    input: str | list[dict[str, Any]]
    instructions: str | None = None  # a system message for this response only: never carried to the next one
    reasoning: ReasoningConfig | None = None
    max_output_tokens: int | None = None  # reasoning tokens included: the chat request's `max_completion_tokens`
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    store: bool = True  # as OpenAI: kept for `previous_response_id` and GET unless false
    previous_response_id: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceFunction | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    metadata: dict[str, str] | None = None  # kept with the response, not sent to the engine
    user: str | None = None
    # cascade's own extension, as on chat completions: a named operating point or a numeric accuracy target.
    quality: str | float | None = None
