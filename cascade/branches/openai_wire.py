"""The OpenAI chat-completions wire format as cascade reads it: SSE framing, stream chunks, error bodies.

Decoding is lenient: engines add fields (`reasoning_content`, `matched_stop`, `prompt_tokens_details`)
that we tolerate and, where useful, read. Reasoning text is read as SGLang sends it (`reasoning_content`) or as vLLM
does since 2026 (`reasoning`; one of them, where an engine sends both), and its token count where the engine reports
one (SGLang: `usage.reasoning_tokens`; OpenAI's `usage.completion_tokens_details.reasoning_tokens`). Everything here
is plain functions over bytes; the HTTP connection that delivers them is cascade/branches/openai_client.py's
business.
"""

from __future__ import annotations

from typing import Any

import msgspec

from cascade.branches.backend import StreamDelta
from cascade.errors import BackendFailed, BackendUnavailable, CascadeError, InvalidRequest, Overloaded, UsageFault
from cascade.schemas import ToolCallDelta


class _Message(msgspec.Struct):
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCallDelta] | None = None  # pieces of calls (concatenated by index)


class _Logprobs(msgspec.Struct):
    content: list[msgspec.Raw] | None = None


class _Choice(msgspec.Struct):
    message: _Message | None = None
    delta: _Message | None = None
    finish_reason: str | None = None
    logprobs: _Logprobs | None = None


class _PromptDetails(msgspec.Struct):
    cached_tokens: int | None = None  # SGLang (--enable-cache-report), vLLM and OpenAI: prompt tokens from the cache


class _CompletionDetails(msgspec.Struct):
    reasoning_tokens: int | float | None = None


class _Usage(msgspec.Struct):
    # Read as numbers, so that a fractional count is an engine fault (`parse_chunk`), billed at the reservation, not an
    # unreadable chunk
    prompt_tokens: int | float = 0
    completion_tokens: int | float = 0
    prompt_tokens_details: _PromptDetails | None = None
    # The answer's reasoning tokens: SGLang's top-level count, and OpenAI's place (SGLang fills it when above 0).
    # Never billed: a count that is no whole number is not read.
    reasoning_tokens: int | float | None = None
    completion_tokens_details: _CompletionDetails | None = None

    def reasoning(self) -> int | None:
        details = self.completion_tokens_details
        for value in (None if details is None else details.reasoning_tokens, self.reasoning_tokens):
            if isinstance(value, int) and value >= 0:
                return value
        return None


class _Chunk(msgspec.Struct):
    choices: list[_Choice] = []
    usage: _Usage | None = None


class _ErrorDetail(msgspec.Struct):
    message: str = ""


class _StreamError(msgspec.Struct):
    error: Any = None


class _ErrorEnvelope(msgspec.Struct):
    error: _ErrorDetail | str | None = None
    message: str | None = None
    detail: Any = None


_decode_chunk = msgspec.json.Decoder(_Chunk).decode
_encode = msgspec.json.Encoder().encode


# One SSE line at most. An engine's stream chunk is a token or a few (with 20 top_logprobs each, a few KB); a line
# past this is a broken or hostile engine, and holding it would grow without bound.
MAX_EVENT_BYTES = 16 << 20
# An error body is read this far: enough for any engine's message, bounded for one that answers 500 with gigabytes.
ERROR_BODY_BYTES = 64 << 10


class EventData:
    """The `data:` payloads of an SSE body fed in pieces as they arrive (an event may span two reads).

    `[DONE]` ends the events, but reading goes on to the end of the body: a response released early
    closes its connection instead of returning it to the pool. A plain object called once per read,
    not an async generator: one generator hop fewer per token is measurable at hundreds of streams.
    Work per byte is bounded: only the new piece is searched for a line end, and an unfinished line
    grows a bytearray (amortized appends), so a long line costs linear, not quadratic, time; a line over
    `MAX_EVENT_BYTES` is a BackendFailed naming `backend`."""

    __slots__ = ("_backend", "_buffer", "done")

    def __init__(self, backend: str = "engine") -> None:
        self._backend = backend
        self._buffer = bytearray()  # the unfinished line
        self.done = False

    def feed(self, chunk: bytes) -> list[bytes]:
        """The payloads of the events completed by `chunk`, in order."""
        end = chunk.rfind(b"\n")
        if end < 0:
            self._buffer += chunk
            self._bounded(len(self._buffer))
            return []
        if self._buffer:
            self._buffer += chunk[:end]
            completed = bytes(self._buffer)
            self._buffer = bytearray(chunk[end + 1:])
        else:
            completed = chunk[:end]
            self._buffer += chunk[end + 1:]
        self._bounded(len(self._buffer))
        lines = completed.split(b"\n")
        if len(completed) > MAX_EVENT_BYTES:  # only then can one of its lines be too long: no per-line check per token
            self._bounded(max(map(len, lines)))
        payloads = []
        for line in lines:
            if not line.startswith(b"data:") or self.done:
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                self.done = True
            else:
                payloads.append(data)
        return payloads

    def tail(self) -> bytes:
        """A last event without its trailing newline (some servers end the body that way), else b""."""
        data = bytes(self._buffer[5:]).strip() if self._buffer.startswith(b"data:") else b""
        return b"" if self.done or data == b"[DONE]" else data

    def _bounded(self, line_bytes: int) -> None:
        if line_bytes > MAX_EVENT_BYTES:
            raise BackendFailed(f"backend `{self._backend}` sent a stream line over {MAX_EVENT_BYTES} bytes "
                                "(a broken engine: the stream is dropped)", self._backend)


