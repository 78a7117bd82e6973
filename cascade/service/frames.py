"""SSE frames of one streamed chat completion.

Content frames are the hot path of the gateway (one per upstream read, tens of thousands per second
at 200 streams), so they are spliced from byte templates around the JSON-encoded text instead of
building and encoding a `ChatCompletionChunk` each time. The templates are made by encoding real
chunks, so the bytes are exactly what the Structs would give; tests/gateway/test_frames.py checks
that for every kind of frame.
"""

from __future__ import annotations

import msgspec

from cascade.schemas import (
    REASONING_FIELDS,
    CascadeInfo,
    ChatCompletionChunk,
    ChoiceLogprobs,
    ChunkChoice,
    Delta,
    ToolCallDelta,
    Usage,
)

_encode = msgspec.json.Encoder().encode
_MARK = "\x00cascade-split\x00"
DONE = b"data: [DONE]\n\n"


def sse(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"


class ChunkFrames:
    """Builds the frames of one completion: id, created and model are fixed for its lifetime, and so are the names its
    reasoning text goes under (`[gateway] reasoning_fields`)."""

    __slots__ = ("_after", "_before", "_head", "_middle", "_names")

    def __init__(self, completion_id: str, created: int, model: str,
                 reasoning_names: tuple[str, ...] = REASONING_FIELDS) -> None:
        self._names = reasoning_names
        self._head = ChatCompletionChunk(id=completion_id, object="chat.completion.chunk", created=created,
                                         model=model, choices=[])
        # Encode a chunk whose content is a marker, and cut it around the marker's encoding.
        probe = sse(self._encode([ChunkChoice(index=0, delta=Delta(content=_MARK))]))
        before, self._after = probe.split(_encode(_MARK))
        # The last `"index":0` is the choice's: a quote inside id or model would be escaped.
        head, _, middle = before.rpartition(b'"index":0')
        self._before, self._middle = head + b'"index":', middle

    def _encode(self, choices: list[ChunkChoice], **fields: object) -> bytes:
        return _encode(msgspec.structs.replace(self._head, choices=choices, **fields))

    def content(self, index: int, text: str, reasoning: str = "") -> bytes:
        """A frame of text and/or reasoning text (b"": nothing to show, reasoning under no name)."""
        if reasoning:
            delta = self._delta(text, reasoning)
            if delta.content is None and delta.reasoning is None and delta.reasoning_content is None:
                return b""
            return sse(self._encode([ChunkChoice(index=index, delta=delta)]))
        return b"".join((self._before, b"%d" % index, self._middle, _encode(text), self._after))

    def delta(self, index: int, text: str, reasoning: str, tool_calls: list[ToolCallDelta] | None,
              logprobs: list[msgspec.Raw] | None) -> bytes:
        """A frame with tool-call pieces and/or token logprobs besides any text (encoded in full)."""
        delta = msgspec.structs.replace(self._delta(text, reasoning), tool_calls=tool_calls)
        choice = ChunkChoice(index=index, delta=delta,
                             logprobs=None if logprobs is None else ChoiceLogprobs(content=logprobs))
        return sse(self._encode([choice]))

    def _delta(self, text: str, reasoning: str) -> Delta:
        """A delta of `text` and `reasoning`, the latter under each of the frames' names."""
        shown = reasoning or None
        return Delta(content=text or None,
                     reasoning_content=shown if "reasoning_content" in self._names else None,
                     reasoning=shown if "reasoning" in self._names else None)

    def role(self, n: int, info: CascadeInfo) -> bytes:
        return sse(self._encode([ChunkChoice(index=i, delta=Delta(role="assistant", content=""))
                                 for i in range(n)], cascade=info))

    def finish(self, index: int, reason: str) -> bytes:
        return sse(self._encode([ChunkChoice(index=index, delta=Delta(), finish_reason=reason)]))

    def tail(self, info: CascadeInfo, usage: Usage | None) -> bytes:
        return sse(self._encode([], cascade=info, usage=usage)) + DONE
