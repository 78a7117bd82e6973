"""The chat answer as a Response: its output items, status and usage, from a whole chat completion or from the end
of a stream (cascade/service/responses_api/stream.py builds the same items as it goes).

The chat answer is read through lenient views of its JSON, so that reasoning text is found under `reasoning_content`
or `reasoning`, and `usage.completion_tokens_details.reasoning_tokens` where the answer carries it, whichever names
the chat side writes.
"""

from __future__ import annotations

import os
import time

import msgspec

from cascade.schemas import CascadeInfo, ChatCompletion, ChatMessage, FunctionCall, ToolCall, ToolCallDelta
from cascade.service.responses_api.objects import (
    FunctionCallOutput,
    IncompleteDetails,
    InputTokensDetails,
    MessageOutput,
    OutputItem,
    OutputTextPart,
    OutputTokensDetails,
    ReasoningOutput,
    ReasoningTextPart,
    ResponseObject,
    ResponseUsage,
)
from cascade.service.responses_api.wire import ResponsesRequest, Status


class _CachedDetails(msgspec.Struct):
    cached_tokens: int | None = None


class _ReasoningDetails(msgspec.Struct):
    reasoning_tokens: int | None = None


class UsageView(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_tokens_details: _CachedDetails | None = None
    completion_tokens_details: _ReasoningDetails | None = None


class MessageView(msgspec.Struct):
    """A whole answer's message, or a stream chunk's delta."""

    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCallDelta] | None = None

    @property
    def thought(self) -> str:
        return self.reasoning_content or self.reasoning or ""


class ChoiceView(msgspec.Struct):
    message: MessageView | None = None
    delta: MessageView | None = None
    finish_reason: str | None = None


class ErrorView(msgspec.Struct):
    message: str = ""
    type: str | None = None


class AnswerView(msgspec.Struct):
    """A chat completion, a stream chunk, or an in-band error event (`error`)."""

    model: str = ""
    choices: list[ChoiceView] = msgspec.field(default_factory=list)
    usage: UsageView | None = None
    cascade: CascadeInfo | None = None
    error: ErrorView | None = None


decode_answer = msgspec.json.Decoder(AnswerView).decode
_encode = msgspec.json.Encoder().encode


def item_id(prefix: str) -> str:
    """An output item's id (`msg_`, `rs_`, `fc_`): item ids name items, they grant nothing."""
    return f"{prefix}_{os.urandom(12).hex()}"


def reasoning_item(ident: str, text: str, status: Status = "completed") -> ReasoningOutput:
    return ReasoningOutput(id=ident, status=status, content=[ReasoningTextPart(text=text)] if text else [])


def message_item(ident: str, text: str, status: Status = "completed") -> MessageOutput:
    return MessageOutput(id=ident, status=status, content=[OutputTextPart(text=text)])


def call_item(ident: str, call_id: str, name: str, arguments: str, status: Status = "completed"
              ) -> FunctionCallOutput:
    return FunctionCallOutput(id=ident, call_id=call_id, name=name, arguments=arguments, status=status)


def whole_output(completion: ChatCompletion) -> tuple[AnswerView, list[OutputItem], str | None]:
    """A whole chat completion's view, output items (reasoning, the message, its tool calls) and finish reason."""
    view = decode_answer(_encode(completion))
    choice = view.choices[0]
    message = choice.message or MessageView()
    status: Status = "incomplete" if incomplete(choice.finish_reason) else "completed"
    items: list[OutputItem] = []
    if message.thought:
        items.append(reasoning_item(item_id("rs"), message.thought))
    if message.content or not message.tool_calls:
        items.append(message_item(item_id("msg"), message.content or "", status))
    for call in message.tool_calls or []:
        function = call.function
        name, arguments = (function.name or "", function.arguments or "") if function else ("", "")
        items.append(call_item(item_id("fc"), call.id or "", name, arguments))
    return view, items, choice.finish_reason


def incomplete(finish_reason: str | None) -> IncompleteDetails | None:
    if finish_reason == "length":
        return IncompleteDetails(reason="max_output_tokens")
    if finish_reason == "content_filter":
        return IncompleteDetails(reason="content_filter")
    return None


def head(req: ResponsesRequest, response_id: str, model: str) -> ResponseObject:
    """The response before its answer (`in_progress`, no output), echoing the request's settings."""
    return ResponseObject(
        id=response_id, created_at=int(time.time()), status="in_progress", model=model,
        previous_response_id=req.previous_response_id, instructions=req.instructions, metadata=req.metadata or {},
        temperature=req.temperature, top_p=req.top_p, max_output_tokens=req.max_output_tokens,
        parallel_tool_calls=True if req.parallel_tool_calls is None else req.parallel_tool_calls,
        tool_choice=msgspec.to_builtins(req.tool_choice) if req.tool_choice is not None else "auto",
        tools=msgspec.to_builtins(req.tools or []),
        text=msgspec.to_builtins(req.text) if req.text is not None and req.text.format is not None else
        {"format": {"type": "text"}},
        reasoning=req.reasoning, store=req.store, user=req.user,
    )


def finished(start: ResponseObject, model: str, output: list[OutputItem], finish_reason: str | None,
             usage: UsageView | None, info: CascadeInfo | None) -> ResponseObject:
    """`start` answered: completed, or incomplete where the answer was cut (its token limit, a content filter)."""
    details = incomplete(finish_reason)
    return msgspec.structs.replace(
        start, status="completed" if details is None else "incomplete", completed_at=int(time.time()),
        model=model or start.model, output=output, incomplete_details=details,
        usage=None if usage is None else response_usage(usage), cascade=info)


def response_usage(usage: UsageView) -> ResponseUsage:
    cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else None
    reasoning = usage.completion_tokens_details.reasoning_tokens if usage.completion_tokens_details else None
    return ResponseUsage(input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens,
                         total_tokens=usage.prompt_tokens + usage.completion_tokens,
                         input_tokens_details=InputTokensDetails(cached_tokens=cached or 0),
                         output_tokens_details=OutputTokensDetails(reasoning_tokens=reasoning or 0))


def assistant_turn(output: list[OutputItem]) -> ChatMessage:
    """The answer as the assistant message a stored conversation keeps: its text and tool calls, not its
    reasoning."""
    text = "".join(part.text for item in output if isinstance(item, MessageOutput) for part in item.content)
    calls = [ToolCall(id=item.call_id, function=FunctionCall(name=item.name, arguments=item.arguments))
             for item in output if isinstance(item, FunctionCallOutput)]
    return ChatMessage(role="assistant", content=None if calls and not text else text, tool_calls=calls or None)