def parse_chunk(data: bytes, backend: str) -> StreamDelta | None:
    """One stream chunk as a delta; None for a chunk with nothing in it (a role-only chunk). An in-band
    error (`data: {"error": {...}}` after the 200, as vLLM and SGLang send) is raised as the CascadeError
    its code maps to; `backend` names the engine in error messages."""
    try:
        chunk = _decode_chunk(data)
    except msgspec.DecodeError:
        raise BackendFailed(f"backend `{backend}` sent an unreadable stream chunk", backend) from None
    delta = StreamDelta()
    if chunk.choices:
        choice = chunk.choices[0]
        part = choice.delta or choice.message or _Message()
        delta.text = part.content or ""
        delta.reasoning = part.reasoning_content or part.reasoning or ""
        delta.finish_reason = choice.finish_reason
        delta.tool_calls = part.tool_calls or None
        if choice.logprobs is not None and choice.logprobs.content:
            delta.logprobs = choice.logprobs.content
    if chunk.usage is not None:
        prompt, completion = chunk.usage.prompt_tokens, chunk.usage.completion_tokens
        for name, value in (("prompt_tokens", prompt), ("completion_tokens", completion)):
            if not isinstance(value, int):
                raise UsageFault(f"backend `{backend}` reported usage {name} = {value}, not a whole number of tokens: "
                                 "a broken or lying engine", backend)
        delta.prompt_tokens, delta.completion_tokens = int(prompt), int(completion)
        details = chunk.usage.prompt_tokens_details
        if details is not None and details.cached_tokens is not None:
            delta.cached_tokens = max(0, details.cached_tokens)
        delta.reasoning_tokens = chunk.usage.reasoning()
    delta.chunks = 1 if (delta.text or delta.reasoning or delta.tool_calls) else 0
    delta.reasoning_chunks = 1 if delta.reasoning else 0
    if not (delta.text or delta.reasoning or delta.finish_reason or chunk.usage or delta.tool_calls
            or delta.logprobs):
        # No choices and no usage: a role-only chunk, or an in-band error, which must not end as a success.
        error = msgspec.json.decode(data, type=_StreamError).error
        if error is not None:
            code = error.get("code") if isinstance(error, dict) else None
            status = code if isinstance(code, int) and 400 <= code < 600 else 500
            raise status_error(backend, status, _encode({"error": error}))
        return None
    return delta


# What a chat template may add to a request's bytes in tokens (its own markers, a default system prompt, tool
# instructions): an engine's prompt count above the body's bytes plus this is impossible.
TEMPLATE_SLACK_TOKENS = 4096


class UsageBounds(msgspec.Struct, frozen=True):
    """The most an engine can truthfully report for one request: its prompt cannot hold more tokens than the request
    body's bytes (a token covers at least one byte) plus a template's own; its answer no more than max_tokens per
    choice."""

    prompt_tokens: int
    completion_tokens: int

    @classmethod
    def of(cls, body_bytes: int, max_tokens: int, choices: int = 1) -> UsageBounds:
        return cls(body_bytes + TEMPLATE_SLACK_TOKENS, max(1, max_tokens) * max(1, choices))


def check_usage(delta: StreamDelta, bounds: UsageBounds, backend: str) -> None:
    """BackendFailed when `delta` reports usage no engine could truthfully report for the request (negative, or past
    `bounds`): a lying or broken engine, whose count must not reach a bill (the request is billed at its reservation,
    as any answer that failed while under way)."""
    for name, value, most in (("prompt_tokens", delta.prompt_tokens, bounds.prompt_tokens),
                              ("completion_tokens", delta.completion_tokens, bounds.completion_tokens)):
        if value is not None and not 0 <= value <= most:
            raise UsageFault(f"backend `{backend}` reported usage {name} = {value}, impossible for this request "
                             f"(0 to {most}): a broken or lying engine", backend)


def status_error(backend: str, status: int, content: bytes) -> CascadeError:
    """The CascadeError for an engine's non-200 answer (`content` is its body)."""
    detail = error_message(content)
    if status in (400, 413, 422):
        # The engine refused the request itself (e.g. prompt longer than its context window).
        return InvalidRequest(f"backend `{backend}` rejected the request: {detail}")
    if status == 429:
        return Overloaded(f"backend `{backend}` is overloaded: {detail}")
    if status == 503:
        return BackendUnavailable(f"backend `{backend}` is unavailable (503): {detail}", backend)
    return BackendFailed(f"backend `{backend}` returned HTTP {status}: {detail}", backend)


def error_message(content: bytes) -> str:
    """The message of an error body in any of the engines' shapes, else the body's start (bounded)."""
    try:
        envelope = msgspec.json.decode(content, type=_ErrorEnvelope)
    except msgspec.MsgspecError:
        text = content.decode("utf-8", "replace").strip()
        return text[:300] or "(empty body)"
    if isinstance(envelope.error, _ErrorDetail) and envelope.error.message:
        return envelope.error.message[:300]
    if isinstance(envelope.error, str):
        return envelope.error[:300]
    if envelope.message:
        return envelope.message[:300]
    if envelope.detail is not None:
        return str(envelope.detail)[:300]
    return content.decode("utf-8", "replace")[:300]


def excerpt(content: bytes, limit: int = 120) -> str:
    """The start of an unexpected body, for an error message (bounded, one line)."""
    text = " ".join(content[:limit].decode("utf-8", "replace").split())
    return repr(text + ("..." if len(content) > limit else "")) if text else "(empty body)"
