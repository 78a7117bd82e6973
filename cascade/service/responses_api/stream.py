"""A streamed response: the chat stream's SSE frames (cascade/service/streaming.py, relayed or sent whole) translated
into the Responses API's typed events, each with its `sequence_number`, as `event: TYPE` / `data: JSON` pairs.

    response.created, response.in_progress
    per output item (reasoning, then the message, then each function call), in the order the chat stream sends them:
        response.output_item.added, response.content_part.added (reasoning and message)
        response.reasoning_text.delta | response.output_text.delta | response.function_call_arguments.delta ...
        response.reasoning_text.done | response.output_text.done | response.function_call_arguments.done
        response.content_part.done, response.output_item.done
    response.completed (response.incomplete when the token limit cut it), with usage and the `cascade` object

A fault after the headers (the chat stream's in-band error event) ends it with `error` and `response.failed`, as does
the drain when its grace runs out (`shutdown_end`). Keep-alive comments pass through. Reading the chat frames back
costs a JSON decode per frame, which keeps one request core and one bill for both routes; the hot path stays the chat
route's (cascade/gateway/chat_asgi.py).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

import msgspec

from cascade.schemas import CascadeInfo, ToolCallDelta
from cascade.service.responses_api.answer import (
    ErrorView,
    UsageView,
    call_item,
    decode_answer,
    finished,
    incomplete,
    item_id,
    message_item,
    reasoning_item,
)
from cascade.service.responses_api.objects import (
    ArgumentsDelta,
    ArgumentsDone,
    ContentPartAdded,
    ContentPartDone,
    ErrorEvent,
    Event,
    OutputItem,
    OutputItemAdded,
    OutputItemDone,
    OutputTextDelta,
    OutputTextDone,
    OutputTextPart,
    ReasoningTextDelta,
    ReasoningTextDone,
    ReasoningTextPart,
    ResponseCompleted,
    ResponseCreated,
    ResponseError,
    ResponseFailed,
    ResponseIncomplete,
    ResponseInProgress,
    ResponseObject,
)

_encode = msgspec.json.Encoder().encode
Keep = Callable[[ResponseObject], Awaitable[ResponseObject]]


@dataclass
class _Open:
    """The output item being streamed."""

    kind: Literal["reasoning", "message", "call"]
    ident: str
    index: int  # its output_index
    pieces: list[str] = field(default_factory=list)
    call_id: str = ""
    name: str = ""
    tool_index: int = -1  # the chat stream's index of its tool call


class ResponseEvents:
    """The events of one streamed response, `start` its `in_progress` head; `keep` stores the finished response and
    returns it as the client gets it (None: `store` is off)."""

    def __init__(self, start: ResponseObject, keep: Keep | None = None) -> None:
        self.start = start
        self.keep = keep
        self.sequence = 0
        self.output: list[OutputItem] = []
        self.model = start.model
        self.finish_reason: str | None = None
        self.usage: UsageView | None = None
        self.info: CascadeInfo | None = None
        self.failed: ErrorView | None = None
        self._open: _Open | None = None
        self._rest = b""

    async def events(self, first: bytes, frames: AsyncGenerator[bytes, None]) -> AsyncGenerator[bytes, None]:
        """The whole stream from the chat stream's `first` frame and the rest in `frames`, which it closes however it
        ends (closing them gives the request's lease back). Its first step does not wait: once started, it closes."""
        try:
            yield self.opening() + self.translate(first)
            async for frame in frames:
                if out := self.translate(frame):
                    yield out
            yield await self.closing()
        finally:
            await frames.aclose()

    def opening(self) -> bytes:
        return self._event(ResponseCreated(sequence_number=0, response=self.start)) + self._event(
            ResponseInProgress(sequence_number=0, response=self.start))

    def translate(self, frame: bytes) -> bytes:
        """The events for the chat stream's `frame` (SSE blocks; a block cut across frames waits for its end)."""
        blocks = (self._rest + frame).split(b"\n\n")
        self._rest = blocks.pop()
        out = []
        for block in blocks:
            if block.startswith(b":"):
                out.append(block + b"\n\n")  # a keep-alive comment
            elif block.startswith(b"data: ") and block != b"data: [DONE]" and self.failed is None:
                out.append(self._payload(block[6:]))
        return b"".join(out)

    async def closing(self) -> bytes:
        """The end: the open item closed, the response finished (and kept), or failed."""
        if self.failed is not None:
            code = "rate_limit_exceeded" if self.failed.type == "rate_limit_error" else "server_error"
            return self._failure(self.failed.message, code)
        out = self._close()
        if not self.output:  # no text and no call: an empty message, as a whole answer has
            out += self._begin("message") + self._close()
        final = finished(self.start, self.model, self.output, self.finish_reason, self.usage, self.info)
        if self.keep is not None:
            final = await self.keep(final)
        if final.status == "completed":
            return out + self._event(ResponseCompleted(sequence_number=0, response=final))
        return out + self._event(ResponseIncomplete(sequence_number=0, response=final))

    def shutdown_end(self, message: str) -> bytes:
        """The last events of a stream the gateway's drain ended."""
        return self._failure(message, "server_error", "shutting_down")

    # --- one chat chunk -------------------------------------------------------------------------------------

    def _payload(self, payload: bytes) -> bytes:
        try:
            view = decode_answer(payload)
        except msgspec.DecodeError:  # not from the chat core; never a traceback
            self.failed = ErrorView(message="the answer's stream could not be read", type="server_error")
            return b""
        if view.error is not None:
            self.failed = view.error
            return b""
        self.model = view.model or self.model
        self.info = view.cascade or self.info
        self.usage = view.usage or self.usage
        out = b""
        for choice in view.choices:
            if (delta := choice.delta) is not None:
                out += self._delta("reasoning", delta.thought) + self._delta("message", delta.content or "")
                out += self._calls(delta.tool_calls)
            if choice.finish_reason is not None:
                self.finish_reason = choice.finish_reason
                out += self._close()
        return out

    def _delta(self, kind: Literal["reasoning", "message"], text: str) -> bytes:
        """A piece of reasoning or answer text: its item opened first if it is not the open one."""
        if not text:
            return b""
        out = b"" if self._open is not None and self._open.kind == kind else self._close() + self._begin(kind)
        item = self._item()
        item.pieces.append(text)
        delta = ReasoningTextDelta if kind == "reasoning" else OutputTextDelta
        return out + self._event(delta(sequence_number=0, item_id=item.ident, output_index=item.index,
                                       content_index=0, delta=text))

    def _calls(self, pieces: list[ToolCallDelta] | None) -> bytes:
        out = b""
        for piece in pieces or []:
            function = piece.function
            item = self._open
            if item is None or item.kind != "call" or piece.index != item.tool_index:
                out += self._close()
                item = self._open = _Open("call", item_id("fc"), len(self.output), call_id=piece.id or "",
                                          name=(function.name if function else None) or "", tool_index=piece.index)
                added = call_item(item.ident, item.call_id, item.name, "", "in_progress")
                out += self._event(OutputItemAdded(sequence_number=0, output_index=item.index, item=added))
            else:  # a late id or name
                item.call_id = item.call_id or piece.id or ""
                item.name = item.name or (function.name if function else None) or ""
            if function is not None and function.arguments:
                item.pieces.append(function.arguments)
                out += self._event(ArgumentsDelta(sequence_number=0, item_id=item.ident, output_index=item.index,
                                                  delta=function.arguments))
        return out

    # --- items ----------------------------------------------------------------------------------------------

    def _item(self) -> _Open:
        assert self._open is not None
        return self._open

    def _begin(self, kind: Literal["reasoning", "message"]) -> bytes:
        item = self._open = _Open(kind, item_id("rs" if kind == "reasoning" else "msg"), len(self.output))
        if kind == "reasoning":
            added: OutputItem = reasoning_item(item.ident, "", "in_progress")
            part: OutputTextPart | ReasoningTextPart = ReasoningTextPart(text="")
        else:
            added = message_item(item.ident, "", "in_progress")
            added.content = []
            part = OutputTextPart(text="")
        return self._event(OutputItemAdded(sequence_number=0, output_index=item.index, item=added)) + self._event(
            ContentPartAdded(sequence_number=0, item_id=item.ident, output_index=item.index, content_index=0,
                             part=part))

    def _close(self) -> bytes:
        """The open item's last events; it joins the output."""
        item, self._open = self._open, None
        if item is None:
            return b""
        text, ident, index = "".join(item.pieces), item.ident, item.index
        if item.kind == "call":
            done: OutputItem = call_item(ident, item.call_id, item.name, text)
            out = self._event(ArgumentsDone(sequence_number=0, item_id=ident, output_index=index, arguments=text))
        elif item.kind == "reasoning":
            done = reasoning_item(ident, text)
            out = self._event(ReasoningTextDone(sequence_number=0, item_id=ident, output_index=index, content_index=0,
                                                text=text))
            out += self._event(ContentPartDone(sequence_number=0, item_id=ident, output_index=index, content_index=0,
                                               part=ReasoningTextPart(text=text)))
        else:
            done = message_item(ident, text, "incomplete" if incomplete(self.finish_reason) else "completed")
            out = self._event(OutputTextDone(sequence_number=0, item_id=ident, output_index=index, content_index=0,
                                             text=text))
            out += self._event(ContentPartDone(sequence_number=0, item_id=ident, output_index=index, content_index=0,
                                               part=OutputTextPart(text=text)))
        self.output.append(done)
        return out + self._event(OutputItemDone(sequence_number=0, output_index=item.index, item=done))

    def _failure(self, message: str, code: str, event_code: str | None = None) -> bytes:
        failed = msgspec.structs.replace(self.start, status="failed", model=self.model, output=self.output,
                                         error=ResponseError(code=code, message=message), cascade=self.info)
        return self._event(ErrorEvent(sequence_number=0, code=event_code or code, message=message)) + self._event(
            ResponseFailed(sequence_number=0, response=failed))

    def _event(self, event: Event) -> bytes:
        """`event` numbered in order, as one SSE event named by its type."""
        event.sequence_number = self.sequence
        self.sequence += 1
        kind = event.__struct_config__.tag
        assert isinstance(kind, str)
        return b"event: " + kind.encode() + b"\ndata: " + _encode(event) + b"\n\n"
