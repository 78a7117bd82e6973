"""The Responses API's part of the OpenAPI document (cascade/gateway/openapi.py): its wire types, the request schema
with the limits it is served under, its examples, and the events of its stream.

A Responses request is served as the chat request it stands for (cascade/service/responses_api/items.py), so each
field that becomes a chat field carries that field's bounds, copied from the chat request's schema once those are in.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from cascade.config import Limits
from cascade.gateway.openapi_schemas import REF, bound
from cascade.schemas import EFFORT_LEVELS
from cascade.service.responses_api.objects import STREAM_EVENTS, ResponseDeleted, ResponseObject
from cascade.service.responses_api.wire import (
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    ReasoningItem,
    ResponsesRequest,
)

# Input items are decoded one by one (a message's `type` is optional), so their Structs are listed on their own.
ITEMS = (MessageItem, FunctionCallItem, FunctionCallOutputItem, ReasoningItem)
RESPONSES_WIRE = (ResponsesRequest, *ITEMS, ResponseObject, ResponseDeleted, *STREAM_EVENTS)
# The Responses field -> the chat request's field whose bounds it keeps.
AS_CHAT = {"temperature": "temperature", "top_p": "top_p", "max_output_tokens": "max_completion_tokens",
           "metadata": "metadata", "user": "user", "quality": "quality"}


def constrain_responses_request(schemas: dict[str, Any], limits: Limits, model_ids: list[str]) -> None:
    """What the service checks, added to the request schema (in place; after the chat request's are in)."""
    request = schemas["ResponsesRequest"]["properties"]
    chat = schemas["ChatCompletionRequest"]["properties"]
    for name, chat_name in AS_CHAT.items():
        request[name] = copy.deepcopy(chat[chat_name])
    if model_ids:
        request["model"]["examples"] = model_ids
    items = {"anyOf": [{"$ref": REF.format(name=item.__name__)} for item in ITEMS]}
    # Some item must be one a chat message comes from: reasoning items alone are nothing to answer.
    answerable = {"not": {"$ref": REF.format(name="ReasoningItem")}}
    request["input"] = {"anyOf": [{"type": "string"}, {"type": "array", "items": items, "minItems": 1,
                                                       "maxItems": limits.max_messages, "contains": answerable}],
                        "description": "A user message, or input items: messages, and the function calls and their "
                                       "outputs of a tool-using turn."}
    bound(request["tools"], maxItems=limits.max_tools)
    # The chat request's `reasoning_effort` levels (a string here: the chat request also takes a number).
    schemas["ReasoningConfig"]["properties"]["effort"] = {
        "anyOf": [{"enum": list(EFFORT_LEVELS)}, {"type": "null"}], "default": None,
        "description": "`reasoning_effort`'s level: a quality hint ([routing.effort]) and the engine's thinking."}


def responses_body(model_ids: Sequence[str]) -> dict[str, Any]:
    model = next((m for m in model_ids if m.startswith("cascade:")), "cascade")
    examples = {
        "text": {"summary": "A question, with a quality hint as the model alias",
                 "value": {"model": model, "input": "What is 17 x 23?", "instructions": "Answer with a number."}},
        "items": {"summary": "Input items, streamed, with reasoning effort",
                  "value": {"model": "cascade", "stream": True, "reasoning": {"effort": "high"},
                            "input": [{"role": "user", "content": [{"type": "input_text", "text": "Say hello."}]}]}},
    }
    return {"required": True, "content": {"application/json": {
        "schema": {"$ref": REF.format(name="ResponsesRequest")}, "examples": examples}}}


def response_event_schema() -> dict[str, Any]:
    """One server-sent event of a streamed response: its type named twice, as the `event` and in the data."""
    kinds = [event.__struct_config__.tag for event in STREAM_EVENTS]
    return {"type": "object", "required": ["event", "data"],
            "description": "One server-sent event of a streamed response.",
            "properties": {
                "event": {"enum": kinds},
                "data": {"type": "string", "contentMediaType": "application/json",
                         "contentSchema": {"anyOf": [{"$ref": REF.format(name=event.__name__)}
                                                     for event in STREAM_EVENTS]}}}}
