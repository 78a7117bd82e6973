"""`/v1/responses` over the chat service: a Responses request is answered as the chat completion request it
translates to (items.py), by `ChatService.chat` (the same decision, permits, lease and bill), and the answer is
translated back (answer.py; a stream's frames by stream.py).

    create     the caller's stored conversation read (`previous_response_id`, its limits checked), the chat request
               served, the answer returned as a Response, and kept (`store`, the default) under a new id
    retrieve   GET /v1/responses/{id}: a stored response, for the API key that created it
    delete     DELETE /v1/responses/{id}: the same, then gone

Ids are `resp_` and 48 random hex digits: a well-formed id names one response, and anything else reads as absent
without asking the store.
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import msgspec

from cascade.config import ResponsesConfig
from cascade.errors import InvalidRequest, StoredResponsesUnavailable, UnknownResponse
from cascade.schemas import ChatCompletion, ChatMessage
from cascade.service.bodies import decode_body, whole_floats
from cascade.service.chat import ChatService, Client, StreamReply, WholeReply
from cascade.service.intake import read_body
from cascade.service.keys.tenant import Tenant
from cascade.service.redis.store import ThrottledWarning
from cascade.service.responses_api.answer import assistant_turn, finished, head, whole_output
from cascade.service.responses_api.items import chat_request, input_messages, renamed
from cascade.service.responses_api.objects import ResponseDeleted, ResponseObject
from cascade.service.responses_api.store import (
    ResponseStore,
    StoredResponse,
    StoreFailed,
    decode_record,
    encode_record,
    owner_of,
)
from cascade.service.responses_api.stream import Keep, ResponseEvents
from cascade.service.responses_api.wire import ResponsesRequest
from cascade.service.validation import check_metadata

_decode_request = msgspec.json.Decoder(ResponsesRequest).decode
_whole_floats = whole_floats(ResponsesRequest)
_encode = msgspec.json.Encoder().encode
RESPONSE_ID = re.compile(r"resp_[0-9a-f]{48}")
UNAVAILABLE = "the gateway cannot reach its stored responses (Redis); retry the request"


def new_response_id() -> str:
    return "resp_" + os.urandom(24).hex()


@dataclass(frozen=True)
class WholeResponse:
    """A whole response: its JSON `body`, and the chat completion it was made from (whose tier and bill the adapter
    names in headers, as for chat completions)."""

    completion: ChatCompletion
    body: bytes
    headers: list[tuple[bytes, bytes]]


@dataclass(frozen=True)
class ResponseStream(StreamReply):
    """A started stream of Responses events (a `StreamReply`: the caller must `aclose` its frames); `shutdown_end`
    gives its last events when the gateway's drain ends it."""

    shutdown_end: Callable[[str], bytes] | None = None


