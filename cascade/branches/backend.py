"""The Backend protocol: one seam between cascade and every engine (SGLang, transformers serve, fakes).

A backend generates one completion (one branch) for a list of messages. Fan-out (`n`, reasoning
branches) and replica balancing are built on top of this protocol, never inside a client.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any, Protocol, runtime_checkable

import msgspec

from cascade.errors import BackendFailed
from cascade.schemas import ChatMessage, FunctionCall, ToolCall, ToolCallDelta


class GenerationRequest(msgspec.Struct, kw_only=True, frozen=True):
    messages: list[ChatMessage]
    max_tokens: int
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] = msgspec.field(default_factory=list)
    seed: int | None = None
    # Unique per branch: SGLang uses it as `rid` so that the branch can be aborted upstream.
    request_id: str = ""
    # The client's fields that cascade forwards as sent (schemas.PASSTHROUGH: tools, logprobs, ...).
    extra: dict[str, Any] = msgspec.field(default_factory=dict)
    # The client's own prefix-cache key (`prompt_cache_key`, or an `x-session-id` header): a tier whose replicas are
    # chosen by prefix hashes it instead of the conversation's opening (cascade/branches/affinity.py). Never sent.
    affinity_key: str = ""


class StreamDelta(msgspec.Struct, kw_only=True):
    """One increment of a streamed completion. The last delta carries `finish_reason`.

    A delta may hold several upstream chunks that arrived together (`chunks` counts those with text,
    about one token each, for engines that report no usage): merging
    what one socket read delivered keeps per-token overhead flat when the gateway is busy."""

    text: str = ""
    reasoning: str = ""
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None  # of the prompt's, served from the engine's prefix cache (where it reports them)
    chunks: int = 1
    # Set by a replica pool on a stream's first delta: faulty replicas tried before this one, and the tokens those
    # attempts had decoded before they failed (a whole answer is retried even mid-answer: decoded, never returned).
    retries: int = 0
    retried_tokens: int = 0
    tool_calls: list[ToolCallDelta] | None = None  # pieces of tool calls (concatenate by index)
    logprobs: list[msgspec.Raw] | None = None  # the engine's per-token entries, as sent
    # The answer's reasoning tokens where the engine reports them (its usage), and the chunks among `chunks` that
    # carried reasoning text (about one token each: the count where the engine reports none).
    reasoning_tokens: int | None = None
    reasoning_chunks: int = 0

    def absorb(self, later: StreamDelta) -> None:
        """Append a delta that arrived right after this one."""
        self.text += later.text
        self.reasoning += later.reasoning
        self.chunks += later.chunks
        self.reasoning_chunks += later.reasoning_chunks
        if later.reasoning_tokens is not None:
            self.reasoning_tokens = later.reasoning_tokens
        if later.finish_reason is not None:
            self.finish_reason = later.finish_reason
        if later.prompt_tokens is not None:
            self.prompt_tokens = later.prompt_tokens
        if later.completion_tokens is not None:
            self.completion_tokens = later.completion_tokens
        if later.cached_tokens is not None:
            self.cached_tokens = later.cached_tokens
        self.retries = max(self.retries, later.retries)
        if later.tool_calls:
            self.tool_calls = [*(self.tool_calls or []), *later.tool_calls]
        if later.logprobs:
            self.logprobs = [*(self.logprobs or []), *later.logprobs]


class GenerationResult(msgspec.Struct, kw_only=True):
    text: str
    reasoning: str = ""
    finish_reason: str = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    retries: int = 0  # faulty replicas tried before the one that answered (failovers)
    retried_tokens: int = 0  # decoded by those failed attempts (billed, not returned)
    tool_calls: list[ToolCall] | None = None
    logprobs: list[msgspec.Raw] | None = None
    cached_tokens: int | None = None  # of the prompt's, from the engine's prefix cache (None: it reported none)
    reasoning_tokens: int | None = None  # of completion_tokens, as the engine reported them (None: it reported none)
    reasoning_chunks: int = 0  # stream chunks that carried reasoning text (StreamDelta's)


@runtime_checkable
class Backend(Protocol):
    """One engine endpoint (or a pool of replicas that behaves as one)."""

    name: str

    def stream(self, request: GenerationRequest) -> AsyncGenerator[StreamDelta, None]:
        """Yield deltas as the engine produces them; a stream that ends without raising has yielded a
        finish reason (one that did not is a BackendFailed). Closing the iterator early (client went
        away, branch pruned) must cancel the generation upstream."""
        ...

    async def health(self) -> bool:
        """True when the engine answers its health check now."""
        ...

    async def aclose(self) -> None: ...


async def collect(deltas: AsyncGenerator[StreamDelta, None]) -> GenerationResult:
    """Fold a delta stream into a result. Backends only stream; a whole answer is its collected stream
    (the replica pool's `generate`, which the gateway and `cascade label` use, retries it as a whole)."""
    text: list[str] = []
    reasoning: list[str] = []
    finish_reason: str | None = None
    prompt_tokens = completion_tokens = 0
    cached_tokens: int | None = None
    reasoning_tokens: int | None = None
    n_deltas = retries = retried_tokens = reasoning_chunks = 0
    calls: list[ToolCallDelta] = []
    logprobs: list[msgspec.Raw] | None = None
    async for delta in deltas:
        retries = max(retries, delta.retries)
        retried_tokens = max(retried_tokens, delta.retried_tokens)
        calls.extend(delta.tool_calls or ())
        if delta.logprobs:
            logprobs = [*(logprobs or []), *delta.logprobs]
        text.append(delta.text)
        reasoning.append(delta.reasoning)
        n_deltas += delta.chunks
        reasoning_chunks += delta.reasoning_chunks
        if delta.reasoning_tokens is not None:
            reasoning_tokens = delta.reasoning_tokens
        if delta.finish_reason is not None:
            finish_reason = delta.finish_reason
        if delta.prompt_tokens is not None:
            prompt_tokens = delta.prompt_tokens
        if delta.completion_tokens is not None:
            completion_tokens = delta.completion_tokens
        if delta.cached_tokens is not None:
            cached_tokens = delta.cached_tokens
    if finish_reason is None:
        # A stream that ended without saying why it ended is not an answer (clients raise on this too;
        # this guards every Backend).
        raise incomplete()
    return GenerationResult(
        text="".join(text),
        reasoning="".join(reasoning),
        finish_reason=finish_reason,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens or n_deltas,
        retries=retries,
        retried_tokens=retried_tokens,
        tool_calls=join_tool_calls(calls) or None,
        logprobs=logprobs,
        cached_tokens=cached_tokens,
        reasoning_tokens=reasoning_tokens,
        reasoning_chunks=reasoning_chunks,
    )


def incomplete() -> BackendFailed:
    """What `collect` raises for a stream that ended without a finish reason."""
    return BackendFailed("the backend's stream ended without a finish reason (the answer is incomplete)")


def join_tool_calls(pieces: list[ToolCallDelta]) -> list[ToolCall]:
    """Streamed tool-call pieces as whole calls: by index, id and name from the first piece that has them,
    arguments concatenated (OpenAI's streaming format)."""
    calls: dict[int, tuple[list[str], list[str], list[str]]] = {}
    for piece in pieces:
        ids, names, arguments = calls.setdefault(piece.index, ([], [], []))
        if piece.id:
            ids.append(piece.id)
        if piece.function is not None:
            if piece.function.name:
                names.append(piece.function.name)
            if piece.function.arguments:
                arguments.append(piece.function.arguments)
    return [ToolCall(id=ids[0] if ids else f"call_{index}", function=FunctionCall(
                name="".join(names), arguments="".join(arguments)))
            for index, (ids, names, arguments) in sorted(calls.items())]
