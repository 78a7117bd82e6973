"""What `/v1/responses` answers: the Response object, its output items, its usage, and the typed events of a stream,
as msgspec Structs. Names and shapes are the official `openai` SDK's (`openai/types/responses/`: `response.py`,
`response_output_message.py`, `response_reasoning_item.py`, `response_function_tool_call.py`, `response_usage.py`,
and each `response_*_event.py`); the SDK's `output_text` is its own property over the message items. The `cascade`
object is the one chat completions return (the tier, the bill, its cost).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from cascade.schemas import CascadeInfo
from cascade.service.responses_api.wire import ReasoningConfig, Status


class OutputTextPart(msgspec.Struct, kw_only=True, tag_field="type", tag="output_text"):
    text: str
    annotations: list[Any] = msgspec.field(default_factory=list)
    logprobs: list[Any] = msgspec.field(default_factory=list)


class ReasoningTextPart(msgspec.Struct, kw_only=True, tag_field="type", tag="reasoning_text"):
    text: str


class MessageOutput(msgspec.Struct, kw_only=True, tag_field="type", tag="message"):
    id: str
    status: Status
    role: Literal["assistant"] = "assistant"
    content: list[OutputTextPart] = msgspec.field(default_factory=list)


class ReasoningOutput(msgspec.Struct, kw_only=True, tag_field="type", tag="reasoning"):
    """The answer's reasoning text (an engine's `reasoning_content` / `reasoning`) as open-weight servers give it:
    `content` holds the text, `summary` is empty (no summary is written)."""

    id: str
    status: Status
    summary: list[Any] = msgspec.field(default_factory=list)
    content: list[ReasoningTextPart] = msgspec.field(default_factory=list)


class FunctionCallOutput(msgspec.Struct, kw_only=True, tag_field="type", tag="function_call"):
    id: str
    call_id: str
    name: str
    arguments: str
    status: Status


OutputItem = MessageOutput | ReasoningOutput | FunctionCallOutput


class InputTokensDetails(msgspec.Struct, kw_only=True):
    cached_tokens: int = 0  # where the engine reported them
    cache_write_tokens: int = 0


class OutputTokensDetails(msgspec.Struct, kw_only=True):
    reasoning_tokens: int = 0  # where the answer's usage names them


class ResponseUsage(msgspec.Struct, kw_only=True):
    """The answer's tokens, as chat completions' `usage` counts them (the bill is `cascade.billed`)."""

    input_tokens: int
    input_tokens_details: InputTokensDetails = msgspec.field(default_factory=InputTokensDetails)
    output_tokens: int
    output_tokens_details: OutputTokensDetails = msgspec.field(default_factory=OutputTokensDetails)
    total_tokens: int


class ResponseError(msgspec.Struct, kw_only=True):
    code: str  # "server_error", "rate_limit_exceeded", ...
    message: str


class IncompleteDetails(msgspec.Struct, kw_only=True):
    reason: Literal["max_output_tokens", "content_filter"]


class ResponseObject(msgspec.Struct, kw_only=True):
    """A response: `model` names the tier that answered (as a chat completion's), `cascade` what cascade decided and
    billed. The request's settings are echoed as OpenAI does."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["completed", "failed", "in_progress", "incomplete"]
    completed_at: int | None = None
    model: str
    output: list[OutputItem] = msgspec.field(default_factory=list)
    usage: ResponseUsage | None = None
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    previous_response_id: str | None = None
    instructions: str | None = None
    metadata: dict[str, str] = msgspec.field(default_factory=dict)
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    parallel_tool_calls: bool = True
    tool_choice: Any = "auto"
    tools: list[Any] = msgspec.field(default_factory=list)
    text: Any = msgspec.field(default_factory=lambda: {"format": {"type": "text"}})
    reasoning: ReasoningConfig | None = None
    store: bool = True
    user: str | None = None
    background: bool = False
    truncation: Literal["disabled"] = "disabled"
    cascade: CascadeInfo | None = None


class ResponseDeleted(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["response.deleted"] = "response.deleted"
    deleted: bool = True


# --- the stream's events ---------------------------------------------------------------------------------------


class Event(msgspec.Struct, kw_only=True, tag_field="type"):
    sequence_number: int


class _WithResponse(Event):
    response: ResponseObject


class ResponseCreated(_WithResponse, tag="response.created"):
    pass


class ResponseInProgress(_WithResponse, tag="response.in_progress"):
    pass


class ResponseCompleted(_WithResponse, tag="response.completed"):
    pass


class ResponseIncomplete(_WithResponse, tag="response.incomplete"):
    pass


class ResponseFailed(_WithResponse, tag="response.failed"):
    pass


class _OfItem(Event):
    output_index: int
    item: OutputItem


class OutputItemAdded(_OfItem, tag="response.output_item.added"):
    pass


class OutputItemDone(_OfItem, tag="response.output_item.done"):
    pass


class _InItem(Event):
    item_id: str
    output_index: int


class _InPart(_InItem):
    content_index: int


class ContentPartAdded(_InPart, tag="response.content_part.added"):
    part: OutputTextPart | ReasoningTextPart


class ContentPartDone(_InPart, tag="response.content_part.done"):
    part: OutputTextPart | ReasoningTextPart


class OutputTextDelta(_InPart, tag="response.output_text.delta"):
    delta: str
    logprobs: list[Any] = msgspec.field(default_factory=list)


class OutputTextDone(_InPart, tag="response.output_text.done"):
    text: str
    logprobs: list[Any] = msgspec.field(default_factory=list)


class ReasoningTextDelta(_InPart, tag="response.reasoning_text.delta"):
    delta: str


class ReasoningTextDone(_InPart, tag="response.reasoning_text.done"):
    text: str


class ArgumentsDelta(_InItem, tag="response.function_call_arguments.delta"):
    delta: str


class ArgumentsDone(_InItem, tag="response.function_call_arguments.done"):
    arguments: str


class ErrorEvent(Event, tag="error"):
    code: str | None
    message: str
    param: str | None = None


STREAM_EVENTS = (ResponseCreated, ResponseInProgress, OutputItemAdded, ContentPartAdded, ReasoningTextDelta,
                 ReasoningTextDone, OutputTextDelta, OutputTextDone, ArgumentsDelta, ArgumentsDone, ContentPartDone,
                 OutputItemDone, ResponseCompleted, ResponseIncomplete, ResponseFailed, ErrorEvent)