class ResponsesService:
    def __init__(self, chat: ChatService, store: ResponseStore, config: ResponsesConfig | None = None) -> None:
        self.chat = chat
        self.store = store
        self.config = config or ResponsesConfig()
        self._unkept = ThrottledWarning(" responses not stored")

    async def intake(self, authorization: str, chunks: AsyncIterator[bytes], declared: str | None
                     ) -> tuple[Tenant | None, ResponsesRequest]:
        """The caller and its request, as `ChatService.intake` reads a chat request (the key, then the body under its
        size and depth limits, decoded strictly)."""
        caller = self.chat.keyring.authenticate(authorization)
        raw = await read_body(chunks, declared, self.chat.limits.max_body_bytes)
        req = decode_body(raw, _decode_request, "a JSON Responses API request",
                          max_depth=self.chat.limits.max_json_depth, mend=_whole_floats)
        return caller, req

    async def create(self, req: ResponsesRequest, *, caller: Tenant | None = None, hint_header: str | None = None,
                     session: str | None = None, client: Client | None = None) -> WholeResponse | ResponseStream:
        """Answer `req` for `caller` as `ChatService.chat` answers its chat request (`session`: the x-session-id
        header, the replica choice's key). Errors are the chat service's, with this request's parameter names."""
        messages = input_messages(req.input)
        if req.metadata is not None:
            check_metadata(req.metadata, self.chat.limits)
        owner = owner_of(caller)
        history, turns = await self._history(req, owner)
        conversation = [*history, *messages]
        self._check_size(conversation, req)
        chat_req = chat_request(req, conversation)
        chat_req.prompt_cache_key = session
        start = head(req, new_response_id(), req.model)
        try:
            reply = await self.chat.chat(chat_req, caller=caller, hint_header=hint_header, client=client)
        except InvalidRequest as exc:
            raise renamed(exc) from None
        keep = self._keeper(owner, conversation, turns) if req.store else None
        if isinstance(reply, WholeReply):
            view, output, finish_reason = whole_output(reply.completion)
            response = finished(start, view.model, output, finish_reason, view.usage, view.cascade)
            if keep is not None:
                response = await keep(response)
            return WholeResponse(reply.completion, _encode(response), reply.headers)
        events = ResponseEvents(msgspec.structs.replace(start, model=reply.tier), keep)
        frames = events.events(reply.first, reply.frames)
        first = await anext(frames)  # its first step does not wait: from here closing `frames` closes the chat's
        return ResponseStream(reply.tier, reply.judged, first, frames, reply.headers, events.shutdown_end)

    async def retrieve(self, authorization: str, response_id: str) -> bytes:
        """The stored response `response_id` as JSON, for the API key that created it (UnknownResponse for any
        other, as for an id never stored)."""
        caller = self.chat.keyring.authenticate(authorization)
        record = await self._record(response_id, owner_of(caller), "response_id")
        return bytes(record.response)

    async def delete(self, authorization: str, response_id: str) -> bytes:
        caller = self.chat.keyring.authenticate(authorization)
        if not RESPONSE_ID.fullmatch(response_id):
            raise UnknownResponse(response_id, "response_id")
        try:
            deleted = await self.store.delete(response_id, owner_of(caller))
        except StoreFailed:
            raise StoredResponsesUnavailable(UNAVAILABLE) from None
        if not deleted:
            raise UnknownResponse(response_id, "response_id")
        return _encode(ResponseDeleted(id=response_id))

    async def _history(self, req: ResponsesRequest, owner: str) -> tuple[list[ChatMessage], int]:
        """The conversation `req` continues (its messages, and how many responses it will hold with this one)."""
        if req.previous_response_id is None:
            return [], 1
        record = await self._record(req.previous_response_id, owner, "previous_response_id")
        limit = self.config.max_conversation_turns
        if record.turns >= limit:
            raise InvalidRequest(f"the conversation through `previous_response_id` holds {record.turns} responses; "
                                 f"the limit is {limit} ([gateway.responses] max_conversation_turns): start a new "
                                 "one", "previous_response_id", "conversation_too_long")
        return record.messages, record.turns + 1

    def _check_size(self, conversation: list[ChatMessage], req: ResponsesRequest) -> None:
        size, limit = len(_encode(conversation)), self.config.max_conversation_bytes
        if size > limit:
            param = "input" if req.previous_response_id is None else "previous_response_id"
            raise InvalidRequest(f"the conversation with this input is {size} bytes as JSON; the limit is {limit} "
                                 "([gateway.responses] max_conversation_bytes): start a new one", param,
                                 "conversation_too_large")

    async def _record(self, response_id: str, owner: str, param: str) -> StoredResponse:
        if not RESPONSE_ID.fullmatch(response_id):
            raise UnknownResponse(response_id, param)
        try:
            raw = await self.store.get(response_id, owner)
        except StoreFailed:
            raise StoredResponsesUnavailable(UNAVAILABLE) from None
        if raw is None:
            raise UnknownResponse(response_id, param)
        return decode_record(raw)

    def _keeper(self, owner: str, conversation: list[ChatMessage], turns: int) -> Keep:
        async def keep(response: ResponseObject) -> ResponseObject:
            """Store `response` with its conversation; one the store could not take is answered all the same (its
            tokens are spent and billed), saying so in `cascade.note`."""
            record = StoredResponse(messages=[*conversation, assistant_turn(response.output)], turns=turns,
                                    response=msgspec.Raw(_encode(response)))
            try:
                await self.store.put(response.id, owner, encode_record(record))
            except StoreFailed as exc:
                if self._unkept.due():
                    self._unkept.warn("a response was answered but not stored (%s): `previous_response_id` and GET "
                                      "will not find it", exc)
                info = response.cascade
                if info is not None:
                    note = "not stored: the gateway could not reach its stored responses (Redis)"
                    info.note = note if info.note is None else f"{info.note}; {note}"
            return response

        return keep
