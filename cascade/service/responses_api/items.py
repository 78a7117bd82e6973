"""A Responses request as the chat completion request the core serves: its input items as chat messages, its settings
as the chat request's fields.

    messages = input_messages(req.input)                  # InvalidRequest naming `input[i]...`
    chat = chat_request(req, [*history, *messages])       # history: the stored conversation, if any

Items map as OpenAI's own chat-compatible servers map them: a message keeps its role and text (parts joined as a
chat message's parts), `function_call` items become the `tool_calls` of one assistant message (after that turn's
text, if any), `function_call_output` a `tool` message, and an earlier turn's `reasoning` item is left out.
`instructions` is a system message first, for this request only.
"""

from __future__ import annotations

from typing import Any

import msgspec

from cascade.errors import InvalidRequest
from cascade.schemas import ChatCompletionRequest, ChatMessage, FunctionCall, StreamOptions, TextPart, ToolCall
from cascade.service.bodies import validation_param
from cascade.service.responses_api.wire import (
    ContentPart,
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionTool,
    InputItem,
    MessageItem,
    ReasoningItem,
    Refusal,
    ResponsesRequest,
    ToolChoiceFunction,
)

_ITEMS: dict[str, type[InputItem]] = {"message": MessageItem, "function_call": FunctionCallItem,
                                      "function_call_output": FunctionCallOutputItem, "reasoning": ReasoningItem}


def input_messages(given: str | list[dict[str, Any]]) -> list[ChatMessage]:
    """The chat messages of a request's `input`: a string is one user message."""
    if isinstance(given, str):
        return [ChatMessage(role="user", content=given)]
    messages: list[ChatMessage] = []
    for index, raw in enumerate(given):
        item = _item(raw, f"input[{index}]")
        if isinstance(item, MessageItem):
            messages.append(ChatMessage(role=item.role, content=_content(item.content)))
        elif isinstance(item, FunctionCallItem):
            call = ToolCall(id=item.call_id, function=FunctionCall(name=item.name, arguments=item.arguments))
            last = messages[-1] if messages else None
            if last is not None and last.role == "assistant":  # this turn's text, or its earlier calls
                last.tool_calls = [*(last.tool_calls or []), call]
            else:
                messages.append(ChatMessage(role="assistant", tool_calls=[call]))
        elif isinstance(item, FunctionCallOutputItem):
            messages.append(ChatMessage(role="tool", tool_call_id=item.call_id, content=_content(item.output)))
    return messages


def _item(raw: dict[str, Any], where: str) -> InputItem:
    kind = raw.get("type", "message")
    shape = _ITEMS.get(kind) if isinstance(kind, str) else None
    if shape is None:
        shown = kind[:64] if isinstance(kind, str) else type(kind).__name__
        raise InvalidRequest(f"`{where}.type` {shown!r} is not an input item cascade serves: send messages, "
                             "function_call and function_call_output items (and reasoning items, which are left out)",
                             f"{where}.type", "invalid_type")
    try:
        return msgspec.convert(raw, shape)
    except msgspec.ValidationError as exc:
        message, param = validation_param(str(exc))
        path = where if param is None else f"{where}.{param}"
        raise InvalidRequest(message.replace(f"`{param}`", f"`{path}`") if param else f"{message} at `{where}`",
                             path, "invalid_type") from None


def _content(content: str | list[ContentPart]) -> str | list[TextPart]:
    """A message's content as a chat message's: a string, or its parts' texts (a refusal's text among them)."""
    if isinstance(content, str):
        return content
    texts = [part.refusal if isinstance(part, Refusal) else part.text for part in content]
    if len(texts) == 1:
        return texts[0]
    return [TextPart(type="text", text=text) for text in texts]


# The chat request's field names in its errors, as this request names them.
RENAMED = {"messages": "input", "max_completion_tokens": "max_output_tokens", "max_tokens": "max_output_tokens",
           "reasoning_effort": "reasoning.effort", "response_format": "text.format"}


def renamed(exc: InvalidRequest) -> InvalidRequest:
    """A chat request's InvalidRequest as this request's: the parameter, and its name in the message."""
    param = exc.param
    if param is None:
        return exc
    head, dot, rest = param.partition(".")
    base, bracket, index = head.partition("[")
    name = RENAMED.get(base)
    if name is None:
        return exc
    message = exc.message.replace(f"`{base}`", f"`{name}`")
    return type(exc)(message, f"{name}{bracket}{index}{dot}{rest}", exc.code)


def chat_request(req: ResponsesRequest, conversation: list[ChatMessage]) -> ChatCompletionRequest:
    """The chat completion request that answers `req` over `conversation` (the stored history and this input)."""
    messages = conversation if req.instructions is None else [
        ChatMessage(role="system", content=req.instructions), *conversation]
    return ChatCompletionRequest(
        model=req.model, messages=messages, stream=req.stream, max_completion_tokens=req.max_output_tokens,
        # A stream's usage is the response's: always asked for.
        stream_options=StreamOptions(include_usage=True) if req.stream else None,
        temperature=req.temperature, top_p=req.top_p, user=req.user, quality=req.quality,
        reasoning_effort=None if req.reasoning is None else req.reasoning.effort,
        tools=None if req.tools is None else [_chat_tool(tool) for tool in req.tools],
        tool_choice=_chat_tool_choice(req.tool_choice), parallel_tool_calls=req.parallel_tool_calls,
        response_format=_response_format(req),
    )


def _chat_tool(tool: FunctionTool) -> dict[str, Any]:
    function = {"name": tool.name, "parameters": tool.parameters, "strict": tool.strict,
                "description": tool.description}
    return {"type": "function", "function": {k: v for k, v in function.items() if v is not None}}


def _chat_tool_choice(choice: str | ToolChoiceFunction | None) -> str | dict[str, Any] | None:
    if choice is None or isinstance(choice, str):
        return choice
    return {"type": "function", "function": {"name": choice.name}}


def _response_format(req: ResponsesRequest) -> dict[str, Any] | None:
    form = None if req.text is None else req.text.format
    if form is None or form.__struct_config__.tag == "text":
        return None
    if form.__struct_config__.tag == "json_object":
        return {"type": "json_object"}
    schema = msgspec.to_builtins(form)
    del schema["type"]
    return {"type": "json_schema", "json_schema": schema}
