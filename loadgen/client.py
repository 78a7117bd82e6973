"""One chat-completion request against any OpenAI-compatible server, measured.

TTFT is from the moment the request is written to the first chunk carrying text (content or
reasoning); each later text chunk adds an inter-token latency (vLLM's convention: one chunk is one
ITL sample even if a server packs several tokens in it). Chunk times are taken when the event loop
reads the bytes (see `loadgen.http`). The served tier comes from the `X-Cascade-Tier` header, the
`cascade` object of the body, or else the `model` field, so plain engines report their model.
"""

from __future__ import annotations

import asyncio
import time

import msgspec

from cascade.data.records import Prompt, RequestRecord
from cascade.schemas import ChatCompletionRequest, ChatMessage, StreamOptions
from loadgen.http import Endpoint, HttpError
from loadgen.pool import Collect, Pool, Started, exchange, request_bytes, start_now


class _Delta(msgspec.Struct):
    content: str | None = None
    reasoning_content: str | None = None


class _Choice(msgspec.Struct):
    delta: _Delta | None = None
    message: _Delta | None = None
    finish_reason: str | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class _Cost(msgspec.Struct):
    total: float | None = None
    currency: str | None = None


class _Cascade(msgspec.Struct):
    tier: int | None = None
    tier_name: str | None = None
    cost: _Cost | None = None  # cascade's cost of the request: a whole answer's, or a stream's last chunk's


class _ErrorBody(msgspec.Struct):
    message: str = ""


class _Event(msgspec.Struct):
    """The fields of a chunk or completion the client reads; everything else is skipped unparsed."""

    model: str | None = None
    choices: list[_Choice] = []
    usage: _Usage | None = None
    cascade: _Cascade | None = None
    error: _ErrorBody | str | None = None


_decode_event = msgspec.json.Decoder(_Event).decode


def chat_path(endpoint: Endpoint) -> str:
    """`/v1/chat/completions` under the URL's path, whether the URL names the root, `/v1` or the route."""
    base = endpoint.base_path
    if base.endswith("/chat/completions"):
        return ""
    return "/chat/completions" if base.endswith("/v1") else "/v1/chat/completions"


def build_body(
    prompt: Prompt, model: str, max_tokens: int | None, quality: str | float | None, stream: bool,
    temperature: float | None,
) -> bytes:
    limit = prompt.max_tokens if prompt.max_tokens is not None else max_tokens
    if prompt.max_tokens is not None and max_tokens is not None:
        limit = min(prompt.max_tokens, max_tokens)
    req = ChatCompletionRequest(
        model=model, messages=[ChatMessage(role="user", content=prompt.prompt)], stream=stream,
        stream_options=StreamOptions(include_usage=True) if stream else None,
        # Both spellings: some gateways rewrite one into the other (FACTS.md on SGLang's gateway).
        max_tokens=limit, max_completion_tokens=limit, temperature=temperature, quality=quality,
    )
    return msgspec.json.encode(req)


class ResponseSink:
    """Turns the response bytes into the measurements of one `RequestRecord` as they arrive."""

    __slots__ = (
        "body",
        "chunks",
        "cost",
        "end_t",
        "error",
        "finish_reason",
        "first_t",
        "itl",
        "last_t",
        "model",
        "pending",
        "prompt_tokens",
        "sent_t",
        "status",
        "stream",
        "texts",
        "tier",
        "tier_index",
        "usage_tokens",
    )

    def __init__(self, stream: bool) -> None:
        self.stream = stream
        self.status = 0
        self.pending = b""
        self.body = bytearray()
        self.first_t: float | None = None
        self.last_t = 0.0
        self.sent_t: float | None = None  # when the request was written
        self.end_t: float | None = None  # when the last response byte arrived
        self.itl: list[float] = []
        self.chunks = 0
        self.texts: list[str] = []
        self.model: str | None = None
        self.tier: str | None = None
        self.tier_index: int | None = None
        self.finish_reason: str | None = None
        self.usage_tokens: int | None = None
        self.prompt_tokens: int | None = None
        self.cost: _Cost | None = None
        self.error: str | None = None

    def on_sent(self, t: float) -> None:
        self.sent_t = t

    def on_head(self, status: int, headers: dict[str, str], t: float) -> None:
        self.status = status
        self.tier = headers.get("x-cascade-tier")
        self.end_t = t

    def on_body(self, data: bytes, t: float) -> None:
        self.end_t = t
        if self.status != 200 or not self.stream:
            self.body += data
            return
        buf = self.pending + data if self.pending else data
        start = 0
        while True:
            end = buf.find(b"\n", start)
            if end < 0:
                break
            line = buf[start:end]
            start = end + 1
            if line.startswith(b"data:"):
                self._on_payload(line[5:].strip(), t)
        self.pending = buf[start:]

    def _on_payload(self, payload: bytes, t: float) -> None:
        if payload == b"[DONE]" or not payload:
            return
        try:
            event = _decode_event(payload)
        except msgspec.DecodeError as exc:
            self.error = self.error or f"unreadable stream event: {exc}"
            return
        self._on_event(event, t, streamed=True)

    def _on_event(self, event: _Event, t: float, streamed: bool) -> None:
        if event.error is not None:
            message = event.error if isinstance(event.error, str) else event.error.message
            self.error = self.error or f"error in response: {message}"
        if event.model and self.model is None:
            self.model = event.model
        if event.cascade is not None:
            self.tier_index = event.cascade.tier
            self.tier = self.tier or event.cascade.tier_name
            if event.cascade.cost is not None and event.cascade.cost.total is not None:
                self.cost = event.cascade.cost
        if event.usage is not None:
            self.usage_tokens = event.usage.completion_tokens
            self.prompt_tokens = event.usage.prompt_tokens
        for choice in event.choices:
            part = choice.delta if streamed else choice.message
            if choice.finish_reason:
                self.finish_reason = choice.finish_reason
            if part is None:
                continue
            text = part.content or part.reasoning_content
            if not text:
                continue
            if part.content:
                self.texts.append(part.content)
            if self.first_t is None:
                self.first_t = t
            else:
                self.itl.append(t - self.last_t)
            self.last_t = t
            self.chunks += 1

    def finish(self, t: float) -> None:
        """Called once the response is complete (non-streamed bodies are decoded here)."""
        if self.status != 200:
            self.error = f"HTTP {self.status}: {_error_message(bytes(self.body))}"
        elif not self.stream:
            try:
                self._on_event(_decode_event(bytes(self.body)), t, streamed=False)
            except msgspec.DecodeError as exc:
                self.error = f"unreadable response body: {exc}"
        elif self.first_t is None and self.error is None and self.finish_reason is None:
            self.error = "the stream ended without any output or finish reason"


def _error_message(body: bytes) -> str:
    try:
        event = _decode_event(body)
        if isinstance(event.error, _ErrorBody) and event.error.message:
            return event.error.message
        if isinstance(event.error, str):
            return event.error
    except msgspec.DecodeError:
        pass
    return body[:200].decode("utf-8", "replace").strip() or "(empty body)"


class Client:
    """Sends prepared requests through one connection pool and fills in `RequestRecord`s."""

    def __init__(self, url: str, timeout_s: float | None = 600.0, api_key: str | None = None) -> None:
        self.endpoint = Endpoint(url)
        self.pool = Pool(self.endpoint)
        self.timeout_s = timeout_s
        self.path = chat_path(self.endpoint)
        self.headers = {"Content-Type": "application/json", "Accept": "text/event-stream, application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def prepare(self, body: bytes) -> bytes:
        return request_bytes(self.endpoint, "POST", self.path, body, self.headers)

    def start(self, request: bytes, stream: bool) -> tuple[ResponseSink, Started | None]:
        """Write `request` now if a keep-alive connection is idle (no await); pass the result to `send`."""
        sink = ResponseSink(stream)
        return sink, start_now(self.pool, request, sink, self.timeout_s)

    async def send(self, record: RequestRecord, request: bytes, stream: bool, t0: float,
                   due: float | None = None,
                   started: tuple[ResponseSink, Started | None] | None = None) -> RequestRecord:
        """Send one prepared request (or finish one begun with `start`); record times relative to `t0`
        (the run's start, perf_counter). Never raises except on cancellation, which is recorded first."""
        sink, begun = started if started is not None else (ResponseSink(stream), None)
        try:
            await exchange(self.pool, request, sink, self.timeout_s, begun)
            sink.finish(sink.end_t or time.perf_counter())
        except HttpError as exc:
            record.error = exc.message
        except Exception as exc:  # errors are data: a bug or an odd server must not end the run
            record.error = f"client error: {type(exc).__name__}: {exc}"
        except asyncio.CancelledError:
            record.error = "cancelled: the run ended before the response did"
            _fill(record, sink, t0, due)
            raise
        _fill(record, sink, t0, due)
        return record

    async def get(self, path: str) -> tuple[int, bytes]:
        sink = Collect()
        request = request_bytes(self.endpoint, "GET", path, b"", {"Accept": "application/json"})
        await exchange(self.pool, request, sink, 10.0)
        return sink.status, bytes(sink.body)

    def close(self) -> None:
        self.pool.close()


def _fill(record: RequestRecord, sink: ResponseSink, t0: float, due: float | None) -> None:
    sent = sink.sent_t
    end = sink.end_t if sink.end_t is not None else time.perf_counter()
    record.status = sink.status or None
    record.model = sink.model
    record.tier = sink.tier or sink.model
    record.tier_index = sink.tier_index
    record.finish_reason = sink.finish_reason
    record.prompt_tokens = sink.prompt_tokens
    record.output = "".join(sink.texts)
    if sink.cost is not None:
        record.cost, record.cost_currency = sink.cost.total, sink.cost.currency
    if record.error is None and sink.error is not None:
        record.error = sink.error
    if sent is not None:
        record.sent_s = sent - t0
        if due is not None:
            record.dispatch_lag_ms = (sent - due) * 1000
        record.e2el_ms = (end - sent) * 1000
        if sink.first_t is not None:
            record.ttft_ms = (sink.first_t - sent) * 1000
    record.itl_ms = [x * 1000 for x in sink.itl]
    tokens = sink.usage_tokens if sink.usage_tokens is not None else sink.chunks
    record.output_tokens = tokens
    # A non-streamed answer arrives in one body: its "first token" is its last, so e2el - ttft is 0 by construction,
    # not a measured 0 ms per token. TPOT is undefined there (None, shown "n/a"), not 0.
    if sink.stream and record.ttft_ms is not None and record.e2el_ms is not None and tokens > 1:
        record.tpot_ms = (record.e2el_ms - record.ttft_ms) / (tokens - 1)
